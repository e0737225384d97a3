"""A finished job's artifacts on this host, as trees of the code store (agent/code.py).

``pack`` turns one of a job's SageMaker dirs (``output``: ``sagemaker/output/data``, ``model``:
``sagemaker/model``, ``checkpoints``: the job's checkpoint dir) into a tree: each regular file's
content is kept in ``code/objects`` by its SHA-256 (a hard link when the file is in the job's
directory: no space taken, and the file is made read-only, the job having ended; a copy when it
is elsewhere, so a user's own files are never changed), then the tree is made as synced code is.
The controller moves contents to other hosts with ``get`` (a piece of a stored content) and
``code_put``; each is checked against its hash where it lands.

``seed_checkpoint`` copies a tree into a job's checkpoint dir before its first attempt (a
pipeline's ``continue_from``). Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import base64
import errno
import hashlib
import json
import os
import shutil
import stat
from typing import Any, Dict, List

from agent import code

KINDS = ("output", "model", "checkpoints")
MAX_GET_BYTES = 512 << 10  # base64 of a piece stays well under the protocol's 1 MiB line
_READ = 1 << 20


class ArtifactError(code.CodeError):
    pass


def kind_dir(job_dir: str, plan: Dict[str, Any], kind: str) -> str:
    """The directory that holds ``kind`` of the job at ``job_dir`` (its plan decides where the
    checkpoint dir is, as agent/clusterfiles.py does)."""
    base = os.path.join(job_dir, "sagemaker")
    if kind == "output":
        return os.path.join(base, "output", "data")
    if kind == "model":
        return os.path.join(base, "model")
    if kind == "checkpoints":
        from agent.clusterfiles import checkpoint_dir

        return checkpoint_dir(plan) or os.path.join(base, "checkpoints")
    raise ArtifactError("'kind' must be one of %s, not %r" % (", ".join(KINDS), kind))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _files(root: str) -> List[str]:
    """Relative paths of the regular files under ``root`` (symlinks and other kinds skipped,
    never followed)."""
    out = []  # type: List[str]
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        rel_dir = os.path.relpath(dirpath, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(os.path.join(dirpath, d)))
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                out.append(rel_dir + name)
    return sorted(out)


def _cache_path(state_dir: str, job_id: str, kind: str) -> str:
    return os.path.join(state_dir, "code", "packs", "%s.%s.json" % (job_id, kind))


def _load_cache(path: str) -> Dict[str, List[Any]]:
    try:
        with open(path) as f:
            data = json.load(f)
        return {k: v for k, v in data.items() if isinstance(v, list) and len(v) == 5}
    except (OSError, ValueError, AttributeError):
        return {}


def _store_linked(state_dir: str, full: str) -> str:
    """Keep ``full`` (a file of the job's own dir) in the store as a hard link; returns its hash.
    The link is taken first and what is hashed is the linked inode, so the name is true."""
    objects = os.path.join(state_dir, "code", "objects")
    os.makedirs(objects, mode=0o700, exist_ok=True)
    tmp = os.path.join(objects, ".pack%d" % os.getpid())
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    try:
        os.link(full, tmp)
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise
        return _store_copied(state_dir, full)
    try:
        # the job has ended: its outputs are read-only from now on (an executable stays one)
        os.chmod(tmp, stat.S_IMODE(os.stat(tmp).st_mode) & ~0o7222)
        sha = _hash_file(tmp)
        _place(state_dir, tmp, sha)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    return sha


def _store_copied(state_dir: str, full: str) -> str:
    """Keep a copy of ``full`` in the store (read once: hashed while copied)."""
    objects = os.path.join(state_dir, "code", "objects")
    os.makedirs(objects, mode=0o700, exist_ok=True)
    tmp = os.path.join(objects, ".copy%d" % os.getpid())
    h = hashlib.sha256()
    try:
        with open(full, "rb") as src, \
                os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o444), "wb") as dst:
            for chunk in iter(lambda: src.read(_READ), b""):
                h.update(chunk)
                dst.write(chunk)
        sha = h.hexdigest()
        _place(state_dir, tmp, sha)
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
    return sha


def _place(state_dir: str, tmp: str, sha: str) -> None:
    """Give ``tmp`` its content's name in the store, unless that content is there already."""
    dest = code.object_path(state_dir, sha)
    if os.path.isfile(dest):
        return
    os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
    os.link(tmp, dest)


def _hash_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_READ), b""):
            h.update(chunk)
    return h.hexdigest()


def pack(state_dir: str, job_dir: str, job_id: str, plan: Dict[str, Any], kind: Any) -> Dict[str, Any]:
    """Make a tree of ``kind`` of the (ended) job at ``job_dir``: ``{tree, files, bytes, path}``.
    A file whose size, mtime, inode and device are as at the last pack is not read again."""
    if kind not in KINDS:
        raise ArtifactError("'kind' must be one of %s, not %r" % (", ".join(KINDS), kind))
    root = kind_dir(job_dir, plan, kind)
    real_job = os.path.realpath(job_dir)
    if os.path.isdir(root):
        root = os.path.realpath(root)  # the checkpoint dir may be a link to the plan's checkpoint.dir
        names = _files(root)
    else:
        names = []  # a dir the job never made holds nothing
    cache_file = _cache_path(state_dir, job_id, kind)
    cache = _load_cache(cache_file)
    seen = {}  # type: Dict[str, List[Any]]
    rows = []  # type: List[List[Any]]
    total = 0
    for rel in names:
        full = os.path.join(root, rel)
        try:
            st = os.lstat(full)
        except OSError:
            continue  # gone since the walk
        if not stat.S_ISREG(st.st_mode):
            continue
        stamp = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]
        exe = bool(st.st_mode & 0o111)
        hit = cache.get(rel)
        sha = ""
        if hit is not None and hit[:4] == stamp:
            try:
                if os.stat(code.object_path(state_dir, hit[4])).st_size == st.st_size:
                    sha = hit[4]
            except OSError:
                pass
        if not sha:
            if _inside(full, real_job) and st.st_nlink == 1:
                # the job's own file (one linked elsewhere too may be a user's: copied instead)
                sha = _store_linked(state_dir, full)
            else:
                sha = _store_copied(state_dir, full)
            try:
                st = os.lstat(full)
                stamp = [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]
            except OSError:
                pass
        size = os.path.getsize(code.object_path(state_dir, sha))
        seen[rel] = stamp + [sha] if stamp[0] == size else []
        rows.append([rel, sha, size, exe])
        total += size
    tree = code.tree_hash(rows)
    made = code.commit(state_dir, tree, rows)
    try:
        os.makedirs(os.path.dirname(cache_file), mode=0o700, exist_ok=True)
        tmp = cache_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump({k: v for k, v in seen.items() if v}, f)
        os.replace(tmp, cache_file)
    except OSError:
        pass  # only a cache
    return {"tree": tree, "files": rows, "bytes": total, "path": made["path"]}


def get(state_dir: str, sha: Any, offset: Any, size: Any) -> Dict[str, Any]:
    """A piece of a stored content: ``{data: base64, size: its whole size, eof}``; at most
    MAX_GET_BYTES per piece (a larger ``size`` gets that much)."""
    sha = code._sha(sha)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise code.CodeError("'offset' must be an integer >= 0")
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise code.CodeError("'size' must be an integer > 0")
    path = code.object_path(state_dir, sha)
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        raise code.CodeError("content %s is not stored here" % sha[:12]) from None
    with f:
        total = os.fstat(f.fileno()).st_size
        if offset > total:
            raise code.CodeError("offset %d is past the end of content %s (%d bytes)" % (offset, sha[:12], total))
        f.seek(offset)
        data = f.read(min(size, MAX_GET_BYTES))
    return {"data": base64.b64encode(data).decode("ascii"), "size": total, "eof": offset + len(data) >= total}


def seed_checkpoint(src: str, dest: str) -> int:
    """Copy the files of tree ``src`` into the checkpoint dir ``dest`` (writable copies of their
    own), leaving every file already there as it is; returns how many were copied. Safe when
    several nodes share ``dest``: a file is linked into place only where none is."""
    if not os.path.isdir(src):
        raise ArtifactError("seed_checkpoint %s is not a directory on this host" % src)
    os.makedirs(dest, exist_ok=True)
    copied = 0
    for rel in _files(src):
        target = os.path.join(dest, rel)
        if os.path.lexists(target):
            continue
        parent = os.path.dirname(target)
        os.makedirs(parent, exist_ok=True)
        tmp = os.path.join(parent, ".seed.%d.%s" % (os.getpid(), os.path.basename(rel)))
        shutil.copyfile(os.path.join(src, rel), tmp)
        mode = 0o755 if os.stat(os.path.join(src, rel)).st_mode & 0o111 else 0o644
        os.chmod(tmp, mode)
        try:
            os.link(tmp, target)  # never over a file that is there
            copied += 1
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    return copied
