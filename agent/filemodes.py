"""Who may read and change rigdeck's directories and files.

Two kinds. A *private* directory or file is its owner's alone (0700, 0600): the controller's
home (``RIGDECK_HOME``), its job history and its code store hold specs, environments and the
code of every job, which nobody else on the machine should read or change. One made before is
tightened, not refused: older rigdeck versions made them with the umask's modes.

A *trusted* directory is one rigdeck may keep things in although it may not be ours alone (the
host's GPU claims, shared by every user): nobody but its owner and root can remove or replace
what is in it. That holds when root or we own it and nobody else may write to it, or anybody
may write to it but the sticky bit keeps each entry its owner's (as /tmp). Someone else's, or
one others may write to without the sticky bit, is refused: its owner, or any writer, could
swap our locks or sockets for their own. A directory every account of a host shares (the GPU
claims) may also be trusted when an account the caller names owns it (the hosts' admin: the
inventory's ``claim_dir_owner``).

Stdlib only, Python 3.9+: the agent uses it on the hosts, the controller (tui/) on the
workstation and the server host.
"""
from __future__ import annotations

import os
import stat

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import IO, Any, Iterable

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


class UnsafeDirError(PermissionError):
    """A directory rigdeck will not use; the message names it and says what was expected."""


def _owner_name(uid: int) -> str:
    try:
        import pwd

        return "%s (uid %d)" % (pwd.getpwuid(uid).pw_name, uid)
    except (ImportError, KeyError):
        return "uid %d" % uid


def private_dir(path: Any, what: str = "directory") -> str:
    """Make ``path`` (and any missing parents, with the umask's modes) and leave it 0700.

    One there already is tightened when looser. Refused: a non-directory, someone else's
    directory (we could not keep it private), and a sticky one (a shared directory such as
    /tmp: tightening it would lock every other user out). ``what`` names it in the error."""
    path = os.fspath(path)
    os.makedirs(path, mode=PRIVATE_DIR, exist_ok=True)
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirError("%s %s is not a directory" % (what, path))
    if st.st_uid != os.geteuid():
        raise UnsafeDirError("%s %s belongs to %s, not to %s: use a directory of your own"
                             % (what, path, _owner_name(st.st_uid), _owner_name(os.geteuid())))
    if st.st_mode & stat.S_ISVTX:
        raise UnsafeDirError("%s %s is a shared directory (mode %o, sticky): use a directory of its own"
                             % (what, path, stat.S_IMODE(st.st_mode)))
    if stat.S_IMODE(st.st_mode) != PRIVATE_DIR:
        os.chmod(path, PRIVATE_DIR)
    return path


def private_file(path: Any) -> bool:
    """Tighten an existing file to 0600 when looser; False when there is no such file."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return False
    if mode & ~PRIVATE_FILE:
        os.chmod(path, mode & PRIVATE_FILE)
    return True


def open_private(path: Any, binary: bool = True) -> IO[Any]:
    """``path`` opened for writing from its start, 0600 whether new or there before (the mode
    is given at creation: the file is never readable by others, not even for a moment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & ~PRIVATE_FILE:
            os.fchmod(fd, PRIVATE_FILE)  # there before, with a looser mode
        return os.fdopen(fd, "wb" if binary else "w")
    except BaseException:
        os.close(fd)
        raise


def write_private(path: Any, data: bytes) -> None:
    """Write ``data`` as the whole of ``path``, a 0600 file."""
    with open_private(path) as f:
        f.write(data)


def untrusted_reason(st: os.stat_result, owners: Iterable[int] = ()) -> str:
    """Why a directory with this stat may not be trusted ("" when it may: see the module).
    ``owners``: uids trusted as its owner beside root and us (a shared directory's admin)."""
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory"
    me = os.geteuid()
    allowed = [0]
    for uid in [me, *owners]:
        if uid not in allowed:
            allowed.append(uid)
    if st.st_uid not in allowed:
        names = ["root"] + [_owner_name(u) for u in allowed[1:]]
        expected = names[0] if len(names) == 1 else "%s or %s" % (", ".join(names[:-1]), names[-1])
        return "it belongs to %s, another user (%s expected)" % (_owner_name(st.st_uid), expected)
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not st.st_mode & stat.S_ISVTX:
        who = "its group and everyone" if writable == stat.S_IWGRP | stat.S_IWOTH else (
            "its group" if writable == stat.S_IWGRP else "everyone")
        return "%s may write to it (mode %o) without the sticky bit" % (who, stat.S_IMODE(st.st_mode))
    return ""


def trusted_dir(path: Any, what: str, follow: bool = True, owners: Iterable[int] = ()) -> os.stat_result:
    """``path``'s stat when it is a directory rigdeck may keep things in; else UnsafeDirError
    naming ``what`` and ``path`` and why. ``follow=False``: a symbolic link is refused too.
    ``owners``: uids trusted as its owner beside root and us."""
    st = os.stat(path) if follow else os.lstat(path)
    why = untrusted_reason(st, owners)
    if why:
        raise UnsafeDirError("%s %s is not safe to use: %s" % (what, os.fspath(path), why))
    return st
