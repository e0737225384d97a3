"""A host out of reach is answered for at once: one connect attempt per host at a time, in the
background, with backoff (tui/control/controller.py). Real sockets on this machine: a port
nobody listens on (refused), and a listener whose backlog is full (the kernel drops the SYNs,
as for a host whose link is down). No sshd is needed: nothing gets past TCP."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tui.control.controller import Controller
from tui.remote.sshconfig import load_inventory
from tui.remote.transport import UnreachableError


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port whose SYNs go unanswered: a listener that never accepts, its backlog full."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    for _ in range(4):  # listen(0) still takes one or two: fill them
        c = socket.socket()
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
        fillers.append(c)
    try:
        yield port
    finally:
        for c in fillers:
            c.close()
        srv.close()


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nobody listens there now: a connect is refused
    return port


def _controller(tmp_path: Path, port: int, connect_timeout: float = 2.0) -> Controller:
    key = tmp_path / "id"
    key.write_text("not used: nothing gets past TCP\n")
    inv = tmp_path / "hosts.toml"
    inv.write_text(f"""[defaults]
user = "root"
identity_file = "{key}"
known_hosts = "{tmp_path / 'known_hosts'}"
connect_timeout = {connect_timeout}

[[hosts]]
name = "gone"
address = "127.0.0.1"
port = {port}
""")
    return Controller(load_inventory(inv))


def _connecting() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "connect-gone"]


def test_a_silent_host_is_reported_at_once_while_one_attempt_goes_on(tmp_path: Path, silent_port: int) -> None:
    ctl = _controller(tmp_path, silent_port)
    with pytest.raises(UnreachableError, match=r"did not answer within 1s \(still trying, connect timeout 2s\)"):
        ctl.agent("gone").ping()
    assert len(_connecting()) == 1  # the attempt goes on, in the background
    attempt = ctl._reach["gone"].attempt
    with pytest.raises(UnreachableError, match="still trying"):
        ctl.agent("gone").ping()  # no second attempt beside the first
    assert ctl._reach["gone"].attempt is attempt and len(_connecting()) == 1
    assert attempt is not None and attempt.done.wait(10)
    # The attempt ended at its connect timeout: the host is held out of reach (no new attempt)
    # until its backoff passes.
    with pytest.raises(UnreachableError, match=r"out of reach since .*did not answer within 2s.*tried again in"):
        ctl.agent("gone").ping()
    assert ctl._reach["gone"].attempt is attempt
    assert "did not answer within 2s" in ctl.unreachable()["gone"]
    ctl._reach["gone"].retry_at = 0.0  # its backoff has passed: the next request tries again
    with pytest.raises(UnreachableError, match="still trying"):
        ctl.agent("gone").ping()
    second = ctl._reach["gone"].attempt
    assert second is not attempt and second is not None
    ctl.close()  # not held up by the attempt: it closes what it makes once it ends
    assert not second.done.is_set()


def test_a_refused_host_fails_once_then_is_held_out_of_reach_with_backoff(tmp_path: Path) -> None:
    ctl = _controller(tmp_path, _free_port())
    with pytest.raises(UnreachableError, match="cannot connect to 127.0.0.1"):
        ctl.agent("gone").ping()
    first = ctl._reach["gone"]
    assert first.error is not None and first.retry_at > 0
    with pytest.raises(UnreachableError, match=r"out of reach since \d\d:\d\d:\d\d \(cannot connect"):
        ctl.agent("gone").ping()
    delays = []
    for _ in range(4):  # each failed attempt waits longer before the next, up to the maximum
        first.retry_at = 0.0
        with pytest.raises(UnreachableError):
            ctl.agent("gone").ping()
        delays.append(first.backoff.attempts)
    assert delays == [2, 3, 4, 5]
    ctl.close()


def test_many_requests_to_a_silent_host_make_one_attempt(tmp_path: Path, silent_port: int) -> None:
    ctl = _controller(tmp_path, silent_port)
    got = ctl.request_many(["gone"] * 1, "ping")
    assert isinstance(got["gone"], UnreachableError)
    errors: list[BaseException] = []

    def ask() -> None:
        try:
            ctl.agent("gone").ping()
        except UnreachableError as e:
            errors.append(e)

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(errors) == 8 and len(_connecting()) <= 1
    ctl.close()
