"""Live telemetry from every host into ``ClusterState``, on a fixed number of threads.

A host's session is made by one of ``SETUP_WORKERS`` setup threads: connect, make sure the
current agent is deployed, attach to the host's daemon, subscribe. From then on its stream is
read by the monitor's one reader thread, which folds each sample into the state, marks a host
that goes quiet stale after ``stale_after`` seconds and down after its timeout, and has it
connected again with backoff. No host waits on another: a setup that hangs holds one setup
thread, and reading never blocks.

The reader waits on one wake-up for every host: an SSH stream calls back when data arrives
(``Stream.notify``), which notes the host as readable and wakes the reader unless a wake-up is
already pending, so a reader busy with one host takes the others that arrived meanwhile in the
same round, without a descriptor, a write and a read per packet (paramiko's ``fileno`` pipe).
Streams without the hook (a local pipe) are waited on with a selector, as is the wake-up.
The hosts gone quiet are looked for once per tick, not after every sample.

What stays per host is paramiko's: each SSH connection has its own transport thread (it reads
the socket, decrypts and hands the data on; bench/scale.py measures what it costs).
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tui.control.hostlinks import HostLinks, host_key_info
from tui.model.inventory import HostSpec
from tui.model.state import ClusterState, HostStatus
from tui.remote.agentclient import AgentClient
from tui.remote.agentlink import AgentLink
from tui.remote.transport import (
    Backoff,
    Transport,
    TransportError,
    UnreachableError,
    make_transport,
)

log = logging.getLogger(__name__)

SETUP_WORKERS = 8  # sessions being made at once (connect, deploy check, hello, subscribe)
TICK_S = 0.2  # how often the reader looks for hosts gone quiet and sessions due
# While samples keep arriving the reader takes them in rounds this far apart, in sample periods
# (at most TICK_S): every stream that called back meanwhile in one wake-up, not one each.
# Samples wait at most this long (200 ms at 1 Hz). What a round costs is mostly fixed (a wake-up,
# code and data gone cold since the last), so at 32 hosts a round per sample cost nearly twice
# the CPU per sample of five rounds a second (bench/scale.py measures it).
BATCH_PERIODS = 0.2


@dataclass
class _Live:
    """A subscribed host: its link, read by the reader thread."""

    spec: HostSpec
    link: AgentLink
    transport: Transport
    subscribed_at: float
    down_after: float
    fd: int | None = None  # registered with the reader's selector (a stream without ``notify``)


class Monitor:
    def __init__(
        self,
        controller: HostLinks,
        *,
        rate_hz: float = 1.0,
        stale_after: float | None = None,
        max_backoff: float = 5.0,
    ):
        self.controller = controller
        self.rate_hz = rate_hz
        # Two and a half missed samples (never under 2.5 s): quick, yet no flicker from jitter.
        self.stale_after = stale_after if stale_after is not None else max(2.5, 2.5 / rate_hz)
        self.max_backoff = max_backoff
        self.batch_s = min(TICK_S, BATCH_PERIODS / rate_hz) if rate_hz > 0 else TICK_S
        inv = controller.inventory
        self.state = ClusterState([(s.name, s.address) for s in inv.hosts])
        self._specs = {s.name: s for s in inv.hosts}
        self._stop = threading.Event()
        self._lock = threading.Lock()  # guards what the setup threads hand to the reader
        self._backoff = {s.name: Backoff(initial=0.5, maximum=max_backoff) for s in inv.hosts}
        self._due: dict[str, float] = {}  # host -> when its next session may start (reader's)
        self._setting_up: set[str] = set()
        self._ready: list[_Live] = []  # sessions made, not yet read
        self._retry: list[tuple[str, float]] = []  # setups that failed: when to try again
        self._closed = False
        self._kicked: set[str] = set()
        self._readable: list[str] = []  # hosts whose streams called back since the reader looked
        self._signalled = False  # a wake-up byte is in the pipe, not yet taken by the reader
        self._quiet_at = 0.0  # when the reader next looks for hosts gone quiet
        self._live: dict[str, _Live] = {}  # the reader's own
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._pool: ThreadPoolExecutor | None = None
        self._thread: threading.Thread | None = None
        self.events_received = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Monitor:
        n = len(self._specs)
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(SETUP_WORKERS, n)),
                                        thread_name_prefix="monitor-setup")
        now = time.monotonic()
        self._due = {name: now for name in self._specs}
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._run, name="monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reconnect(self, host: str) -> None:
        """Drop the host's connection and connect again now (the app's 'reconnect' action)."""
        with self._lock:
            self._kicked.add(host)
        self._wake()

    def down_after(self, spec: HostSpec) -> float:
        return max(self.stale_after + 1.0, spec.connect_timeout)

    def _wake(self) -> None:
        with self._lock:
            self._wake_locked()

    def _wake_locked(self) -> None:
        if self._closed or self._signalled:  # closed: its descriptors may be someone else's now
            return
        self._signalled = True
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:  # full: the reader wakes anyway
            pass

    def _readable_cb(self, name: str) -> Callable[[], None]:
        """What the host's stream calls when data arrives (on paramiko's thread)."""

        def readable() -> None:
            with self._lock:
                self._readable.append(name)
                self._wake_locked()

        return readable

    # -- the reader thread -------------------------------------------------------------------

    def _run(self) -> None:
        timeout = TICK_S
        try:
            while not self._stop.is_set():
                self._take_handed()
                self._start_due()
                for key, _ in self._sel.select(timeout):
                    if key.data is None:
                        os.read(self._wake_r, 4096)
                    else:
                        self._read(key.data)
                timeout = self.batch_s if self._read_notified() else TICK_S
                now = time.monotonic()
                if now >= self._quiet_at:
                    self._quiet_at = now + TICK_S
                    self._look_for_quiet()
        except Exception:  # a bug here must be seen, not end telemetry silently
            log.exception("monitor: reader failed")
            raise
        finally:
            self._close_all()

    def _take_handed(self) -> None:
        """Register the sessions the setup threads made; drop the hosts asked to reconnect."""
        with self._lock:
            ready, self._ready = self._ready, []
            kicked, self._kicked = self._kicked, set()
            retry, self._retry = self._retry, []
        for name, when in retry:
            self._setting_up.discard(name)
            self._due[name] = when
        for live in ready:
            name = live.spec.name
            self._setting_up.discard(name)
            self._live[name] = live
            # Not under the lock: the stream may call back at once (data already waiting).
            if not live.link.stream.notify(self._readable_cb(name)):
                live.fd = live.link.stream.fileno()
                self._sel.register(live.fd, selectors.EVENT_READ, name)
        for name in kicked:
            if name in self._live:
                self._drop(name, None)
            self._backoff[name].reset()
            self._due[name] = time.monotonic()

    def _start_due(self) -> None:
        now = time.monotonic()
        for name, when in list(self._due.items()):
            if when <= now and name not in self._live and name not in self._setting_up:
                del self._due[name]
                self._setting_up.add(name)
                assert self._pool is not None
                self._pool.submit(self._setup, self._specs[name])

    def _read_notified(self) -> int:
        """Read the hosts whose streams called back, each once however often it called;
        returns how many."""
        with self._lock:
            names, self._readable = self._readable, []
            # The wake-up byte is read (the select came first). After a round that read hosts,
            # the next is ``batch_s`` away: streams calling back until then wake no one. After an
            # empty one, the next callback wakes the reader at once.
            self._signalled = bool(names) and self.batch_s > 0
        for name in dict.fromkeys(names):
            self._read(name)
        return len(names)

    def _read(self, name: str) -> None:
        live = self._live.get(name)
        if live is None:
            return
        try:
            live.link.drain()
        except TransportError as e:
            self._drop(name, e)
        except Exception as e:  # a bug in one host's reading must not end the others'
            log.exception("%s: reading telemetry failed", name)
            self._drop(name, TransportError(name, f"internal error: {e}"))

    def _look_for_quiet(self) -> None:
        now = time.monotonic()
        for name, live in list(self._live.items()):
            h = self.state.get(name)
            last = h.last_sample_at if h.last_sample_at and h.last_sample_at > live.subscribed_at \
                else live.subscribed_at
            age = now - last
            if age > self.stale_after and h.status == HostStatus.UP:
                self.state.set_status(name, HostStatus.STALE, f"no telemetry for {age:.1f}s")
            if age > live.down_after:
                self._drop(name, UnreachableError(
                    name, f"no telemetry for {age:.0f}s (timeout {live.down_after:g}s)"))

    def _drop(self, name: str, e: TransportError | None) -> None:
        """Close the host's session; connect again after its backoff (at once when kicked)."""
        live = self._live.pop(name)
        if live.fd is not None:
            try:
                self._sel.unregister(live.fd)
            except (KeyError, ValueError, OSError):
                pass
        live.link.close()
        live.transport.close()
        if e is None:
            return
        self._down(name, e)
        self._due[name] = time.monotonic() + self._backoff[name].next_delay()

    def _down(self, name: str, e: TransportError) -> None:
        self.state.set_status(name, HostStatus.DOWN, e.detail, kind=e.kind, host_key=host_key_info(e))
        log.info("%s: %s", name, e)

    def _close_all(self) -> None:
        for name in list(self._live):
            self._drop(name, None)
        with self._lock:
            ready, self._ready = self._ready, []
            self._closed = True
        for live in ready:
            live.link.close()
            live.transport.close()
        self._sel.close()
        for fd in (self._wake_r, self._wake_w):
            os.close(fd)

    # -- a setup thread ----------------------------------------------------------------------

    def _setup(self, spec: HostSpec) -> None:
        """Make the host's session and hand it to the reader; on failure mark the host down and
        have the reader try again after its backoff."""
        transport: Transport | None = None
        retry: float | None = 0.0
        try:
            transport = make_transport(self.controller.inventory, spec, accept_new=self.controller.accept_new)
            live = self._session(spec, transport)
            if live is not None:
                with self._lock:
                    if not self._stop.is_set():
                        self._ready.append(live)
                        transport = None  # the reader's now
                        retry = None
        except TransportError as e:
            self._down(spec.name, e)
            retry = self._backoff[spec.name].next_delay()
        except Exception as e:  # a bug in one host's setup must not end it for good
            log.exception("%s: telemetry setup failed", spec.name)
            self.state.set_status(spec.name, HostStatus.DOWN, f"internal error: {e}")
            retry = self._backoff[spec.name].next_delay()
        finally:
            if transport is not None:
                transport.close()
            self._handed_back(spec.name, retry)

    def _handed_back(self, name: str, retry: float | None) -> None:
        """A setup ended: a session for the reader (``retry`` None), or the next try's delay."""
        if retry is not None:
            with self._lock:
                self._retry.append((name, time.monotonic() + retry))
        self._wake()

    def _session(self, spec: HostSpec, transport: Transport) -> _Live | None:
        """Connect, attach, hello, (upgrade), subscribe. None: ask again at once (the agent was
        upgraded and hands over to the new one)."""
        ctl = self.controller
        # Its own connection: requests on the controller's never wait behind this stream.
        transport.connect()
        # Straight to the daemon's socket when it runs (no Python started on the host for a
        # stream), else the attach, which starts it. pyz None: an attach-only host.
        link, pyz = ctl.agent_link(spec, transport)
        link.on_event = lambda m: self._on_event(spec.name, m)
        ok = False
        try:
            agent = AgentClient.over(link)
            hello = link.remote_hello or {}
            upgrade = None
            if hello.get("agent_version") != ctl.bundle.version and pyz is not None:
                # An older daemon is running. It hands over now if idle, else when its jobs end.
                if agent.upgrade(path=pyz, timeout=spec.connect_timeout) == "now":
                    self.state.set_agent(spec.name, hello, upgrade_pending=ctl.bundle.version)
                    return None  # connect again at once, to the new daemon
                upgrade = ctl.bundle.version
            self.state.set_agent(spec.name, hello, upgrade_pending=upgrade)
            ctl.configure_agent(spec, agent)
            agent.subscribe(rate_hz=self.rate_hz, timeout=spec.connect_timeout)
            self._backoff[spec.name].reset()
            ok = True
            return _Live(spec, link, transport, time.monotonic(), self.down_after(spec))
        finally:
            if not ok:
                link.close()

    def _on_event(self, host: str, msg: dict[str, Any]) -> None:
        self.events_received += 1
        if msg.get("event") == "telemetry" and isinstance(msg.get("data"), dict):
            self.state.apply_sample(host, msg["data"])
