"""Where the agent keeps things on a host, and how to start its daemon.

Kept apart from the daemon so that ``attach`` (one per SSH session) stays light: no asyncio.
Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import os
import subprocess
import sys

from agent import filemodes

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import List, Optional


class Paths:
    def __init__(self, state_dir: str):
        self.state_dir = os.path.abspath(os.path.expanduser(state_dir))
        self.run_dir = os.path.join(self.state_dir, "run")
        self.socket = os.path.join(self.run_dir, "agent.sock")
        self.lock = os.path.join(self.run_dir, "daemon.lock")
        self.pidfile = os.path.join(self.run_dir, "daemon.pid")
        self.log = os.path.join(self.state_dir, "agent.log")
        self.stderr = os.path.join(self.state_dir, "agent.stderr")  # crashes before logging is up

    def ensure(self) -> None:
        """Create the state and run directories owner-only, and refuse ones not to trust."""
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        self.check()
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        st = os.stat(self.run_dir)
        if st.st_uid != os.getuid():
            raise PermissionError("%s belongs to uid %d, not us" % (self.run_dir, st.st_uid))
        if st.st_mode & 0o077:
            os.chmod(self.run_dir, 0o700)

    def check(self) -> None:
        """Refuse (UnsafeDirError, an OSError) a state directory that another user owns, or that
        others may write to without the sticky bit: they could put their own agent, socket or
        job files in place of ours. FileNotFoundError when there is none yet."""
        filemodes.trusted_dir(self.state_dir, "agent state directory")


UNPACKED = "unpacked"  # beside agent.pyz: the same files, byte-compiled for this host's Python


def is_unpacked(path: str) -> bool:
    """True for a directory made by ``unpack`` (it runs as ``python DIR`` as the zipapp does)."""
    return os.path.isfile(os.path.join(path, "__main__.py")) and os.path.isfile(
        os.path.join(path, "agent", "BUILD.json"))


def self_command() -> List[str]:
    """How to start this agent again: the zipapp (or its unpacked copy) when we run from one, else
    the source package."""
    argv0 = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if argv0 and os.path.isdir(argv0) and is_unpacked(argv0):
        return [sys.executable, argv0]
    if argv0 and os.path.isfile(argv0):
        import zipfile  # (here: what runs from the unpacked copy never reads a zipapp)

        if zipfile.is_zipfile(argv0):
            return [sys.executable, argv0]
    return [sys.executable, "-m", "agent"]


def unpack(pyz: str) -> str:
    """The zipapp's files in ``<its dir>/unpacked``, byte-compiled; returns that directory.

    A job host and every rank wrapper is a fresh interpreter. From a zipapp each one compiles
    every agent module from source (zipimport cannot cache bytecode): about 60 ms of CPU per job
    host on an idle core, paid by every process of a wave of trials starting at once. The copy
    holds the same bytes as the archive (checked on each call, so a changed or damaged copy is
    made again), and its bytecode is checked against the source's hash at every import, so it
    can never run anything but what the verified archive holds. Made in a temporary directory and
    renamed into place: a reader sees the whole copy or none."""
    import compileall
    import py_compile
    import shutil
    import zipfile

    target = os.path.join(os.path.dirname(os.path.abspath(pyz)), UNPACKED)
    with zipfile.ZipFile(pyz) as zf:
        entries = {i.filename: zf.read(i) for i in zf.infolist() if not i.is_dir()}
    for name in entries:
        if name.startswith("/") or ".." in name.split("/"):
            raise ValueError("%s: unsafe member name %r" % (pyz, name))

    def same() -> bool:
        for name, data in entries.items():
            try:
                with open(os.path.join(target, name), "rb") as f:
                    if f.read() != data:
                        return False
            except OSError:
                return False
        return True

    if os.path.isdir(target) and same():
        return target
    tmp = "%s.tmp-%d" % (target, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for name, data in entries.items():
            path = os.path.join(tmp, name)
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
        if not compileall.compile_dir(tmp, ddir=target, quiet=1, workers=1,
                                      invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH):
            raise OSError("%s: byte-compiling the agent failed" % tmp)
        if os.path.isdir(target):
            old = "%s.old-%d" % (target, os.getpid())
            os.rename(target, old)
            shutil.rmtree(old, ignore_errors=True)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def unpacked_command(command: List[str]) -> List[str]:
    """``command`` run from the unpacked copy when it is a zipapp's (``[python, agent.pyz]``);
    the zipapp itself when unpacking fails (a full disk): slower starts, nothing lost."""
    if len(command) != 2 or not command[1].endswith(".pyz"):
        return list(command)
    import logging
    import zipfile

    try:
        return [command[0], unpack(command[1])]
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        logging.getLogger("rigdeck.agent").warning("running jobs from %s (could not unpack it: %s)", command[1], e)
        return list(command)


def spawn_daemon(paths: Paths, command: Optional[List[str]] = None) -> subprocess.Popen:
    """Start a detached daemon in a new session; it outlives the caller and its SSH session."""
    paths.ensure()
    cmd = (command or self_command()) + ["daemon", "--state-dir", paths.state_dir]
    env = dict(os.environ)
    if cmd[1:2] == ["-m"]:  # running from a source tree: make the package importable from cwd
        src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    with open(os.devnull, "rb") as devnull_in, open(paths.stderr, "ab") as log_out:
        return subprocess.Popen(
            cmd,
            stdin=devnull_in,
            stdout=log_out,
            stderr=log_out,
            start_new_session=True,
            close_fds=True,
            cwd=paths.state_dir,
            env=env,
        )
