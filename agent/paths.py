"""Where the agent keeps things on a host, and how to start its daemon.

Kept apart from the daemon so that ``attach`` (one per SSH session) stays light: no asyncio.
Stdlib only, Python 3.9+.
"""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
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
        """Create the state and run directories owner-only, and refuse someone else's."""
        os.makedirs(self.state_dir, mode=0o700, exist_ok=True)
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        st = os.stat(self.run_dir)
        if st.st_uid != os.getuid():
            raise PermissionError("%s belongs to uid %d, not us" % (self.run_dir, st.st_uid))
        if st.st_mode & 0o077:
            os.chmod(self.run_dir, 0o700)


def self_command() -> List[str]:
    """How to start this agent again: the zipapp when we run from one, else the source package."""
    argv0 = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if argv0 and os.path.isfile(argv0) and zipfile.is_zipfile(argv0):
        return [sys.executable, argv0]
    return [sys.executable, "-m", "agent"]


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
