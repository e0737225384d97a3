"""GPU claims held on the host: one lock file per GPU in a directory every user of the host shares.

Whatever controller placed a job, the host is the truth about its GPUs. A job's claim on a GPU is
a *shared* ``flock`` on ``gpu-<index>.lock``, held by every process of the job that could use
the GPU: the job host, the launcher, each rank wrapper and each training process (the locked
descriptors are inherited, and wrappers take their own). The claim therefore lasts exactly as
long as any of them lives: a dead job host with live ranks still holds it, and the kernel frees
it when the last one exits, however it died.

A new claim is made under the directory's mutex (``claims.lock``): a GPU is free when an
*exclusive* test lock on it succeeds. All of a host's GPUs for a job are claimed or none. The
claimant writes who holds the GPU into the lock file (job, user, pid, since), so a refusal can
name the holder and telemetry can show it. Locks are advisory: they keep rigdeck users from
double-booking, not a hostile user from ignoring them.

Every account's agent on a host uses the one directory, so each sees the others' claims. The
directory is trusted (``filemodes.trusted_dir``) when root owns it, or this agent's own account,
or the account named as its owner (``RIGDECK_CLAIM_DIR_OWNER``, from the inventory's
``claim_dir_owner``: the hosts' admin); and nobody else may remove what is in it (sticky). With
an owner named, an agent of another account never makes the directory itself (then it would be
that account's, and refused by everyone else's agent): the owner's agent or root makes it.
A refusal says the command that makes the directory right.

Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import pwd
import time

from agent import filemodes

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Any, Dict, Iterable, List, Optional, Tuple

DEFAULT_DIR = "/dev/shm/rigdeck-gpu-claims"  # host-wide, world-writable and sticky; gone at reboot
MUTEX_WAIT_S = 10.0
HOLDER_BYTES = 1024  # the holder record is padded to this, so a rewrite never needs new space


class ClaimError(Exception):
    """A GPU this start needs is held by another job; ``holder`` says by whom."""

    def __init__(self, message: str, gpu: Optional[int] = None, holder: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.gpu = gpu
        self.holder = holder or {}


OWNER_ENV = "RIGDECK_CLAIM_DIR_OWNER"


def claim_dir() -> str:
    return os.environ.get("RIGDECK_CLAIM_DIR") or DEFAULT_DIR


def claim_dir_owner() -> Optional[Tuple[str, int]]:
    """(name, uid) of the account trusted to own the claim directory beside root and this agent's
    own (``RIGDECK_CLAIM_DIR_OWNER``), or None when none is named. ClaimError when the name is
    no account on this host."""
    name = (os.environ.get(OWNER_ENV) or "").strip()
    if not name:
        return None
    try:
        return name, pwd.getpwnam(name).pw_uid
    except KeyError:
        raise ClaimError("claim_dir_owner %r (the inventory's, in the agent's %s) is no account on %s"
                         % (name, OWNER_ENV, os.uname().nodename)) from None


def _make_it_right(d: str) -> str:
    """The command that makes ``d`` a claim directory every account's agent trusts."""
    return "as root: install -d -m 1777 -o root -g root %s" % d


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def _ensure_dir(d: str) -> str:
    """The claim directory, made world-writable and sticky if new; refused unless trusted. With
    an owner named (``claim_dir_owner``), only that account or root makes it."""
    owner = claim_dir_owner()
    if owner is not None and os.geteuid() not in (0, owner[1]) and not os.path.lexists(d):
        raise ClaimError("GPU claim directory %s does not exist; it is shared by every account, and "
                         "its owner is to be %s (claim_dir_owner) or root: make it %s, or as %s: "
                         "install -d -m 1777 %s (a job of %s's makes it too)"
                         % (d, owner[0], _make_it_right(d), owner[0], d, owner[0]))
    try:
        old = os.umask(0)
        try:
            os.mkdir(d, 0o1777)
        finally:
            os.umask(old)
    except FileExistsError:
        pass
    return _trusted(d)


def _trusted(d: str) -> str:
    """``d`` if the daemon may keep claims there (filemodes: root's, ours or the named owner's,
    and nobody else may remove our locks), else ClaimError saying why: whoever else owns it, or may write to it
    without the sticky bit, could delete a claimed GPU's lock and take the GPU from under a job."""
    owner = claim_dir_owner()
    try:
        filemodes.trusted_dir(d, "GPU claim directory", follow=False,
                              owners=[owner[1]] if owner is not None else [])
    except filemodes.UnsafeDirError as e:
        raise ClaimError("%s; make it right %s%s" % (e, _make_it_right(d), _owner_hint(d, owner))) from None
    return d


def _owner_hint(d: str, owner: Optional[Tuple[str, int]]) -> str:
    """Another account's agent made ``d`` (no owner named): naming that account as the owner
    is the other way to make it right, when it administers the host."""
    try:
        uid = os.lstat(d).st_uid
    except OSError:
        return ""
    if owner is not None or uid in (0, os.geteuid()):
        return ""
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return ""
    return (' (or, when %s administers the GPUs of this host, claim_dir_owner = "%s" in the '
            "[defaults] of every person's inventory)" % (name, name))


def _open(d: str, name: str) -> int:
    """Open (creating, readable and writable by every user) a lock file; never through a link.

    An existing file is opened without O_CREAT: in a sticky directory that others may write to,
    ``fs.protected_regular`` refuses O_CREAT on another account's file (whose owner is not the
    directory's), though the file's mode lets us open it."""
    path = os.path.join(d, name)
    for _ in range(3):
        try:
            return os.open(path, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            pass
        except PermissionError:  # another user's file created without write permission for us
            return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        old = os.umask(0)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
        except FileExistsError:  # another agent made it just now: open theirs
            continue
        finally:
            os.umask(old)
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)


def _gpu_file(gpu: int) -> str:
    return "gpu-%d.lock" % int(gpu)


class _Mutex:
    """The directory's mutex: held while a claim is tested and made (never while a job runs)."""

    def __init__(self, d: str, wait_s: float = MUTEX_WAIT_S, block: bool = True):
        self.d, self.wait_s, self.block = d, wait_s, block
        self.fd = -1

    def __enter__(self) -> bool:
        self.fd = _open(self.d, "claims.lock")
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if not self.block or time.monotonic() > deadline:
                return False
            time.sleep(0.01)

    def __exit__(self, *exc: Any) -> None:
        os.close(self.fd)  # closing drops the lock


def _free(fd: int) -> bool:
    """True when nobody holds the lock (tested with an exclusive lock, released at once)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def _read_holder(fd: int) -> Dict[str, Any]:
    try:
        data = os.pread(fd, HOLDER_BYTES * 4, 0)
        value = json.loads(data.decode("utf-8", "replace").strip() or "{}")
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _write_holder(fd: int, holder: Dict[str, Any]) -> None:
    data = json.dumps(holder, sort_keys=True).encode()
    data = data + b" " * max(0, HOLDER_BYTES - 1 - len(data)) + b"\n"
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    except OSError:
        pass  # a read-only file (another user's, made without write bits): the lock still holds


def describe_holder(holder: Dict[str, Any]) -> str:
    who = "job %s" % holder.get("job_id") if holder.get("job_id") else "an unknown process"
    extra = []
    if holder.get("user"):
        extra.append("user %s" % holder["user"])
    if holder.get("pid"):
        extra.append("pid %s" % holder["pid"])
    if holder.get("since"):
        extra.append("since %s" % time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder["since"]))))
    return who + (" (%s)" % ", ".join(extra) if extra else "")


def claim(gpus: Iterable[int], job_id: str, d: Optional[str] = None) -> List[int]:
    """Claim every GPU in ``gpus`` for ``job_id``, all or none. Returns the locked descriptors
    (shared locks; close them, or let the processes that inherit them exit, to release).

    Raises ClaimError naming the holder when any of them is held by anybody."""
    d = _ensure_dir(d or claim_dir())
    wanted = sorted({int(g) for g in gpus})
    fds = []  # type: List[int]
    with _Mutex(d) as got:
        if not got:
            raise ClaimError("GPU claim directory %s stayed busy for %gs" % (d, MUTEX_WAIT_S))
        try:
            for g in wanted:
                fd = _open(d, _gpu_file(g))
                fds.append(fd)
                if not _free(fd):
                    holder = _read_holder(fd)
                    raise ClaimError("GPU %d on %s is held by %s" % (g, os.uname().nodename, describe_holder(holder)),
                                     gpu=g, holder=holder)
            holder = {"job_id": job_id, "user": _user(), "uid": os.getuid(), "pid": os.getpid(),
                      "since": time.time(), "host": os.uname().nodename}
            for fd in fds:
                fcntl.flock(fd, fcntl.LOCK_SH)  # under the mutex: nobody claims in between
                _write_holder(fd, holder)
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
    return fds


def lock_holders(gpu: int, d: Optional[str] = None, proc_root: str = "/proc") -> List[Tuple[int, str]]:
    """(pid, command line) of every process with ``gpu``'s lock file open: who keeps a claim that
    its holder record no longer explains (for an error message; empty where /proc says nothing)."""
    path = os.path.join(d or claim_dir(), _gpu_file(gpu))
    out = []  # type: List[Tuple[int, str]]
    try:
        pids = [e for e in os.listdir(proc_root) if e.isdigit()]
    except OSError:
        return out
    for pid in pids:
        fd_dir = os.path.join(proc_root, pid, "fd")
        try:
            links = [os.readlink(os.path.join(fd_dir, f)) for f in os.listdir(fd_dir)]
        except OSError:
            continue
        if path in links:
            try:
                with open(os.path.join(proc_root, pid, "cmdline"), "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
            except OSError:
                cmd = "?"
            out.append((int(pid), cmd[:200]))
    return out


def join(gpus: Iterable[int], d: Optional[str] = None) -> List[int]:
    """Take this process's own shared lock on ``gpus`` (a rank wrapper joining its job's claim),
    so the claim outlives the job host and the launcher. Never blocks for long; a GPU whose lock
    cannot be taken is skipped (its claim is held exclusively by a claimant testing it), and
    so is every GPU when the directory is no longer one to trust (the claim made for the start
    checked it; nothing of ours goes into one that changed hands since)."""
    d = d or claim_dir()
    fds = []  # type: List[int]
    try:
        _trusted(d)
    except (OSError, ClaimError):
        return fds
    for g in sorted({int(x) for x in gpus}):
        try:
            fd = _open(d, _gpu_file(g))
        except OSError:
            continue
        deadline = time.monotonic() + 5.0
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fds.append(fd)
                break
            except OSError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    break
                time.sleep(0.01)
    return fds


def held(d: Optional[str] = None, gpus: Optional[Iterable[int]] = None) -> Optional[Dict[int, Dict[str, Any]]]:
    """``{gpu: holder}`` for every claimed GPU (all lock files, or ``gpus``); None when the
    directory's mutex is busy right now (a claim is being made: ask again later). ClaimError
    when the directory is there but not one to trust (``_trusted``): what it holds says nothing."""
    d = d or claim_dir()
    try:
        names = os.listdir(_trusted(d))
    except OSError:
        return {}
    indices = sorted(int(n[4:-5]) for n in names if n.startswith("gpu-") and n.endswith(".lock") and n[4:-5].isdigit())
    if gpus is not None:
        want = {int(g) for g in gpus}
        indices = [i for i in indices if i in want]
    out = {}  # type: Dict[int, Dict[str, Any]]
    with _Mutex(d, block=False) as got:
        if not got:
            return None
        for g in indices:
            try:
                fd = os.open(os.path.join(d, _gpu_file(g)), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                if not _free(fd):
                    out[g] = _read_holder(fd)
            finally:
                os.close(fd)
    return out


def claimed_gpu(fd: int, d: Optional[str] = None, proc_root: str = "/proc") -> Optional[int]:
    """The GPU whose lock file descriptor ``fd`` of this process holds open (a job host telling
    its claims apart, to give one back), or None when it is no GPU lock of ``d``."""
    try:
        path = os.readlink(os.path.join(proc_root, "self", "fd", str(int(fd))))
    except (OSError, ValueError):
        return None
    if os.path.dirname(path) != os.path.realpath(d or claim_dir()):
        return None
    name = os.path.basename(path)
    if name.startswith("gpu-") and name.endswith(".lock") and name[4:-5].isdigit():
        return int(name[4:-5])
    return None
