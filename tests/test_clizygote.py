"""The tests' CLI zygote (tests/kit/clizygote.py): a command line run through it is the same as
one run by a fresh interpreter: its output, exit status, environment and working directory; a
signal ends it as it ends a process; no rigdeck home leaks into the zygote's own environment."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.kit import ROOT, clizygote


def both(args: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], ...]:
    fresh = subprocess.run([sys.executable, "-m", "tui.cli", *args], capture_output=True, text=True, env=env,
                           cwd=ROOT, timeout=120)
    return fresh, clizygote.run(args, env, timeout=120)


@pytest.mark.parametrize("args", [["jobs", "--json"], ["status", "no-such-job"], ["--help"], ["launch"]])
def test_a_command_line_through_the_zygote_says_and_exits_as_a_fresh_one(tmp_path: Path, args: list[str]) -> None:
    env = {**os.environ, "RIGDECK_HOME": str(tmp_path / "home"), "RIGDECK_INVENTORY": str(tmp_path / "none.toml")}
    (tmp_path / "none.toml").write_text('[[hosts]]\nname = "h1"\naddress = "127.0.0.1"\nport = 1\n')
    fresh, forked = both(args, env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_the_child_has_its_own_environment_directory_and_pid_and_dies_of_a_signal(tmp_path: Path) -> None:
    zygote = clizygote.Zygote.mine()
    assert zygote is not None
    env = {**os.environ, "RIGDECK_HOME": str(tmp_path / "home"), "RIGDECK_INVENTORY": str(tmp_path / "inv.toml")}
    (tmp_path / "inv.toml").write_text('[[hosts]]\nname = "h1"\naddress = "127.0.0.1"\n')
    child = zygote.start(["jobs", "--json"], env, str(tmp_path))
    try:
        environ = Path(f"/proc/{child.pid}/environ").read_bytes() if Path(f"/proc/{child.pid}").exists() else b""
        out, err = child.communicate(120)
        assert child.wait() == 0, err
        assert child.pid != zygote.proc.pid and out.strip() == "[]"
    finally:
        child.close()
    # /proc/PID/environ is the zygote's start-up environment: it carries no rigdeck home
    assert b"RIGDECK_HOME" not in environ
    assert b"RIGDECK_HOME" not in Path(f"/proc/{zygote.proc.pid}/environ").read_bytes()
    # a signal ends a child as it ends any process (the status says which)
    silent = socket.socket()  # accepts (the kernel does), never speaks SSH: the command waits
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    hold = tmp_path / "hold.toml"
    hold.write_text(f'[[hosts]]\nname = "h1"\naddress = "127.0.0.1"\nport = {silent.getsockname()[1]}\n'
                    'connect_timeout = 60\n')
    child = zygote.start(["hosts"], {**env, "RIGDECK_INVENTORY": str(hold)}, str(tmp_path))
    try:
        timer = threading.Timer(2.0, os.kill, (child.pid, signal.SIGTERM))
        timer.start()
        t = time.monotonic()
        child.communicate(120)
        assert child.wait() == -signal.SIGTERM and time.monotonic() - t < 60
    finally:
        child.close()
        silent.close()


def test_exec_mode_starts_a_fresh_interpreter(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RIGDECK_TEST_CLI", "exec")
    assert clizygote.Zygote.mine() is None
    env = {**os.environ, "RIGDECK_HOME": str(tmp_path / "home")}
    done = clizygote.run(["--help"], env, timeout=120)
    assert done.returncode == 0 and "usage: rigdeck" in done.stdout


@pytest.mark.parametrize("mode", ["fork", "exec"])
def test_a_command_past_its_limit_says_where_it_is_and_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            mode: str) -> None:
    """``abort``: past the limit the command gets SIGABRT, and with PYTHONFAULTHANDLER its threads'
    stacks come back in what it printed (what Cli.run says when a command hangs in CI)."""
    monkeypatch.setenv("RIGDECK_TEST_CLI", mode)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    try:
        inv = tmp_path / "hold.toml"
        inv.write_text(f'[[hosts]]\nname = "h1"\naddress = "127.0.0.1"\nport = {silent.getsockname()[1]}\n'
                       'connect_timeout = 60\n')
        env = {**os.environ, "RIGDECK_HOME": str(tmp_path / "home"), "RIGDECK_INVENTORY": str(inv),
               "PYTHONFAULTHANDLER": "1"}
        with pytest.raises(subprocess.TimeoutExpired) as e:
            clizygote.run(["hosts"], env, timeout=3.0, abort=True)
        assert "Fatal Python error: Aborted" in str(e.value.stderr), e.value.stderr
    finally:
        silent.close()
