"""Live telemetry from every host: one reader thread per host feeding ``ClusterState``.

A reader connects, makes sure the current agent is deployed, attaches to the host's daemon,
subscribes, and folds every sample into the state. A host that goes quiet is marked stale after
``stale_after`` seconds and down after its timeout; its reader then reconnects with backoff on
its own. Readers never wait on each other.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from tui.control.controller import Controller, host_key_info
from tui.model.inventory import HostSpec
from tui.model.state import ClusterState, HostStatus
from tui.remote.agentclient import AgentClient
from tui.remote.agentlink import AgentLink, hello_timeout
from tui.remote.transport import (
    Backoff,
    Transport,
    TransportError,
    UnreachableError,
    make_transport,
)

log = logging.getLogger(__name__)


class Monitor:
    def __init__(
        self,
        controller: Controller,
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
        inv = controller.inventory
        self.state = ClusterState([(s.name, s.address) for s in inv.hosts])
        self._stop = threading.Event()
        self._kick: dict[str, threading.Event] = {s.name: threading.Event() for s in inv.hosts}
        self._threads: dict[str, threading.Thread] = {}
        self._transports: dict[str, Transport] = {}
        self.events_received = 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Monitor:
        for spec in self.controller.inventory.hosts:
            t = threading.Thread(target=self._run_host, args=(spec,), name=f"reader-{spec.name}", daemon=True)
            self._threads[spec.name] = t
            t.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for ev in self._kick.values():
            ev.set()
        deadline = time.monotonic() + timeout
        for t in self._threads.values():
            t.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def reconnect(self, host: str) -> None:
        """Drop the host's connection and connect again now (the app's 'reconnect' action)."""
        self._kick[host].set()

    def down_after(self, spec: HostSpec) -> float:
        return max(self.stale_after + 1.0, spec.connect_timeout)

    # -- one host ----------------------------------------------------------------------------

    def _on_event(self, host: str, msg: dict[str, Any]) -> None:
        self.events_received += 1
        if msg.get("event") == "telemetry" and isinstance(msg.get("data"), dict):
            self.state.apply_sample(host, msg["data"])

    def _run_host(self, spec: HostSpec) -> None:
        backoff = Backoff(initial=0.5, maximum=self.max_backoff)
        kick = self._kick[spec.name]
        while not self._stop.is_set():
            kick.clear()
            try:
                self._session(spec, kick, backoff)
            except TransportError as e:
                self.state.set_status(spec.name, HostStatus.DOWN, e.detail, kind=e.kind,
                                      host_key=host_key_info(e))
                log.info("%s: %s", spec.name, e)
            except Exception as e:  # a bug in one reader must not end it for good
                log.exception("%s: reader failed", spec.name)
                self.state.set_status(spec.name, HostStatus.DOWN, f"internal error: {e}")
            finally:
                t = self._transports.pop(spec.name, None)
                if t is not None:
                    t.close()
            if self._stop.is_set():
                break
            if not kick.is_set():
                kick.wait(backoff.next_delay())

    def _session(self, spec: HostSpec, kick: threading.Event, backoff: Backoff) -> None:
        ctl = self.controller
        # Its own connection: requests on the controller's never wait behind this stream.
        transport = make_transport(ctl.inventory, spec, accept_new=ctl.accept_new)
        self._transports[spec.name] = transport
        transport.connect()
        stream, pyz = ctl.open_agent_stream(spec, transport)  # pyz None: an attach-only host
        link = AgentLink(spec.name, stream, on_event=lambda m: self._on_event(spec.name, m))
        agent = AgentClient.over(link)
        try:
            hello = link.handshake(hello_timeout(spec.connect_timeout), client="rigdeck")
            upgrade = None
            if hello.get("agent_version") != ctl.bundle.version and pyz is not None:
                # An older daemon is running. It hands over now if idle, else when its jobs end.
                if agent.upgrade(path=pyz, timeout=spec.connect_timeout) == "now":
                    self.state.set_agent(spec.name, hello, upgrade_pending=ctl.bundle.version)
                    kick.set()  # reconnect at once, to the new daemon
                    return
                upgrade = ctl.bundle.version
            self.state.set_agent(spec.name, hello, upgrade_pending=upgrade)
            ctl.configure_agent(spec, agent)
            agent.subscribe(rate_hz=self.rate_hz, timeout=spec.connect_timeout)
            subscribed_at = time.monotonic()
            backoff.reset()
            down_after = self.down_after(spec)
            while not self._stop.is_set() and not kick.is_set():
                link.pump(0.2)
                h = self.state.get(spec.name)
                last = h.last_sample_at if h.last_sample_at and h.last_sample_at > subscribed_at else subscribed_at
                age = time.monotonic() - last
                if age > self.stale_after and h.status == HostStatus.UP:
                    self.state.set_status(spec.name, HostStatus.STALE, f"no telemetry for {age:.1f}s")
                if age > down_after:
                    raise UnreachableError(spec.name, f"no telemetry for {age:.0f}s (timeout {down_after:g}s)")
        finally:
            link.close()
