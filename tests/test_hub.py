"""SSH connections served by the hub's fixed threads (tui/remote/hub.py), against real sshd hosts:
exec, SFTP, long-lived streams, a host killed or cut off mid-stream, reconnecting, and a peer
that stops in the middle of a message, with no paramiko thread per connection anywhere."""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import socket
import threading
import time
from typing import Any

import paramiko
import pytest

from tests.testbed import TestBed
from tui.remote import hub
from tui.remote.inventoryfile import load_inventory
from tui.remote.transport import SSHTransport, Stream, TransportError, _AeadFirst, make_transport


def _paramiko_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if isinstance(t, paramiko.Transport)]


def _links(bed: TestBed, count: int) -> list[SSHTransport]:
    inv = load_inventory(bed.inventory_path)
    links = []
    for i in range(count):
        t = make_transport(inv, inv.hosts[i % len(inv.hosts)])
        assert isinstance(t, SSHTransport)
        t.connect()
        links.append(t)
    return links


def _hub_of(t: SSHTransport) -> Any:
    transport = t._transport()
    assert isinstance(transport, hub.HubTransport) and transport.served
    return transport._hub


def _echo(stream: Stream, line: bytes) -> bytes:
    """Send a line to ``cat`` and read until it is back whole; what came, up to it."""
    stream.send(line)
    got = b""
    while not got.endswith(line):
        part = stream.recv(30.0)
        assert part, f"the stream ended or said nothing after {got!r}"
        got += part
    return got


@pytest.mark.testbed
def test_exec_sftp_streams_and_a_dead_host_on_the_hub_threads(testbed_factory: Any) -> None:
    bed: TestBed = testbed_factory(3)
    links = _links(bed, 3)
    try:
        assert _paramiko_threads() == [], "a connection started a paramiko thread of its own"
        assert 0 < len(hub.hub_threads()) <= hub.HUB_THREADS
        assert {t._transport().local_cipher for t in links} == {_first_cipher()}
        for i, t in enumerate(links):
            assert t.run(["echo", f"hello {i}"]).check(t.name).stdout == f"hello {i}\n"
        data = bytes(range(256)) * 1200  # 300 KiB: several SFTP writes and window adjusts
        for t in links:
            t.put_data(data, "/tmp/hub-copy.bin")
            assert t.file_size("/tmp/hub-copy.bin") == len(data)
            out = t.run(["sha256sum", "/tmp/hub-copy.bin"]).check(t.name).stdout
            assert out.split()[0] == hashlib.sha256(data).hexdigest()
        streams = [t.open_stream(["cat"]) for t in links]
        for n in range(50):  # interleaved round trips: one hub reads for all of them
            for k, s in enumerate(streams):
                line = f"{k}:{n}:".encode() + b"x" * 2000 + b"\n"
                assert _echo(s, line) == line
        # h3 dies mid-stream (every process in it killed: its kernel closes the connection);
        # its stream ends, the others go on.
        bed.exec(3, ["sh", "-c", "kill -KILL -1 || true"])
        ended = b"pending"
        while ended:
            try:
                ended = streams[2].recv(30.0) or b""
            except TransportError:
                ended = b""
        for s in streams[:2]:
            assert _echo(s, b"still here\n") == b"still here\n"
        # h2's link goes silent mid-stream: nothing arrives from it, the others go on.
        bed.link_down(2)
        streams[1].send(b"lost\n")
        assert _echo(streams[0], b"h1 unaffected\n") == b"h1 unaffected\n"
        bed.link_up(2)
        assert _echo(streams[1], b"back\n") == b"lost\nback\n"
        # h3 comes back: the link reconnects, served by the hubs again.
        bed.start_sshd(3)
        links[2].reconnect()
        assert links[2].run(["echo", "again"]).check("h3").stdout == "again\n"
        _hub_of(links[2])
        assert _paramiko_threads() == []
    finally:
        for t in links:
            t.close()


@pytest.mark.testbed
def test_rekeys_asked_by_either_side_of_the_traffic(testbed_factory: Any) -> None:
    """A new key exchange in the middle of a connection, read and answered by the hub: once
    after our writes passed the packetizer's limit, once after our reads did, while the command
    ends (its channel's close, answered during the exchange, waits for the new keys)."""
    bed: TestBed = testbed_factory(1)
    [link] = _links(bed, 1)
    try:
        transport = link._transport()
        transport.packetizer.REKEY_BYTES = 64 * 1024  # paramiko's is 512 MiB
        first = transport.H
        data = os.urandom(300_000)
        link.put_data(data, "/tmp/hub-rekey.bin")  # writes: past the limit, several times
        out = link.run(["sha256sum", "/tmp/hub-rekey.bin"]).check("h1").stdout
        assert out.split()[0] == hashlib.sha256(data).hexdigest()
        after_writes = transport.H
        _await_new_key(transport, first, "after the writes")
        stream = link.open_stream(["head", "-c", "300000", "/dev/zero"])
        got = 0
        while (part := stream.recv(30.0)) != b"":
            assert part is not None, "the stream stalled"
            got += len(part)
        assert got == 300_000
        _await_new_key(transport, after_writes, "after the reads")
        assert link.run(["echo", "keyed"]).check("h1").stdout == "keyed\n"
    finally:
        link.close()


def _await_new_key(transport: paramiko.Transport, old: bytes, when: str) -> None:
    """Wait (a generous bound, not a timing) for the exchange hash to change: a new key."""
    deadline = time.monotonic() + 30
    while transport.H == old:
        assert time.monotonic() < deadline, f"no new key exchange {when}"
        time.sleep(0.05)


class _StallingPeer:
    """A TCP peer that answers with an SSH banner, then sends three bytes of a packet and
    nothing more until told to hang up."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stalled = threading.Event()
        self.hang_up = threading.Event()
        self.raised: list[BaseException] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.sendall(b"SSH-2.0-Stalling_1.0\r\n")
            conn.recv(4096)  # the client's banner (and perhaps its key-exchange offer)
            conn.sendall(b"\x00\x00\x01")
            self.stalled.set()
            self.hang_up.wait(120)
        self.listener.close()


def _stalled_transport(peer: _StallingPeer) -> tuple[hub.HubTransport, threading.Thread]:
    """A connection to the peer whose handshake (``start_client``, as ``SSHClient.connect``
    calls it) runs in a thread of the test; what it raised goes to ``peer.raised``."""
    t = hub.HubTransport(socket.create_connection(("127.0.0.1", peer.port)))
    starting = threading.Thread(target=lambda: _handshake(t, peer.raised), daemon=True)
    starting.start()
    assert peer.stalled.wait(30)
    return t, starting


def _handshake(t: hub.HubTransport, raised: list[BaseException]) -> None:
    try:
        t.start_client(timeout=120)
    except (paramiko.SSHException, OSError, EOFError) as e:
        raised.append(e)


@pytest.mark.testbed
def test_a_peer_stopping_mid_message_holds_only_its_own_hub(testbed_factory: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    bed: TestBed = testbed_factory(1)
    links = _links(bed, hub.HUB_THREADS + 1)  # a link on every hub
    peer = _StallingPeer()
    try:
        monkeypatch.setattr(hub, "STALL_S", 600.0)
        t, starting = _stalled_transport(peer)
        while t._hub is None and starting.is_alive():
            starting.join(0.1)
        stuck = t._hub
        assert stuck is not None and t.active
        others = [link for link in links if _hub_of(link) is not stuck]
        assert others, "every link on the stalled peer's hub"
        for link in others:  # answered while that hub still waits on the rest of the message
            assert link.run(["echo", "free"]).check("h1").stdout == "free\n"
        assert t.active and starting.is_alive()
        peer.hang_up.set()  # the peer hangs up: that connection ends, and its hub is free again
        starting.join(60)
        assert not t.active and not starting.is_alive()
        for link in links:
            assert link.run(["echo", "all"]).check("h1").stdout == "all\n"
    finally:
        peer.hang_up.set()
        for link in links:
            link.close()


@pytest.mark.testbed
def test_a_peer_stalled_past_the_limit_loses_its_connection(testbed_factory: Any,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    bed: TestBed = testbed_factory(1)
    links = _links(bed, hub.HUB_THREADS)
    peer = _StallingPeer()
    try:
        monkeypatch.setattr(hub, "STALL_S", 2.0)
        t, starting = _stalled_transport(peer)
        starting.join(60)
        assert not t.active
        # what SSHClient.connect raises, and SSHTransport reports as the host unreachable
        assert len(peer.raised) == 1 and isinstance(peer.raised[0], ConnectionError), peer.raised
        assert "nothing more of a message for 2s" in str(peer.raised[0])
        for link in links:  # its hub serves the others again
            assert link.run(["echo", "on"]).check("h1").stdout == "on\n"
    finally:
        peer.hang_up.set()
        for link in links:
            link.close()


def _mode_now(monkeypatch: pytest.MonkeyPatch) -> hub.HubMode:
    monkeypatch.delenv(hub.MODE_ENV, raising=False)
    return hub.choose_mode()


def test_the_installed_paramiko_is_one_the_hub_was_checked_against(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pinned paramiko's loop and the functions the hub stands in for read as the source the
    hub's copy was checked against: the hub serves. When this fails after a paramiko update, read
    its functions (hub.MIRRORED) against the hub's copy before adding their fingerprints."""
    found = hub.installed_fingerprints()
    assert None not in found.values(), f"no source for {found}"
    assert any(c.fingerprints == found for c in hub.VERIFIED), (
        f"paramiko {paramiko.__version__}: {found}, not among the sources checked: {hub.VERIFIED}")
    assert hub.missing_internals() == []
    mode = _mode_now(monkeypatch)
    assert mode.served and not mode.warn and paramiko.__version__ in mode.why


def test_the_fingerprint_keeps_comments_and_layout_out_and_code_in() -> None:
    base = hub.fingerprint('def f(x):\n    """Doc."""\n    if x:\n        y(x,\n          1)  # why\n    z(f"{x!r}")\n')
    assert hub.fingerprint("def f(x):\n  # reworded\n  if x:\n    y(x, 1)\n  z(f\"{x!r}\")\n") == base
    assert hub.fingerprint('def f(x):\n    if x:\n        y(x, 2)\n    z(f"{x!r}")\n') != base
    assert hub.fingerprint('def f(x):\n    if x:\n        y(x, 1)\n        z(f"{x!r}")\n') != base
    assert hub.fingerprint('def f(x):\n    if x:\n        y(x, 1)\n    z(f"{x!s}")\n') != base
    # paramiko's own loop: a comment added keeps its fingerprint; without the strict key
    # exchange's check (what 3.4 added against Terrapin, CVE-2023-48795) it is another loop.
    run = inspect.getsource(paramiko.Transport.run)
    check = "self._enforce_strict_kex(ptype)"
    assert run.count(check) == 2
    assert hub.fingerprint(run.replace("while self.active:", "while self.active:  # the loop")) == \
        hub.fingerprint(run)
    assert hub.fingerprint(run.replace(check, "pass", 1)) != hub.fingerprint(run)


def test_a_missing_internal_or_a_changed_loop_turns_the_hub_off(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as m:
        m.delattr(paramiko.Transport, "_check_banner")
        mode = _mode_now(m)
        assert not mode.served and mode.warn and "lacks internals" in mode.why
        assert "Transport._check_banner" in mode.why
    assert _mode_now(monkeypatch).served
    known = hub.VERIFIED[0].fingerprints
    monkeypatch.setattr(hub, "VERIFIED", (hub.Checked(("9.9.9",), {**known, "Transport.run": "0" * 16}),))
    mode = _mode_now(monkeypatch)
    assert not mode.served and mode.warn
    assert "Transport.run differ" in mode.why and "9.9.9" in mode.why and "read_all" not in mode.why
    monkeypatch.setattr(hub, "VERIFIED", (hub.Checked(("9.9.9",), known),))
    monkeypatch.setenv(hub.MODE_ENV, "threads")
    assert hub.choose_mode() == hub.HubMode(False, "RIGDECK_HUB=threads", False)
    monkeypatch.setenv(hub.MODE_ENV, "thread")  # a typo: said, and the check decides
    mode = hub.choose_mode()
    assert mode.served and mode.warn and "RIGDECK_HUB='thread' is not" in mode.why


def _first_cipher() -> str:
    """What our side should pick against sshd: AES-GCM where paramiko has it, else its first."""
    a, b = socket.socketpair()
    try:
        offered = paramiko.Transport(a).get_security_options().ciphers
    finally:
        a.close()
        b.close()
    return next((c for c in _AeadFirst.AEAD if c in offered), offered[0])


@pytest.mark.testbed
def test_a_paramiko_the_hub_was_not_checked_against_gets_its_own_threads(
        testbed_factory: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A paramiko whose loop reads otherwise than the one the hub copied: every connection runs
    on paramiko's own thread, said once, and works as on the hub (exec, SFTP, streams, a host
    lost and reconnected); closed, its threads end."""
    bed: TestBed = testbed_factory(2)
    known = hub.VERIFIED[0].fingerprints
    monkeypatch.setattr(hub, "VERIFIED", (hub.Checked(("9.9.9",), {**known, "Transport.run": "0" * 16}),))
    monkeypatch.delenv(hub.MODE_ENV, raising=False)
    monkeypatch.setattr(hub, "_mode", None)  # decided again, at the next connection
    caplog.set_level(logging.INFO, logger=hub.__name__)
    before = set(_paramiko_threads())
    links = _links(bed, 3)
    transports = [link._transport() for link in links]
    try:
        said = [r for r in caplog.records if r.name == hub.__name__]
        assert len(said) == 1 and said[0].levelno == logging.WARNING, [r.getMessage() for r in said]
        assert "paramiko's own thread" in said[0].getMessage() and "Transport.run" in said[0].getMessage()
        for t in transports:
            assert isinstance(t, hub.HubTransport) and not t.served and t._hub is None and t.is_alive()
            assert t.local_cipher == _first_cipher()
        assert set(_paramiko_threads()) - before == set(transports)
        data = os.urandom(200_000)
        for i, link in enumerate(links):
            assert link.run(["echo", f"own {i}"]).check(link.name).stdout == f"own {i}\n"
            link.put_data(data, f"/tmp/own-{i}.bin")
            out = link.run(["sha256sum", f"/tmp/own-{i}.bin"]).check(link.name).stdout
            assert out.split()[0] == hashlib.sha256(data).hexdigest()
        streams = [link.open_stream(["cat"]) for link in links]
        for n in range(20):
            for k, s in enumerate(streams):
                line = f"{k}:{n}:".encode() + b"y" * 1000 + b"\n"
                assert _echo(s, line) == line
        bed.exec(2, ["sh", "-c", "kill -KILL -1 || true"])  # links[1]'s host: its stream ends
        while True:
            try:
                if not streams[1].recv(30.0):
                    break
            except TransportError:
                break
        assert _echo(streams[0], b"on\n") == b"on\n"
        bed.stop_sshd(2)  # reaps the killed sshd: start_sshd does nothing while it looks alive
        bed.start_sshd(2)
        links[1].reconnect()
        again = links[1]._transport()
        assert not again.served and again.is_alive() and again is not transports[1]
        assert links[1].run(["echo", "back"]).check("h2").stdout == "back\n"
        transports.append(again)
        assert len([r for r in caplog.records if r.name == hub.__name__]) == 1, "the mode said again"
    finally:
        for link in links:
            link.close()
    for t in transports:
        t.join(30)
        assert not t.is_alive(), "a closed connection's paramiko thread runs on"


@pytest.mark.testbed
def test_keepalives_go_out_from_the_hub_and_wait_for_no_writer(testbed_factory: Any) -> None:
    """The hub sends a connection's keepalives holding its write lock, taken only when free: a
    writer that holds it (one blocked on a host that stopped reading) holds up neither the hub
    nor the other connections it serves, and the keepalives go out again once it lets go."""
    bed: TestBed = testbed_factory(1)
    links = _links(bed, 2)
    while _hub_of(links[-1]) is not _hub_of(links[0]):  # two connections on one hub thread
        links += _links(bed, 1)
    first, other = links[0], links[-1]
    try:
        t = first._transport()
        packetizer = t.packetizer
        t.set_keepalive(1)

        def last() -> float:
            return float(packetizer._Packetizer__keepalive_last)

        sent = last()
        deadline = time.monotonic() + 10
        while last() == sent:
            assert time.monotonic() < deadline, "no keepalive went out from the hub"
            time.sleep(0.1)
        lock = packetizer._Packetizer__write_lock
        held, release = threading.Event(), threading.Event()

        def writer() -> None:
            with lock:
                held.set()
                release.wait(30)

        th = threading.Thread(target=writer)
        th.start()
        try:
            held.wait(5)
            before = last()
            for i in range(3):  # the hub serves the other connection meanwhile, past its ticks
                assert other.run(["echo", f"served {i}"]).check("h1").stdout == f"served {i}\n"
                time.sleep(0.8)
            assert last() == before, "a keepalive was sent while a writer held the connection"
        finally:
            release.set()
            th.join()
        deadline = time.monotonic() + 10
        while last() == before:
            assert time.monotonic() < deadline, "keepalives did not come back after the writer"
            time.sleep(0.1)
        assert first.run(["echo", "alive"]).check("h1").stdout == "alive\n"
    finally:
        for link in links:
            link.close()
