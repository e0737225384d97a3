"""A host out of reach is answered for at once: one connect attempt per host at a time, in the
background, with backoff (tui/control/hostlinks.py). Real sockets on this machine: a port
nobody listens on (refused), and a listener whose backlog is full (the kernel drops the SYNs,
as for a host whose link is down). No sshd is needed: nothing gets past TCP."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tui.control.history import History
from tui.control.hostlinks import KNOWN_DOWN_FOR_S, HostLinks
from tui.remote.inventoryfile import load_inventory
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


def _controller(tmp_path: Path, port: int, connect_timeout: float = 2.0, memory: History | None = None) -> HostLinks:
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
    ctl = HostLinks(load_inventory(inv))
    ctl.memory = memory
    return ctl


def _connecting() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "connect-gone"]


def test_a_silent_host_is_reported_at_once_while_one_attempt_goes_on(tmp_path: Path, silent_port: int) -> None:
    ctl = _controller(tmp_path, silent_port)
    with pytest.raises(UnreachableError, match=r"did not answer within 0.7s \(still trying, connect timeout 2s\)"):
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


def test_what_one_command_found_out_of_reach_the_next_knows(tmp_path: Path, silent_port: int) -> None:
    """Each CLI command is a process of its own with a controller of its own: the history tells
    the next one which hosts the last found silent, and it waits for those a short while only,
    saying since when. A short wait renews nothing: after KNOWN_DOWN_FOR_S the full wait again."""
    history = History(tmp_path / "history.sqlite")
    endpoint = f"127.0.0.1:{silent_port}"
    first = _controller(tmp_path, silent_port, memory=history)
    with pytest.raises(UnreachableError, match=r"^gone: 127.0.0.1:\d+ did not answer within 0.7s"):
        first.agent("gone").ping()
    first.close()
    found = history.unreached(endpoint)
    assert found is not None and found[0] == found[1]  # found now, after the full wait
    second = _controller(tmp_path, silent_port, memory=History(tmp_path / "history.sqlite"))
    with pytest.raises(UnreachableError,
                       match=r"out of reach since \d\d:\d\d:\d\d; 127.0.0.1:\d+ did not answer within 0.3s"):
        second.agent("gone").ping()
    second.close()
    now = history.unreached(endpoint)
    assert now is not None and now[:2] == found[:2]  # the short wait left since and checked as they were
    with history._db:  # the last full wait was longer ago than the record is trusted
        history._db.execute("UPDATE unreached SET checked = checked - ?", (KNOWN_DOWN_FOR_S + 1,))
    third = _controller(tmp_path, silent_port, memory=history)
    with pytest.raises(UnreachableError, match=r"^gone: 127.0.0.1:\d+ did not answer within 0.7s"):
        third.agent("gone").ping()
    third.close()
    again = history.unreached(endpoint)
    assert again is not None and again[0] == found[0] and again[1] > found[1]  # since kept, checked renewed


def test_a_host_that_answers_is_struck_off(tmp_path: Path) -> None:
    """A host recorded out of reach whose SYN is answered now is no longer held so, whatever
    happens after the TCP connect (here nothing speaks SSH on the port)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    history = History(tmp_path / "history.sqlite")
    history.set_unreached(f"127.0.0.1:{port}", "did not answer", checked=True)
    other = "127.0.0.1:1"
    history.set_unreached(other, "did not answer", checked=True)
    ctl = _controller(tmp_path, port, connect_timeout=1.0, memory=history)
    try:
        with pytest.raises(UnreachableError) as e:
            ctl.agent("gone").ping()
        assert "out of reach since" not in str(e.value) and "did not answer within 0.3s" not in str(e.value)
        assert history.unreached(f"127.0.0.1:{port}") is None
        assert history.unreached(other) is not None  # only that host
    finally:
        ctl.close()
        listener.close()
