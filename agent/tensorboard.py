"""A job's TensorBoard files on this host, listed and read for ``rigdeck tensorboard``.

Where they are is what the job itself was told: ``AIP_TENSORBOARD_LOG_DIR`` in the environment
``agent.clusterfiles.node_env`` wrote for each of the job's nodes here (``node_env.json`` in the
job's directory, and in each replica's of a pool job). By default that is ``<job_dir>/tensorboard``;
a spec's ``[env]`` may name another absolute directory. Nothing here takes a directory from the
request: a ``dir`` it names must be one of these.

Only what TensorBoard reads is listed: event files (``*.tfevents.*``) and files under a
``plugins/`` directory. Reading is confined to a job's directory: a path is taken apart into
names, each opened with ``O_NOFOLLOW`` from its parent's descriptor, so neither ``..`` nor a
symbolic link leads out of it, and only a regular file is read. Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import base64
import glob
import os
import stat
from typing import Any, Dict, List, Optional, Tuple

from agent.clusterfiles import load_node_env
from agent.kinds.pools import REPLICAS_DIR

ENV_VAR = "AIP_TENSORBOARD_LOG_DIR"
MAX_READ = 512 << 10  # base64 of a piece stays well under the protocol's 1 MiB line
MAX_FILES = 2000  # a listing's files per directory (the answer is one message)
MAX_VISITS = 20000  # entries looked at per directory: a directory such as / is not walked whole
MAX_DEPTH = 8
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class TensorboardError(Exception):
    """A request this host cannot answer; the message says why."""


def job_dirs(job_dir: str) -> Tuple[List[str], List[str]]:
    """(the job's TensorBoard directories here, sorted; what was wrong with others): each node's
    ``AIP_TENSORBOARD_LOG_DIR`` here. A value that is no absolute path is named in the second
    list (a rank's working directory decides where a relative one is: not read)."""
    envs = [load_node_env(job_dir)]
    for path in sorted(glob.glob(os.path.join(glob.escape(job_dir), REPLICAS_DIR, "*"))):
        envs.append(load_node_env(path))
    dirs, problems = set(), []  # type: Any, List[str]
    for env in envs:
        value = (env or {}).get(ENV_VAR)
        if not value:
            continue
        if not os.path.isabs(value) or "\0" in value:
            problems.append("%s=%r is not an absolute path: not read" % (ENV_VAR, value))
            continue
        dirs.add(os.path.normpath(value))
    return sorted(dirs), sorted(set(problems))


def wanted(rel: str) -> bool:
    """Whether TensorBoard reads the file at ``rel`` (a path under its log directory)."""
    parts = rel.split("/")
    return ".tfevents." in parts[-1] or "plugins" in parts[:-1]


def file_id(st: os.stat_result) -> str:
    """The file itself (device and inode): another id at the same path is another file."""
    return "%d:%d" % (st.st_dev, st.st_ino)


def _open_root(root: str) -> int:
    """The directory ``root`` (the job's own setting: a link there is followed, once)."""
    return os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))


def listing(root: str) -> Dict[str, Any]:
    """``{dir, files: [[path, size, mtime_ns, id]], truncated}``: the files TensorBoard reads
    under ``root`` (paths relative to it, ``/``-separated, sorted), symbolic links neither listed
    nor followed. A directory that does not exist (yet) holds nothing."""
    out = {"dir": root, "files": [], "truncated": False}  # type: Dict[str, Any]
    try:
        fd = _open_root(root)
    except FileNotFoundError:
        return out
    except OSError as e:
        raise TensorboardError("cannot open %s: %s" % (root, e.strerror or e)) from None
    budget = [MAX_VISITS]
    try:
        _walk(fd, "", 0, out, budget)
    finally:
        os.close(fd)
    out["files"].sort()
    return out


def _walk(fd: int, prefix: str, depth: int, out: Dict[str, Any], budget: List[int]) -> None:
    try:
        entries = sorted(os.scandir(fd), key=lambda e: e.name)
    except OSError:
        return  # gone or unreadable since it was opened: nothing of it this time
    for entry in entries:
        budget[0] -= 1
        if budget[0] < 0 or len(out["files"]) >= MAX_FILES:
            out["truncated"] = True
            return
        rel = prefix + entry.name
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and wanted(rel):
            out["files"].append([rel, st.st_size, st.st_mtime_ns, file_id(st)])
        elif stat.S_ISDIR(st.st_mode) and depth < MAX_DEPTH:
            try:
                sub = os.open(entry.name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # replaced by a link or removed meanwhile
            try:
                _walk(sub, rel + "/", depth + 1, out, budget)
            finally:
                os.close(sub)


def _parts(rel: Any) -> List[str]:
    if not isinstance(rel, str) or not rel or "\0" in rel or rel.startswith("/"):
        raise TensorboardError("'path' must be a relative path, not %r" % (rel,))
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts) or len(parts) > MAX_DEPTH + 1:
        raise TensorboardError("'path' must name a file under the directory, not %r" % (rel,))
    if not wanted(rel):
        raise TensorboardError("%r is no file TensorBoard reads (an event file, or under plugins/)" % (rel,))
    return parts


def _open_file(root: str, parts: List[str]) -> int:
    """A descriptor of the regular file ``root/parts...``, no link followed below ``root``."""
    fd = _open_root(root)
    try:
        for name in parts[:-1]:
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = sub
        out = os.open(parts[-1], _FILE_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        raise TensorboardError("%s is not a regular file" % "/".join(parts))
    return out


def read(root: str, rel: Any, offset: Any, max_bytes: Optional[int] = None) -> Dict[str, Any]:
    """Bytes of the file ``rel`` under ``root`` from ``offset``: ``{b64, offset, size, mtime_ns,
    id, eof}`` (``size``, ``mtime_ns`` and ``id`` as the file is now; an offset past its end
    reads nothing: it was truncated or replaced). At most MAX_READ bytes."""
    parts = _parts(rel)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise TensorboardError("'offset' must be an integer >= 0")
    size = MAX_READ if max_bytes is None else max(1, min(int(max_bytes), MAX_READ))
    try:
        fd = _open_file(root, parts)
    except FileNotFoundError:
        raise TensorboardError("no file %s under %s" % (rel, root)) from None
    except OSError as e:  # ELOOP: a symbolic link on the way
        raise TensorboardError("cannot read %s under %s: %s" % (rel, root, e.strerror or e)) from None
    try:
        st = os.fstat(fd)
        data = os.pread(fd, size, offset) if offset < st.st_size else b""
    finally:
        os.close(fd)
    return {"b64": base64.b64encode(data).decode("ascii"), "offset": offset, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "id": file_id(st), "eof": offset + len(data) >= st.st_size}


def files(job_dir: str) -> Dict[str, Any]:
    """The ``job_tensorboard_files`` answer: ``{dirs: [listing], problems: [text]}``."""
    dirs, problems = job_dirs(job_dir)
    out = []
    for d in dirs:
        try:
            out.append(listing(d))
        except TensorboardError as e:
            problems.append(str(e))
    return {"dirs": out, "problems": problems}


def read_in_job(job_dir: str, root: Any, rel: Any, offset: Any, max_bytes: Optional[int] = None) -> Dict[str, Any]:
    """The ``job_tensorboard_read`` answer: ``root`` must be one of the job's directories here."""
    dirs, _ = job_dirs(job_dir)
    if root not in dirs:
        raise TensorboardError("%r is not a TensorBoard directory of this job here (%s)"
                               % (root, ", ".join(dirs) or "it has none"))
    return read(root, rel, offset, max_bytes)
