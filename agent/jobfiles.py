"""Files a job writes on a host, written so that a full disk is a cause, not a crash.

- ``write_json``: atomic (temp file + rename), padded to whole pages, and when the disk is full
  (ENOSPC, EDQUOT) rewritten in place over the same pages, or over a reserve file made earlier,
  so the job's state and each rank's exit record still get out.
- ``CappedLog``: a rank's output, written by its wrapper, capped per rank with rotation. The
  current segment is ``rank-R.log``, the previous one ``rank-R.log.1``; ``rank-R.log.seg`` names
  each segment's first *logical* offset (bytes the rank ever wrote before it), so readers keep
  byte offsets across rotations and learn how much was dropped. A line longer than the cap
  allows is cut once, with a marker, and never split into new lines.
- ``read_log``: the reader's side, by logical offset.

Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import List, Optional, Tuple

PAGE = 4096
RESOURCE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
DEFAULT_LOG_CAP = 256 << 20  # bytes kept per rank (both segments together)
MIN_LOG_CAP = 1 << 20


def free_mb(path: str) -> Optional[float]:
    p = path
    while p and not os.path.exists(p):
        p = os.path.dirname(p)
    try:
        import shutil  # (not in a rank wrapper's start: only a full disk's check needs it)

        return shutil.disk_usage(p or "/").free / 1e6
    except OSError:
        return None


def resource_message(err: OSError, path: str) -> str:
    """'no space left on gpu2:/data/ckpt, 0.0 MB free' and the like."""
    what = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded",
            errno.EROFS: "read-only file system"}.get(err.errno or 0, os.strerror(err.errno or 0))
    mb = free_mb(path)
    where = "%s:%s" % (os.uname().nodename, path)
    return "%s on %s%s" % (what, where, ", %.1f MB free" % mb if mb is not None else "")


def is_resource_error(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in RESOURCE_ERRNOS


def _padded(obj: object) -> bytes:
    data = json.dumps(obj).encode()
    return data + b" " * (-(len(data) + 1) % PAGE) + b"\n"


def _overwrite(path: str, data: bytes) -> bool:
    """Write ``data`` over an existing file's first bytes, padding the rest with spaces (valid
    JSON whitespace): no new blocks needed. False when the file is missing or too small."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        if size < len(data):
            return False
        os.pwrite(fd, data[:-1] + b" " * (size - len(data)) + b"\n", 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def read_json(path: str) -> Optional[dict]:
    """The JSON object in ``path``; None when it is missing, unreadable or not an object."""
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_json(path: str, obj: object) -> None:
    """Atomically replace ``path`` with ``obj`` as JSON. On a full disk, rewrite in place (the
    file, or ``path + '.reserve'``, renamed into place) instead; raises the OSError if neither
    can hold it. Never leaves a temp file behind."""
    data = _padded(obj)
    tmp = "%s.tmp-%d" % (path, os.getpid())
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        if _overwrite(path, data):
            return
        reserve = path + ".reserve"
        if _overwrite(reserve, data):
            os.replace(reserve, path)
            return
        raise


def reserve(path: str, size: int = PAGE) -> None:
    """Set aside ``size`` bytes for a later ``write_json(path)`` on a full disk."""
    try:
        with open(path + ".reserve", "wb") as f:
            f.write(b" " * (size - 1) + b"\n")
    except OSError:
        pass


def tail_lines(data: bytes, lines: int, chars: int = 400) -> List[str]:
    return [ln[:chars] for ln in data.decode("utf-8", "replace").splitlines()[-lines:]]


def read_tail(path: str, max_bytes: int) -> Optional[bytes]:
    """A file's last ``max_bytes`` (None when it cannot be read): status reads tails, never
    whole files."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read()
    except OSError:
        return None


def tail(path: str, lines: int = 20, max_bytes: int = 16384) -> List[str]:
    data = read_tail(path, max_bytes)
    return tail_lines(data, lines) if data is not None else []


# -- capped, rotated rank logs ------------------------------------------------------------------


def _seg_path(path: str) -> str:
    return path + ".seg"


def read_segments(path: str) -> Tuple[int, Optional[int]]:
    """(logical offset where ``path`` begins, logical offset where ``path.1`` begins or None)."""
    try:
        with open(_seg_path(path)) as f:
            seg = json.load(f)
        return int(seg.get("base") or 0), (int(seg["prev_base"]) if seg.get("prev_base") is not None else None)
    except (OSError, ValueError, TypeError, AttributeError):
        return 0, None


def human_bytes(n: int) -> str:
    if n >= 1 << 30:
        return "%.1f GB" % (n / (1 << 30))
    if n >= 1 << 20:
        return "%.1f MB" % (n / (1 << 20))
    if n >= 1 << 10:
        return "%.1f KB" % (n / (1 << 10))
    return "%d bytes" % n


def dropped_marker(n: int) -> bytes:
    return ("[... %s dropped ...]\n" % human_bytes(n)).encode()


class CappedLog:
    """Appends a rank's output to its log, at most ``cap`` bytes on disk, rotating at line ends."""

    def __init__(self, path: str, cap: int = DEFAULT_LOG_CAP):
        self.path = path
        cap = max(MIN_LOG_CAP, int(cap))
        self.seg_size = cap // 2
        self.max_line = self.seg_size // 2
        self.base, self.prev_base = read_segments(path)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self.fd).st_size
        self.line_len = 0  # bytes of the line in progress written so far
        self.cut = 0  # bytes of the line in progress left out
        self.error = None  # type: Optional[OSError]  # the first write that failed (a full disk)
        self.lost = 0  # bytes not written because of it

    def _write(self, data: bytes) -> None:
        if not data:
            return
        if self.error is not None:
            self.lost += len(data)
            return
        try:
            n = os.write(self.fd, data)
            while n < len(data):
                n += os.write(self.fd, data[n:])
        except OSError as e:
            self.error = e
            self.lost += len(data)
            return
        self.size += len(data)

    def _rotate(self) -> None:
        lock = os.open(_seg_path(self.path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # readers map offsets under a shared lock
            os.replace(self.path, self.path + ".1")
            os.close(self.fd)
            self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self.prev_base, self.base = self.base, self.base + self.size
            self.size = 0
            write_json(_seg_path(self.path), {"base": self.base, "prev_base": self.prev_base})
        except OSError as e:
            self.error = self.error or e
        finally:
            os.close(lock)

    def write(self, data: bytes) -> None:
        while data:
            if self.line_len == 0 and self.cut == 0 and self.size >= self.seg_size - self.max_line:
                self._rotate()
            if self.line_len + len(data) <= self.max_line and self.cut == 0:
                nl = data.find(b"\n")
                if nl >= 0 and self.size >= self.seg_size - self.max_line:
                    piece, data = data[: nl + 1], data[nl + 1:]  # rotate at this line's end
                else:
                    piece, data = data, b""
                self._write(piece)
                last = piece.rfind(b"\n")
                self.line_len = len(piece) - last - 1 if last >= 0 else self.line_len + len(piece)
                continue
            # The line in progress is, or may become, longer than a line may be: cut it once.
            nl = data.find(b"\n")
            piece = data[: nl + 1] if nl >= 0 else data
            data = data[len(piece):]
            body = piece[:-1] if nl >= 0 else piece
            room = max(0, self.max_line - self.line_len)
            if room:
                self._write(body[:room])
                self.line_len += min(room, len(body))
            self.cut += max(0, len(body) - room)
            if nl >= 0:
                if self.cut:
                    self._write(("[... %s of this line cut ...]" % human_bytes(self.cut)).encode())
                self._write(b"\n")
                self.line_len = self.cut = 0

    def close(self) -> None:
        if self.cut:  # an unterminated, cut last line still says so
            self._write(("[... %s of this line cut ...]\n" % human_bytes(self.cut)).encode())
            self.cut = 0
        try:
            os.close(self.fd)
        except OSError:
            pass


def _read_complete(path: str, offset: int, max_bytes: int, final: bool) -> Tuple[bytes, int, bool]:
    """Complete lines of ``path`` from (file) ``offset``: (data, bytes consumed, more waiting).
    A line longer than ``max_bytes`` comes in pieces; with ``final`` an unterminated last line too."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, offset))
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        return b"", 0, False
    more = len(data) > max_bytes
    data = data[:max_bytes]
    if more or not final:
        cut = data.rfind(b"\n")
        if cut >= 0:
            data = data[: cut + 1]
        elif more:
            data = data[: utf8_boundary(data)]
        else:
            return b"", 0, more
    return data, len(data), more


def utf8_boundary(data: bytes) -> int:
    """The longest prefix of ``data`` that does not end inside a UTF-8 character (never 0)."""
    j = len(data) - 1
    while j > 0 and len(data) - j < 4 and data[j] & 0xC0 == 0x80:
        j -= 1
    lead = data[j]
    need = 1 if lead < 0x80 else 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return len(data) if j + need <= len(data) or j == 0 else j


def read_log(path: str, offset: int, max_bytes: int, final: bool = False) -> Tuple[bytes, int, bool]:
    """Bytes of a capped log from logical ``offset``: (data, next offset, more waiting). Bytes
    dropped by rotation come back as one ``[... N MB dropped ...]`` line."""
    lock = None  # type: Optional[int]
    try:
        lock = os.open(_seg_path(path) + ".lock", os.O_RDONLY)
        fcntl.flock(lock, fcntl.LOCK_SH)
    except OSError:
        pass  # never rotated
    try:
        base, prev = read_segments(path)
        start = prev if prev is not None else base
        offset = max(0, int(offset))
        if offset < start:
            return dropped_marker(start - offset), start, True
        if offset < base:  # in the previous segment, which ends at a line end
            data, used, more = _read_complete(path + ".1", offset - start, max_bytes, True)
            if used == 0:  # it is gone (rotated again meanwhile): skip to what is there
                return b"", base, True
            return data, offset + used, True  # the current segment follows
        data, used, more = _read_complete(path, offset - base, max_bytes, final)
        return data, offset + used, more
    finally:
        if lock is not None:
            os.close(lock)


def log_size(path: str) -> int:
    """Logical size of a capped log (every byte the rank wrote, dropped ones included)."""
    base, _ = read_segments(path)
    try:
        return base + os.path.getsize(path)
    except OSError:
        return base


# ---------------------------------------------------------------------------------------------
# A job's ``env_from_file`` values on a host.

ENV_FILE = "env_file.json"  # in the job's directory: {"values": {NAME: value}}, 0600
_ENV_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


class EnvFileMissing(ValueError):
    """A start that names ``env_from_file`` values this host does not hold."""


def _env_names(given: object) -> List[str]:
    if not isinstance(given, list) or not all(
            isinstance(n, str) and n and n[0] not in "0123456789" and set(n) <= _ENV_NAME_CHARS
            and not n.startswith("RIGDECK_") for n in given):
        raise ValueError("plan field env_file.names: expected a list of environment variable names")
    return list(given)


def keep_env_file(job_dir: str, plan: dict) -> None:
    """The plan's ``env_file`` (``{"names": [...], "values": {...}}``, the values of the job's
    ``env_from_file``) kept in the job's directory only, in a 0600 file, and the plan left with
    the names alone (``plan.json`` never holds a value). A start that brings no values (a
    restart through a server, which keeps none) uses the ones kept here by an earlier start:
    EnvFileMissing when there are none, naming the names (never a value)."""
    given = plan.pop("env_file", None)
    if given is None:
        return
    if not isinstance(given, dict):
        raise ValueError("plan field env_file: expected {names, values}")
    names = _env_names(given.get("names"))
    values = given.get("values")
    path = os.path.join(job_dir, ENV_FILE)
    if values is not None:
        if not isinstance(values, dict) or sorted(values) != sorted(names) or not all(
                isinstance(v, str) and "\0" not in v for v in values.values()):
            raise ValueError("plan field env_file.values: expected a string without NUL for each of %s"
                             % ", ".join(names))
        from agent.filemodes import write_private

        tmp = "%s.tmp-%d" % (path, os.getpid())
        write_private(tmp, json.dumps({"values": values}).encode("utf-8"))
        os.replace(tmp, path)
    else:
        held = read_env_file(job_dir)
        lacking = [n for n in names if n not in held]
        if lacking:
            raise EnvFileMissing(
                "the values of its env_from_file (%s) are not on this host: they reach a host with the "
                "job's first start there, and a server keeps them nowhere; launch the job again"
                % ", ".join(lacking))
    plan["env_file"] = {"names": names}


def read_env_file(job_dir: str) -> dict:
    """The ``env_from_file`` values kept in the job's directory ({} when none)."""
    try:
        with open(os.path.join(job_dir, ENV_FILE), "rb") as f:
            data = json.loads(f.read().decode("utf-8"))
    except (OSError, ValueError):
        return {}
    values = data.get("values") if isinstance(data, dict) else None
    return {str(k): str(v) for k, v in values.items()} if isinstance(values, dict) else {}
