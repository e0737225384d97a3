"""``rigdeck web``: the app served to a browser, checked in headless Chromium (tests/webpage.py)."""

from __future__ import annotations

import asyncio
import http.client
import os
import socket
import time
from pathlib import Path

import aiohttp
import pytest

from tests._require import require
from tests.webpage import (
    WebServer,
    browser,
    chromium_missing,
    free_port,
    open_page,
    screen_text,
    stop_agents,
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
        assert server.url == f"http://127.0.0.1:{server.port}/?token={server.token}"
        assert len(server.token) >= 40  # secrets.token_urlsafe(32): 43 characters
        assert "localhost only" in out and "ssh -L" in out
        with browser() as ctx:
            # Without the token the browser gets a 403, and no app starts for it.
            tokenless = ctx.new_page()
            assert tokenless.goto(server.base + "/").status == 403
            assert "open the URL that `rigdeck web` printed" in tokenless.content()
            tokenless.close()
            assert server.app_pids() == []
            # The printed URL: the page opens its websocket with the token (in its path).
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
            # The token was printed once, in the URL; every request that held it (the page's
            # and its websockets', in the access log) is logged with it taken out.
            assert out.count(server.token) == 1, out
            assert '"GET /?token=<token> HTTP/1.1" 200' in out and '"GET /ws/<token>?width=' in out
            assert _wait_gone([second_app]) == []
            assert "Session ended" in second.content()
    finally:
        if server.proc.poll() is None:
            server.stop()
        stop_agents(tmp_path)  # the agent the app started
    assert server.app_pids() == []


async def _websocket(url: str, origin: str | None = None, host: str | None = None,
                     until: bytes = b"webhost") -> tuple[int, bytes]:
    """A websocket to ``url`` from aiohttp's client (its own handshake), sending ``Origin`` and
    ``Host`` as told: the handshake's status, and what the app's screen sent until ``until``
    showed in it (nothing when the handshake is refused)."""
    async with aiohttp.ClientSession() as session:
        try:
            ws = await session.ws_connect(url, origin=origin, headers={"Host": host} if host else None)
        except aiohttp.WSServerHandshakeError as e:
            return e.status, b""
        screen = b""
        async with ws:
            while until not in screen:
                msg = await ws.receive(timeout=60)
                if msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR):
                    break
                if msg.type == aiohttp.WSMsgType.BINARY:
                    screen += msg.data
        return 101, screen


def _get(port: int, path: str, host: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_web_refuses_a_websocket_without_the_token_from_another_origin_or_host(tmp_path: Path) -> None:
    inv = write_local_inventory(tmp_path, name="webhost")
    server = WebServer(inv, free_port())
    try:
        server.wait_listening()
        port, token = server.port, server.token
        ws = f"ws://127.0.0.1:{port}/ws"
        ours = f"http://127.0.0.1:{port}"
        refused = {
            "no token": asyncio.run(_websocket(ws, origin=ours)),
            "a wrong token in the path": asyncio.run(_websocket(f"{ws}/{token[:-1]}x", origin=ours)),
            "a wrong token in the query": asyncio.run(_websocket(f"{ws}?token={token[:-1]}x", origin=ours)),
            "another site's page": asyncio.run(_websocket(f"{ws}/{token}", origin="http://evil.example")),
            "https, not what is served": asyncio.run(_websocket(f"{ws}/{token}", origin=f"https://127.0.0.1:{port}")),
            # DNS rebinding: the page's own name resolved to 127.0.0.1, in Host and Origin both.
            "a rebound name": asyncio.run(_websocket(f"{ws}/{token}", origin=f"http://evil.example:{port}",
                                                     host=f"evil.example:{port}")),
        }
        assert refused == {why: (403, b"") for why in refused}
        assert server.app_pids() == []  # no app started for any of them
        out = server.output()
        assert "no valid token" in out and "'http://evil.example'" in out and "DNS rebinding" in out

        # The page, asked with the token by another name, is refused too; by localhost it is
        # served, its websocket going back to localhost.
        status, body = _get(port, f"/?token={token}", host=f"evil.example:{port}")
        assert status == 403 and b"does not name this server" in body and token.encode() not in body
        status, body = _get(port, f"/?token={token}", host=f"localhost:{port}")
        assert status == 200 and f'"ws://localhost:{port}/ws/{token}"'.encode() in body

        # With the token and from the server's own origin, the app's screen comes.
        status, screen = asyncio.run(_websocket(f"{ws}?token={token}&width=120&height=40", origin=ours))
        assert status == 101 and b"webhost" in screen
        [app] = _wait_children(server, 1)
        assert _wait_gone([app]) == []  # the websocket closed, its app ends
    finally:
        server.stop()
        stop_agents(tmp_path)


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
