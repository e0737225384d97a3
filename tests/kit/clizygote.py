"""``rigdeck`` command lines for the tests without paying Python's start and rigdeck's imports on
each one: a zygote process per test worker imports the command's modules once, then forks a child
for every command line, which runs ``python -m tui.cli`` as the interpreter would (``runpy``, as
``__main__``, ``sys.argv`` set) in that command's environment, working directory and standard
streams, and ends through the interpreter's own exit (atexit, threads joined, streams flushed).

Why: a suite run spends about a fifth of its CPU on ~900 command lines, most of it importing
(0.5 s of 0.7 s each, on the CI's 2 cores). A forked child is still its own process (its own
pid, exit status, signals, files and environment), so a test sees the command exactly as a person
runs it; what it does not exercise is the interpreter's start, which every test that starts
``python -m tui.cli`` itself (tests/test_contracts.py, test_lifecycle.py, test_doctor.py,
test_exec.py, test_app.py, ``Cli.popen``) still does. ``RIGDECK_TEST_CLI=exec`` turns it off:
every ``Cli.run`` then starts a fresh interpreter.

The zygote listens on a Unix socket in a directory only its user can enter, made by the worker
that starts it; it ends when that worker does. A request: one JSON line (argv, env, cwd) with
the child's stdin, stdout and stderr passed as file descriptors (SCM_RIGHTS); the answer: a line
with the child's pid, then one with its exit status (negative: the signal that ended it, as
``Popen.returncode``).
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import runpy
import selectors
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent.parent
# What the commands import, now or when one runs (tui.app only when the app opens: not here).
PACKAGES = ("tui.cli", "tui.client", "tui.control", "tui.remote", "tui.model", "agent", "runtime")
OPTIONAL = ("optuna",)  # a sweep's command imports it when it runs


def warm() -> None:
    """Import every module a command may import (a module that fails to import is left for the
    command to fail on, as it would)."""
    import tui.main  # noqa: F401

    for name in PACKAGES:
        pkg = importlib.import_module(name)
        for info in pkgutil.walk_packages(getattr(pkg, "__path__", []), prefix=name + "."):
            if ".__main__" in info.name or info.name.startswith("tui.cli.web"):
                continue
            try:
                importlib.import_module(info.name)
            except Exception:  # noqa: BLE001 - not ours to judge here
                pass
    for name in OPTIONAL:
        try:
            importlib.import_module(name)
        except ImportError:
            pass


def run_child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the command line and run it; never returns (SystemExit)."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    if os.environ.get("PYTHONFAULTHANDLER"):
        import faulthandler

        faulthandler.enable(file=sys.stderr, all_threads=True)
    sys.argv = ["-m", *request["argv"]]
    runpy.run_module("tui.cli", run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def read_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One request: its JSON line, and the descriptors that came with its first bytes."""
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 16)
        if not more:
            for fd in fds:
                os.close(fd)
            raise EOFError("the caller went away mid-request")
        data += more
    return json.loads(data.decode()), list(fds)


def serve(listener: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """Answer requests until the worker that started us is gone (None), or, in a forked child,
    return its request and descriptors."""
    parent = os.getppid()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    os.set_blocking(wake_r, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    children: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        for key, _ in sel.select(timeout=5.0):
            if key.data == "child":
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                continue
            conn, _ = listener.accept()
            try:
                request, fds = read_request(conn)
            except (OSError, EOFError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                sel.close()
                listener.close()
                os.close(wake_r)
                os.close(wake_w)
                for c in children.values():
                    c.close()
                conn.close()
                return request, fds
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            try:
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            except OSError:
                pass
        while children:  # reap every child that ended, and tell its caller
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            caller = children.pop(pid, None)
            if caller is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            try:
                caller.sendall(json.dumps({"exit": code}).encode() + b"\n")
            except OSError:
                pass
            caller.close()
    return None


def main() -> None:
    path = sys.argv[1]
    sys.path.insert(0, str(ROOT))
    warm()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(64)
    os.rename(path + ".new", path)  # the path appears once requests can be made
    got = serve(listener)
    if got is not None:
        run_child(*got)


if __name__ == "__main__":
    main()


# ---------------------------------------------------------------------------------------------
# The worker's side


_LOCK = threading.Lock()


class Zygote:
    """This process's zygote (started on first use) and ``run``: one command line through it."""

    _mine: Zygote | None = None

    def __init__(self) -> None:
        import subprocess
        import tempfile

        self.dir = tempfile.mkdtemp(prefix="rigdeck-cli-zygote-")  # 0700: only this user enters
        self.path = os.path.join(self.dir, "sock")
        # Its own environment carries no rigdeck home or inventory (a test that looks for
        # processes of a home in /proc/PID/environ must not find the zygote); each child gets
        # its command's whole environment.
        env = {k: v for k, v in os.environ.items() if not k.startswith("RIGDECK_")}
        with open(os.path.join(self.dir, "log"), "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.kit.clizygote", self.path], cwd=ROOT,
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, env=env)
        import atexit

        atexit.register(self.close)
        import time

        deadline = time.monotonic() + 120
        while not os.path.exists(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                said = Path(self.dir, "log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the CLI zygote did not start (exit {self.proc.poll()}): {said}")
            time.sleep(0.05)

    def close(self) -> None:
        import shutil

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:  # noqa: BLE001 - leaving: it ends with its parent anyway
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

    @classmethod
    def mine(cls) -> Zygote | None:
        """This process's zygote; None when ``RIGDECK_TEST_CLI=exec`` asks for fresh interpreters."""
        if os.environ.get("RIGDECK_TEST_CLI") == "exec":
            return None
        with _LOCK:  # a test's threads may run their first command lines at once
            if cls._mine is None or cls._mine.proc.poll() is not None:
                cls._mine = cls()
            return cls._mine

    def start(self, argv: list[str], env: dict[str, str], cwd: str) -> Child:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(self.path)
            line = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode() + b"\n"
            sent = socket.send_fds(conn, [line[:4096]], [null, out_w, err_w])
            conn.sendall(line[sent:])
        finally:
            for fd in (null, out_w, err_w):
                os.close(fd)
        return Child(conn, out_r, err_r)


class Child:
    """One command line running in a forked child: its pid, output and exit status."""

    def __init__(self, conn: socket.socket, out_r: int, err_r: int) -> None:
        self.conn = conn
        self.answers = conn.makefile("rb")
        first = self.answers.readline()
        if not first:
            os.close(out_r)
            os.close(err_r)
            raise RuntimeError("the CLI zygote closed the request without starting the command")
        self.pid = int(json.loads(first)["pid"])
        self.fds = {out_r: bytearray(), err_r: bytearray()}
        self.out_r, self.err_r = out_r, err_r
        self._closed: set[int] = set()

    def communicate(self, timeout: float | None) -> tuple[str, str]:
        """Both streams to their ends; TimeoutError (what was read is kept) after ``timeout``."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for fd in self.fds:
                if fd not in self._closed:
                    sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError
                for key, _ in sel.select(left):
                    chunk = os.read(key.fd, 1 << 16)
                    if chunk:
                        self.fds[key.fd] += chunk
                    else:
                        sel.unregister(key.fd)
                        os.close(key.fd)
                        self._closed.add(key.fd)
        return (self.fds[self.out_r].decode(errors="replace"), self.fds[self.err_r].decode(errors="replace"))

    def wait(self) -> int:
        """The exit status (negative: the signal), once the zygote reaped the child."""
        line = self.answers.readline()
        self.answers.close()
        self.conn.close()
        if not line:
            raise RuntimeError(f"the CLI zygote ended before reporting pid {self.pid}'s exit")
        return int(json.loads(line)["exit"])

    def close(self) -> None:
        for fd in (self.out_r, self.err_r):
            if fd not in self._closed:
                os.close(fd)
                self._closed.add(fd)
        self.answers.close()
        self.conn.close()


def run(args: list[str], env: dict[str, str], timeout: float | None = None, abort: bool = False) -> Any:
    """``rigdeck ARGS`` to its end, as ``subprocess.run([python, -m, tui.cli, *args],
    capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)`` would: through this
    process's zygote (a fresh interpreter under ``RIGDECK_TEST_CLI=exec``). Past ``timeout`` the
    command is killed and ``subprocess.TimeoutExpired`` raised with what it printed; ``abort``:
    it is first asked where it is (SIGABRT: with PYTHONFAULTHANDLER set it prints every thread's
    stack), and killed 20 s later if still there."""
    import subprocess

    argv = [sys.executable, "-m", "tui.cli", *args]
    zygote = Zygote.mine()
    child: Any = zygote.start(list(args), env, str(ROOT)) if zygote is not None else subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    popen = zygote is None

    def communicate(limit: float | None) -> tuple[str, str]:
        if not popen:
            return child.communicate(limit)  # type: ignore[no-any-return]
        try:
            out, err = child.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            raise TimeoutError from None
        return out.decode(errors="replace"), err.decode(errors="replace")

    try:
        try:
            out, err = communicate(timeout)
        except TimeoutError:
            if abort:
                os.kill(child.pid, signal.SIGABRT)
            try:
                if not abort:
                    raise TimeoutError
                out, err = communicate(20)
            except TimeoutError:
                os.kill(child.pid, signal.SIGKILL)
                out, err = communicate(None)
            child.wait()
            raise subprocess.TimeoutExpired(argv, timeout or 0, out, err) from None
        return subprocess.CompletedProcess(argv, child.wait(), out, err)
    finally:
        if not popen:
            child.close()
