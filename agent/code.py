"""Synced code on this host: file contents stored by SHA-256, trees made from them.

Layout under the state dir::

    code/objects/ab/abcdef...     one file's content, named by its SHA-256 (read-only)
    code/trees/<tree>/...         a tree made from a manifest (what a job's workdir points at)
    code/manifests/<tree>.json    the manifest it was made from

The controller asks ``have`` (is the tree here; which contents are missing), sends only the
missing contents, then ``commit`` makes the tree (in a temporary directory, renamed into place,
so a tree either exists whole or not at all). The missing contents come as packs
(``code/incoming/<name>.pack``, written by the controller over SFTP on the same SSH connection,
then taken in by ``unpack``: binary, no JSON or base64 on either side), or in ``put`` messages on
the agent's stream where SFTP is not there (a host reached with a key whose forced command is
the attach). Either way each content is checked against its hash before it is kept. Stdlib
only, Python 3.9+.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import struct
import time
import zlib
from typing import Any, Dict, List, Optional

KEEP_TREES = 8  # the newest trees are kept; older ones (and contents only they use) go
KEEP_AGE_S = 7 * 86400  # ... once unused this long, so a long job's tree stays
MAX_BLOB_BYTES = 1 << 30

_SHA_RE = re.compile(r"[0-9a-f]{64}\Z")

# A pack: PACK_MAGIC, then records: the content's SHA-256 (64 hex bytes), b"r" (raw) or b"z"
# (zlib), the payload's length (8 bytes, big-endian), the payload.
PACK_MAGIC = b"rigdeck-pack-1\n"
_RECORD = struct.Struct(">64scQ")
_PACK_NAME_RE = re.compile(r"[0-9a-f]{32}\.pack\Z")
PACK_STALE_S = 3600  # a pack left by a sync that broke off goes after this long
_CHUNK = 1 << 20


class CodeError(ValueError):
    pass


def _root(state_dir: str) -> str:
    return os.path.join(state_dir, "code")


def object_path(state_dir: str, sha: str) -> str:
    return os.path.join(_root(state_dir), "objects", sha[:2], sha)


def tree_path(state_dir: str, tree: str) -> str:
    return os.path.join(_root(state_dir), "trees", tree)


def _sha(value: Any, what: str = "sha256") -> str:
    if not isinstance(value, str) or not _SHA_RE.match(value):
        raise CodeError("%s must be a SHA-256 in lower-case hex" % what)
    return value


def _rel_path(value: Any) -> str:
    if not isinstance(value, str) or not value or value.startswith("/") or "\0" in value \
            or "\n" in value or "\\" in value or os.path.normpath(value) != value \
            or value == "." or value.split("/")[0] == "..":
        raise CodeError("manifest path %r is not a relative path inside the tree" % (value,))
    return value


def _entries(rows: Any) -> List[List[Any]]:
    if not isinstance(rows, list):
        raise CodeError("'files' must be a list of [path, sha256, size, executable]")
    out = []
    for row in rows:
        if not isinstance(row, list) or len(row) != 4 or isinstance(row[2], bool) \
                or not isinstance(row[2], int) or row[2] < 0 or not isinstance(row[3], bool):
            raise CodeError("each file must be [path, sha256, size, executable]")
        out.append([_rel_path(row[0]), _sha(row[1]), row[2], row[3]])
    out.sort(key=lambda r: str(r[0]))
    return out


def tree_hash(rows: List[List[Any]]) -> str:
    """The same name the controller computes (tui/model/codesync.py): SHA-256 of the sorted
    lines ``<sha256> <x|-> <size> <path>``."""
    h = hashlib.sha256(b"rigdeck-tree-1\n")
    for path, sha, size, exe in sorted(rows, key=lambda r: r[0]):
        h.update(("%s %s %d %s\n" % (sha, "x" if exe else "-", size, path)).encode("utf-8"))
    return h.hexdigest()


def have(state_dir: str, tree: Any, blobs: Any) -> Dict[str, Any]:
    """Whether ``tree`` is here (then its path, and it counts as used now) and, if not, which of
    ``blobs`` (content hashes) are missing."""
    tree = _sha(tree, "tree")
    path = tree_path(state_dir, tree)
    if os.path.isdir(path):
        _touch(path)
        return {"path": path, "missing": []}
    if not isinstance(blobs, list):
        raise CodeError("'blobs' must be a list of SHA-256 hashes, or of [SHA-256, size]")
    missing = []
    for item in blobs:
        if isinstance(item, list) and len(item) == 2 and isinstance(item[1], int):
            sha, size = _sha(item[0]), item[1]  # a stored content of another size was changed here
        else:
            sha, size = _sha(item), None
        try:
            st = os.stat(object_path(state_dir, sha))
        except OSError:
            missing.append(sha)
            continue
        if size is not None and st.st_size != size:
            missing.append(sha)
    return {"path": None, "missing": missing, "incoming": _incoming(state_dir) if missing else None}


def _incoming(state_dir: str) -> str:
    """Where packs are written (made 0700 here), after removing packs left there long ago."""
    path = os.path.join(_root(state_dir), "incoming")
    os.makedirs(path, mode=0o700, exist_ok=True)
    now = time.time()
    for name in os.listdir(path):
        full = os.path.join(path, name)
        try:
            if now - os.path.getmtime(full) > PACK_STALE_S:
                os.unlink(full)
        except OSError:
            pass
    return path


def pack_record(sha: str, enc: str, payload: bytes) -> bytes:
    """One content's record in a pack (its header, then ``payload``): ``enc`` is ``raw`` or
    ``zlib``. The controller writes packs with this, so the format has one owner."""
    return _RECORD.pack(_sha(sha).encode("ascii"), b"z" if enc == "zlib" else b"r", len(payload)) + payload


def unpack(state_dir: str, name: Any) -> Dict[str, Any]:
    """Take in the pack ``code/incoming/<name>`` (see PACK_MAGIC): each content is kept only
    when its bytes hash to its name (a wrong one is refused, and nothing of it is kept; the
    contents before it in the pack are kept). The pack is removed whatever happens."""
    if not isinstance(name, str) or not _PACK_NAME_RE.match(name):
        raise CodeError("'pack' must be the name of a pack in code/incoming (32 hex digits, then .pack)")
    path = os.path.join(_root(state_dir), "incoming", name)
    stored = 0
    raw_bytes = 0
    made = set()  # type: set
    try:
        with open(path, "rb") as f:
            if f.read(len(PACK_MAGIC)) != PACK_MAGIC:
                raise CodeError("pack %s is not a rigdeck pack" % name)
            while True:
                head = f.read(_RECORD.size)
                if not head:
                    break
                if len(head) != _RECORD.size:
                    raise CodeError("pack %s ends inside a record header" % name)
                sha_b, enc, length = _RECORD.unpack(head)
                sha = _sha(sha_b.decode("ascii", "replace"))
                if enc not in (b"r", b"z"):
                    raise CodeError("pack %s: content %s has encoding %r, not r or z" % (name, sha[:12], enc))
                raw_bytes += _unpack_record(state_dir, f, sha, enc == b"z", length, name, made)
                stored += 1
    except FileNotFoundError:
        raise CodeError("no pack %s in code/incoming" % name) from None
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    return {"stored": stored, "bytes": raw_bytes}


def _create_part(part: str) -> int:
    """A new file ``part``, read-only from the start (its open descriptor still writes), so it
    needs no chmod once whole; one left by a sync that broke off is replaced."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    try:
        return os.open(part, flags, 0o444)
    except FileExistsError:
        os.unlink(part)
        return os.open(part, flags, 0o444)


def _unpack_record(state_dir: str, f: Any, sha: str, zipped: bool, length: int, name: str,
                   made: Optional[set] = None) -> int:
    """Copy one record's content (``length`` payload bytes at ``f``) to the store, hashing it
    on the way; returns its size. ``made``: store directories known to exist (a pack's
    contents share 256 of them)."""
    dest = object_path(state_dir, sha)
    parent = os.path.dirname(dest)
    if made is None or parent not in made:
        if not os.path.isdir(parent):
            os.makedirs(parent, mode=0o700, exist_ok=True)
        if made is not None:
            made.add(parent)
    part = dest + ".part"
    h = hashlib.sha256()
    d = zlib.decompressobj() if zipped else None
    size = 0
    try:
        with os.fdopen(_create_part(part), "wb") as out:
            left = length
            while left:
                chunk = f.read(min(left, _CHUNK))
                if not chunk:
                    raise CodeError("pack %s ends inside content %s" % (name, sha[:12]))
                left -= len(chunk)
                if d is not None:
                    try:
                        chunk = d.decompress(chunk, MAX_BLOB_BYTES + 1 - size)
                    except zlib.error as e:
                        raise CodeError("content %s does not decompress: %s" % (sha[:12], e)) from None
                    if d.unconsumed_tail:
                        raise CodeError("content %s is larger than %d bytes" % (sha[:12], MAX_BLOB_BYTES))
                size += len(chunk)
                h.update(chunk)
                out.write(chunk)
            if d is not None and not d.eof:
                raise CodeError("content %s: its compressed stream is cut short" % sha[:12])
        if h.hexdigest() != sha:
            raise CodeError("content %s: its bytes do not match its hash" % sha[:12])
        os.replace(part, dest)
    except BaseException:
        try:
            os.unlink(part)
        except OSError:
            pass
        raise
    return size


def put(state_dir: str, blobs: Any) -> Dict[str, Any]:
    """Keep contents sent as ``[sha256, "raw"|"zlib", base64, offset, last]``: a content in one
    piece is ``offset`` 0 and ``last`` true; a large one comes in parts, in order, each appended
    at its offset. A content is kept only when its bytes hash to its name (a wrong one is
    refused, and nothing of it is kept)."""
    if not isinstance(blobs, list):
        raise CodeError("'blobs' must be a list of [sha256, encoding, base64, offset, last]")
    stored = 0
    raw_bytes = 0
    for item in blobs:
        if not isinstance(item, list) or len(item) != 5 or item[1] not in ("raw", "zlib") \
                or not isinstance(item[2], str) or isinstance(item[3], bool) or not isinstance(item[3], int) \
                or item[3] < 0 or not isinstance(item[4], bool):
            raise CodeError("each blob must be [sha256, \"raw\" or \"zlib\", base64, offset, last]")
        sha, enc, text, offset, last = _sha(item[0]), item[1], item[2], item[3], item[4]
        try:
            data = base64.b64decode(text.encode("ascii"), validate=True)
            if enc == "zlib":
                d = zlib.decompressobj()
                data = d.decompress(data, MAX_BLOB_BYTES)
                if d.unconsumed_tail:
                    raise CodeError("blob %s is larger than %d bytes" % (sha[:12], MAX_BLOB_BYTES))
        except (ValueError, zlib.error) as e:
            raise CodeError("blob %s does not decode: %s" % (sha[:12], e)) from None
        raw_bytes += len(data)
        dest = object_path(state_dir, sha)
        parent = os.path.dirname(dest)
        if not os.path.isdir(parent):
            os.makedirs(parent, mode=0o700, exist_ok=True)
        part = dest + ".part"
        if offset == 0:
            try:
                os.unlink(part)  # left by a sync that broke off
            except FileNotFoundError:
                pass
            if last and hashlib.sha256(data).hexdigest() != sha:
                raise CodeError("blob %s: its content does not match its hash" % sha[:12])
            if last:
                with os.fdopen(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o444), "wb") as f:
                    f.write(data)
                os.replace(part, dest)
                stored += 1
                continue
            with open(part, "wb") as f:
                f.write(data)
        else:
            try:
                have_bytes = os.path.getsize(part)
            except OSError:
                have_bytes = -1
            if have_bytes != offset:
                raise CodeError("blob %s: part at offset %d, but %d bytes are here"
                                % (sha[:12], offset, max(have_bytes, 0)))
            with open(part, "ab") as f:
                f.write(data)
        if last:
            if offset:
                h = hashlib.sha256()
                with open(part, "rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        h.update(chunk)
                if h.hexdigest() != sha:
                    os.unlink(part)
                    raise CodeError("blob %s: its content does not match its hash" % sha[:12])
            os.chmod(part, 0o444)
            os.replace(part, dest)
            stored += 1
    return {"stored": stored, "bytes": raw_bytes}


def commit(state_dir: str, tree: Any, files: Any) -> Dict[str, Any]:
    """Make ``tree`` from its manifest: each file a hard link to its stored content, read-only
    (0444; an executable gets a copy of its own, 0555). The directories are writable: a job may
    write new files into its workdir, not change the code others share."""
    tree = _sha(tree, "tree")
    rows = _entries(files)
    if tree_hash(rows) != tree:
        raise CodeError("the manifest does not hash to tree %s" % tree[:12])
    path = tree_path(state_dir, tree)
    if os.path.isdir(path):
        _touch(path)
        return {"path": path, "made": False}
    missing = sorted({r[1] for r in rows if not os.path.isfile(object_path(state_dir, r[1]))})
    if missing:
        raise CodeError("%d contents of tree %s are not here (first %s): send them first"
                        % (len(missing), tree[:12], missing[0][:12]))
    trees = os.path.dirname(path)
    os.makedirs(trees, mode=0o700, exist_ok=True)
    tmp = "%s.tmp%d" % (path, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp, mode=0o755)
    made = {tmp}
    try:
        for rel, sha, _size, exe in rows:
            dest = os.path.join(tmp, rel)
            parent = os.path.dirname(dest)
            if parent not in made:
                os.makedirs(parent, mode=0o755, exist_ok=True)
                made.add(parent)
            if exe:  # its own copy: the stored content keeps its mode
                shutil.copyfile(object_path(state_dir, sha), dest)
                os.chmod(dest, 0o555)
            else:  # the stored content itself (read-only), not a copy: a tree costs no space
                try:
                    os.link(object_path(state_dir, sha), dest)
                except OSError:
                    shutil.copyfile(object_path(state_dir, sha), dest)
                    os.chmod(dest, 0o444)
        manifests = os.path.join(_root(state_dir), "manifests")
        os.makedirs(manifests, mode=0o700, exist_ok=True)
        with open(os.path.join(manifests, tree + ".json"), "w") as f:
            json.dump(rows, f)
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(state_dir, keep=(tree,))
    return {"path": path, "made": True}


def _touch(path: str) -> None:
    try:
        os.utime(path, None)
    except OSError:
        pass


def prune(state_dir: str, keep: tuple = (), now: Optional[float] = None) -> Dict[str, int]:
    """Remove trees beyond the newest KEEP_TREES that were last used over KEEP_AGE_S ago, and
    the stored contents that no remaining tree uses."""
    now = time.time() if now is None else now
    trees_dir = os.path.join(_root(state_dir), "trees")
    manifests = os.path.join(_root(state_dir), "manifests")
    try:
        names = [n for n in os.listdir(trees_dir) if _SHA_RE.match(n)]
    except OSError:
        return {"trees": 0, "objects": 0}
    aged = sorted(((os.path.getmtime(os.path.join(trees_dir, n)), n) for n in names), reverse=True)
    gone = [n for i, (mtime, n) in enumerate(aged)
            if i >= KEEP_TREES and n not in keep and now - mtime > KEEP_AGE_S]
    for n in gone:
        shutil.rmtree(os.path.join(trees_dir, n), ignore_errors=True)
        try:
            os.unlink(os.path.join(manifests, n + ".json"))
        except OSError:
            pass
    removed = 0
    if gone:
        used = set()  # type: set
        for n in names:
            if n in gone:
                continue
            try:
                with open(os.path.join(manifests, n + ".json")) as f:
                    used.update(r[1] for r in json.load(f))
            except (OSError, ValueError):
                return {"trees": len(gone), "objects": 0}  # unsure what is used: keep every content
        objects = os.path.join(_root(state_dir), "objects")
        for sub in os.listdir(objects):
            for sha in os.listdir(os.path.join(objects, sub)):
                if _SHA_RE.match(sha) and sha not in used:
                    os.unlink(os.path.join(objects, sub, sha))
                    removed += 1
    return {"trees": len(gone), "objects": removed}
