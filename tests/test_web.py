"""``rigdeck web``: the app served to a browser, checked in headless Chromium (tests/webpage.py)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from tests._require import require
from tests.webpage import (
    WebServer,
    browser,
    chromium_missing,
    free_port,
    open_page,
    screen_text,
    wait_for_text,
    write_local_inventory,
)
from tui.cli.main import main
from tui.cli.web import app_command, is_loopback


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def _wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _wait_children(server: WebServer, n: int, timeout: float = 30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [p for p in server.app_pids() if _alive(p)]
        if len(pids) == n:
            return pids
        time.sleep(0.1)
    raise AssertionError(f"expected {n} session app(s), saw {server.app_pids()}")


def test_web_serves_the_app_to_headless_chromium(tmp_path: Path) -> None:
    require(chromium_missing() is None, chromium_missing() or "")
    inv = write_local_inventory(tmp_path, name="webhost")
    server = WebServer(inv, free_port())
    try:
        out = server.wait_listening()
        assert f"serving the app on http://127.0.0.1:{server.port}" in out
        assert "localhost only" in out and "ssh -L" in out
        with browser() as ctx:
            first = open_page(ctx, server.url)
            # The hosts view, drawn by the app in the page's terminal, the local host up.
            screen = wait_for_text(first, "Hosts 1", "GPUs 2", "webhost", "hosts 1/1 up")
            assert "no job open" not in screen
            [first_app] = _wait_children(server, 1)
            # A key typed into the page reaches the app: 4 opens the Job view.
            first.locator("#terminal").click()
            first.keyboard.press("4")
            wait_for_text(first, "no job open: launch one (l)")
            assert "hosts 1/1 up" in screen_text(first)  # the summary line stays

            # A second tab is a session of its own, with its own app.
            second = open_page(ctx, server.url)
            wait_for_text(second, "Hosts 1", "webhost")
            assert "no job open" not in screen_text(second)
            apps = _wait_children(server, 2)
            assert first_app in apps

            # Closing a tab ends its app; the other session goes on.
            first.close()
            assert _wait_gone([first_app]) == []
            [second_app] = _wait_children(server, 1)
            assert second_app != first_app
            # Ctrl+C with a tab still open ends that session's app, then the server.
            rc = server.stop()
            out = server.output()
            assert rc == 0, out
            assert "rigdeck web: stopped" in out
            assert _wait_gone([second_app]) == []
            assert "Session ended" in second.content()
    finally:
        if server.proc.poll() is None:
            server.stop()
        for pid_file in tmp_path.glob("**/run/daemon.pid"):  # the agent the app started
            try:
                os.kill(int(pid_file.read_text().strip()), 15)
            except (ValueError, OSError):
                pass
    assert server.app_pids() == []


def test_web_refuses_a_public_bind_without_allow_remote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inv = write_local_inventory(tmp_path)
    port = free_port()
    assert main(["web", "--inventory", str(inv), "--host", "0.0.0.0", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert "0.0.0.0 is not a loopback address" in err
    assert f"ssh -L {port}:127.0.0.1:{port}" in err and "--allow-remote" in err
    # Nothing listens: the refusal comes before the server.
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_web_reports_a_bad_inventory_and_a_bad_port_before_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "hosts.toml"
    bad.write_text('[[hosts]]\nname = "x"\nport = "twenty-two"\n')
    assert main(["web", "--inventory", str(bad), "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "port" in err
    inv = write_local_inventory(tmp_path)
    assert main(["web", "--inventory", str(inv), "--port", "70000"]) == 2
    assert "--port 70000: expected a TCP port, 1 to 65535" in capsys.readouterr().err


def test_web_reports_a_port_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inv = write_local_inventory(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["web", "--inventory", str(inv), "--port", str(port)]) == 1
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_loopback_and_the_app_command() -> None:
    for host in ("127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.5", "example.com", ""):
        assert not is_loopback(host), host

    class Args:
        inventory = "inv dir/$(id).toml"
        accept_new = True

    cmd = app_command(Args())  # type: ignore[arg-type]
    assert cmd.startswith("exec ") and cmd.endswith(" app --inventory "
                                                    f"'{os.path.abspath('inv dir/$(id).toml')}' --accept-new")
