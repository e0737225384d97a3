"""The controller's picture of the cluster: plain objects, folded from decoded agent events.

Readers (one thread per host) write here under one short lock; the app and the CLI read
snapshots. Nothing here does I/O or knows about Textual.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tui.model.hostviews import GpuProcess, GpuView, HostKey, HostSample, HostView, count_gpus

HISTORY = 60  # samples kept per GPU for sparklines


class HostStatus(str, Enum):
    CONNECTING = "connecting"
    UP = "up"
    STALE = "stale"
    DOWN = "down"


@dataclass
class GpuState:
    host: str
    index: int
    uuid: str
    name: str
    simulated: bool
    sample: dict[str, Any]  # the agent's, drains laid over it (the server sends it on as deltas)
    history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))
    raw: dict[str, Any] = field(default_factory=dict)  # the agent's, as it came
    # The processes of the last view, and the sample list they were made from: a GPU's
    # processes rarely change from one sample to the next, and their views are then reused.
    _procs_from: list[Any] | None = field(default=None, repr=False)
    _procs: tuple[GpuProcess, ...] = field(default=(), repr=False)

    def view(self, stale: bool) -> GpuView:
        """The GPU as the faces read it."""
        raw = self.sample.get("processes")
        if not raw:
            procs: tuple[GpuProcess, ...] = ()
        elif raw is self._procs_from or raw == self._procs_from:
            procs = self._procs
        else:
            procs = tuple(map(GpuProcess.from_sample, raw))
        self._procs_from, self._procs = raw, procs
        return GpuView.from_sample(
            self.host, self.index, self.uuid, self.name, self.sample, stale, self.history, procs
        )

    def to_json(self, stale: bool) -> dict[str, Any]:
        """The GPU as a plain dict: its last sample, its host, ``stale`` and ``history``."""
        return {**self.sample, "host": self.host, "stale": stale, "history": list(self.history)}


@dataclass
class HostState:
    name: str
    address: str
    status: HostStatus = HostStatus.CONNECTING
    reason: str | None = None
    # Why it is down, when a transport error said so: its kind ("unknown-host-key", ...) and,
    # for host key problems, {"type", "fingerprint"[, "expected"]} for the app's trust dialog.
    error_kind: str | None = None
    host_key: dict[str, str] | None = None
    agent_version: str | None = None
    agent_pid: int | None = None
    hostname: str | None = None
    upgrade_pending: str | None = None
    simulated: bool = False
    gpu_source: str | None = None
    host_sample: dict[str, Any] | None = None
    gpus: dict[int, GpuState] = field(default_factory=dict)
    last_sample_at: float | None = None  # monotonic, on the controller
    last_sample_time: float | None = None  # the agent's wall clock
    samples: int = 0
    status_since: float = field(default_factory=time.monotonic)
    # What snapshots are made of, kept between them: the GPUs' views are built when a sample
    # arrives (on the reader's thread, not the UI's), the host's when anything else changes.
    # They are immutable and shared by every reader.
    _gpu_views: tuple[GpuView, ...] | None = field(default=None, repr=False)
    _view: HostView | None = field(default=None, repr=False)  # with its GPUs
    _hosts_view: HostView | None = field(default=None, repr=False)  # without (counts only)
    _sample_view: HostSample | None = field(default=None, repr=False)
    _sample_from: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def stale(self) -> bool:
        return self.status in (HostStatus.STALE, HostStatus.DOWN)

    def changed(self, gpus: bool = False) -> None:
        """Forget the cached views (``gpus``: the GPUs' too, as when the stale flag flips)."""
        self._view = self._hosts_view = None
        if gpus:
            self._gpu_views = None

    def view(self, gpus: bool = True) -> HostView:
        """The host as the faces read it; without ``gpus`` its GPUs are only counted
        (``gpu_count``, ``gpus_busy``, ``gpus_unhealthy``, ...), not listed."""
        if self._view is None or self._hosts_view is None:
            self._build_views()
        view = self._view if gpus else self._hosts_view
        assert view is not None
        return view

    def gpu_view(self, pos: int) -> GpuView | None:
        """The GPU at ``pos`` (index order), as the next snapshot would have it."""
        gpus = self._gpus_views()
        return gpus[pos] if 0 <= pos < len(gpus) else None

    def _gpus_views(self) -> tuple[GpuView, ...]:
        """The GPUs' views in index order, built when missing."""
        if self._gpu_views is None:
            stale = self.stale
            self._gpu_views = tuple(g.view(stale) for _, g in sorted(self.gpus.items()))
        return self._gpu_views

    def _host_sample_view(self) -> HostSample | None:
        raw = self.host_sample
        if raw is not self._sample_from:
            self._sample_from, self._sample_view = raw, HostSample.from_sample(raw)
        return self._sample_view

    def _build_views(self) -> None:
        gpus = self._gpus_views()
        c = count_gpus(gpus)
        fields = (
            self.name,
            self.address,
            self.status.value,
            self.reason,
            self.error_kind,
            HostKey.from_info(self.host_key),
            self.agent_version,
            self.agent_pid,
            self.hostname,
            self.upgrade_pending,
            self.simulated,
            self.gpu_source,
            self.samples,
            self._host_sample_view(),
        )
        tail = (c.count, c.busy, c.simulated, c.model, c.unhealthy, c.drained, self.last_sample_at)
        self._view = HostView.make(*fields, gpus, *tail)
        self._hosts_view = HostView.make(*fields, None, *tail)

    def to_json(self, gpus: bool = True) -> dict[str, Any]:
        """The host as a plain dict (the same fields as its view, its GPUs as ``GpuState.to_json``
        makes them); without ``gpus`` its GPUs are only counted, not listed. Built on each call:
        for whatever needs dicts, not for the app."""
        stale = self.stale
        gpu_list = [g.to_json(stale) for _, g in sorted(self.gpus.items())]
        c = count_gpus(self._gpus_views())
        out = {
            "name": self.name,
            "address": self.address,
            "status": self.status.value,
            "reason": self.reason,
            "error_kind": self.error_kind,
            "host_key": self.host_key,
            "agent_version": self.agent_version,
            "agent_pid": self.agent_pid,
            "hostname": self.hostname,
            "upgrade_pending": self.upgrade_pending,
            "simulated": self.simulated,
            "gpu_source": self.gpu_source,
            "samples": self.samples,
            "host_sample": self.host_sample,
            "gpus": gpu_list,
            "gpu_count": len(gpu_list),
            "gpus_busy": c.busy,
            "gpus_simulated": c.simulated,
            "gpu_model": gpu_list[0].get("name") if gpu_list else None,
            "gpus_unhealthy": c.unhealthy,
            "gpus_drained": c.drained,
            "sample_age_s": None
            if self.last_sample_at is None
            else time.monotonic() - self.last_sample_at,
        }
        if not gpus:
            del out["gpus"]
        return out


class Snapshot(list):  # type: list[HostView]
    """Every host's view, in inventory order, and ``layout``: a number that changes whenever any
    host's set of GPUs does (same ``layout``, same GPUs at the same places)."""

    layout: int = 0


class ClusterState:
    """All hosts. ``version`` grows on every change, so readers can tell when to redraw;
    ``layout`` grows when a host's set of GPUs changes."""

    def __init__(self, hosts: list[tuple[str, str]]):
        self._lock = threading.Lock()
        self.hosts: dict[str, HostState] = {n: HostState(n, a) for n, a in hosts}
        self.version = 0
        self.layout = 0
        # (host, GPU or None for the whole host) -> why it is drained: laid over the samples, so
        # every face (and a server's attached ones) sees the GPU "drained" (tui.model.health).
        self.drains: dict[tuple[str, int | None], str] = {}

    def _drained(self, host: str, g: dict[str, Any]) -> dict[str, Any]:
        """The agent's GPU sample, or it as drained (an unhealthy one stays what it is)."""
        why = self.drains.get((host, g.get("index")), self.drains.get((host, None)))
        if why is None or g.get("health") == "unhealthy":
            return g
        return {**g, "health": "drained", "health_reason": why}

    def set_drains(self, drains: dict[tuple[str, int | None], str]) -> None:
        """The drains in force now; the GPUs they name read "drained" from here on."""
        with self._lock:
            if drains == self.drains:
                return
            touched = {h for h, _ in drains} | {h for h, _ in self.drains}
            self.drains = dict(drains)
            for name in touched:
                h = self.hosts.get(name)
                if h is None:
                    continue
                for gs in h.gpus.values():
                    gs.sample = self._drained(name, gs.raw)
                h.changed(gpus=True)
                h._build_views()
            self._changed()

    def _changed(self) -> None:
        self.version += 1

    def set_status(
        self,
        host: str,
        status: HostStatus,
        reason: str | None = None,
        *,
        kind: str | None = None,
        host_key: dict[str, str] | None = None,
    ) -> None:
        with self._lock:
            h = self.hosts[host]
            if (h.status, h.reason, h.error_kind, h.host_key) != (status, reason, kind, host_key):
                if h.status != status:
                    h.status_since = time.monotonic()
                was_stale = h.stale
                h.status = status
                h.changed(gpus=h.stale != was_stale)
                h.reason = reason
                h.error_kind = kind
                h.host_key = host_key
                self._changed()

    def set_agent(self, host: str, hello: dict[str, Any], upgrade_pending: str | None = None) -> None:
        with self._lock:
            h = self.hosts[host]
            h.agent_version = hello.get("agent_version")
            h.agent_pid = hello.get("pid")
            h.hostname = hello.get("hostname")
            h.upgrade_pending = upgrade_pending
            h.changed()
            self._changed()

    def apply_sample(self, host: str, data: dict[str, Any], received_at: float | None = None) -> None:
        """Fold one telemetry sample (agent/telemetry.py's dict) into the host's state."""
        now = time.monotonic() if received_at is None else received_at
        with self._lock:
            h = self.hosts[host]
            h.host_sample = data.get("host")
            h.simulated = bool(data.get("simulated"))
            h.gpu_source = data.get("gpu_source")
            h.last_sample_at = now
            h.last_sample_time = data.get("time")
            h.samples += 1
            seen = set()
            for g in data.get("gpus") or []:
                idx = int(g["index"])
                seen.add(idx)
                gs = h.gpus.get(idx)
                if gs is None or gs.uuid != g.get("uuid"):
                    self.layout += 1
                    gs = GpuState(host, idx, g.get("uuid", ""), g.get("name", ""), bool(g.get("simulated")), g)
                    h.gpus[idx] = gs
                gs.raw = g
                gs.sample = self._drained(host, g) if self.drains else g
                util = g.get("utilization_pct")
                gs.history.append(float(util) if util is not None else 0.0)
            for idx in list(h.gpus):
                if idx not in seen:
                    del h.gpus[idx]
                    self.layout += 1
            if h.status != HostStatus.UP:
                h.status = HostStatus.UP
                h.reason = None
                h.error_kind = None
                h.host_key = None
                h.status_since = now
            h.changed(gpus=True)
            h._build_views()  # here, on the reader's thread
            self._changed()

    def seed_history(self, host: str, histories: Mapping[int, list[float]]) -> None:
        """Replace GPUs' utilization history (a mirror of another controller's state starts
        with that controller's recent samples, not an empty sparkline)."""
        with self._lock:
            h = self.hosts[host]
            for idx, values in histories.items():
                g = h.gpus.get(int(idx))
                if g is not None:
                    g.history = deque((float(v) for v in values), maxlen=HISTORY)
            h.changed(gpus=True)
            self._changed()

    def mark_stale(self, stale_after: float, now: float | None = None) -> list[str]:
        """Hosts that were up but sent nothing for ``stale_after`` seconds become stale."""
        now = time.monotonic() if now is None else now
        changed = []
        with self._lock:
            for h in self.hosts.values():
                if (
                    h.status == HostStatus.UP
                    and h.last_sample_at is not None
                    and now - h.last_sample_at > stale_after
                ):
                    h.status = HostStatus.STALE
                    h.reason = f"no telemetry for {now - h.last_sample_at:.1f}s"
                    h.status_since = now
                    h.changed(gpus=True)
                    changed.append(h.name)
            if changed:
                self._changed()
        return changed

    def snapshot(self, gpus: bool = True) -> Snapshot:
        """Every host's view; ``gpus=False`` leaves the GPU lists out (``gpus`` is None; their
        counts stay).

        The views are shared with later snapshots (they are immutable). A reader that keeps a
        snapshot keeps its samples alive, and is the one that frees them when it drops it: the
        app keeps hosts only, and reads the GPUs it shows with ``gpu``.
        """
        with self._lock:
            snap = Snapshot(h.view(gpus) for h in self.hosts.values())
            snap.layout = self.layout
            return snap

    def gpu(self, host: str, pos: int) -> GpuView | None:
        """A host's GPU at ``pos`` (index order) now, or None."""
        with self._lock:
            h = self.hosts.get(host)
            return None if h is None else h.gpu_view(pos)

    def to_json(self, gpus: bool = True) -> list[dict[str, Any]]:
        """Every host as a plain dict (``HostState.to_json``), in inventory order: for what
        needs dicts (JSON output, contracts), never for a view that refreshes."""
        with self._lock:
            return [h.to_json(gpus) for h in self.hosts.values()]

    def get(self, host: str) -> HostState:
        return self.hosts[host]

    def gpu_count(self) -> int:
        with self._lock:
            return sum(len(h.gpus) for h in self.hosts.values())
