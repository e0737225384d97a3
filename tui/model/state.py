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

HISTORY = 60  # samples kept per GPU for sparklines
BUSY_UTIL_PCT = 5.0  # a GPU with no processes counts as busy from this utilization up


def gpu_busy(g: Mapping[str, Any]) -> bool:
    """A GPU sample is busy when processes hold it or it is loaded."""
    return bool(g.get("processes") or g.get("claim")) or (g.get("utilization_pct") or 0.0) >= BUSY_UTIL_PCT


def host_gpus_busy(h: Mapping[str, Any]) -> int:
    """Busy GPUs of a host's snapshot dict (counted when the snapshot was made, if it was)."""
    n = h.get("gpus_busy")
    return n if n is not None else sum(1 for g in h.get("gpus") or () if gpu_busy(g))


def host_gpu_count(h: Mapping[str, Any]) -> int:
    n = h.get("gpu_count")
    return n if n is not None else len(h.get("gpus") or ())


def host_gpus_simulated(h: Mapping[str, Any]) -> bool:
    if "gpus_simulated" in h:
        return bool(h["gpus_simulated"])
    return any(g.get("simulated") for g in h.get("gpus") or ())


def host_gpu_model(h: Mapping[str, Any]) -> str | None:
    if "gpu_model" in h:
        return h["gpu_model"]
    gpus = h.get("gpus") or ()
    return gpus[0].get("name") if gpus else None


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
    sample: dict[str, Any]
    history: deque[float] = field(default_factory=lambda: deque(maxlen=HISTORY))

    def to_json(self, stale: bool) -> dict[str, Any]:
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
    # What snapshots are made of, kept between them: the GPUs' dicts are built when a sample
    # arrives (on the reader's thread, not the UI's), the host's when anything else changes.
    # Readers get them shared and must not change them.
    _gpus_json: list[dict[str, Any]] | None = field(default=None, repr=False)
    _json: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def stale(self) -> bool:
        return self.status in (HostStatus.STALE, HostStatus.DOWN)

    def changed(self, gpus: bool = False) -> None:
        """Forget the cached dicts (``gpus``: the GPUs' too, as when the stale flag flips)."""
        self._json = None
        if gpus:
            self._gpus_json = None

    def to_json(self, gpus: bool = True) -> dict[str, Any]:
        """The host as a dict; without ``gpus`` its GPUs are only counted (``gpu_count``,
        ``gpus_busy``, ``gpus_simulated``, ``gpu_model``), not listed."""
        base = self._json
        if base is None:
            base = self._json = self._build_json()
        age = None if self.last_sample_at is None else time.monotonic() - self.last_sample_at
        out = {**base, "sample_age_s": age}
        if not gpus:
            del out["gpus"]
        return out

    def gpu_json(self, pos: int) -> dict[str, Any] | None:
        """The dict of the GPU at ``pos`` (index order), as the next snapshot would have it."""
        gpus = self._gpus_list()
        return gpus[pos] if 0 <= pos < len(gpus) else None

    def _gpus_list(self) -> list[dict[str, Any]]:
        """The GPUs' dicts in index order, built when missing."""
        if self._gpus_json is None:
            stale = self.stale
            self._gpus_json = [g.to_json(stale) for _, g in sorted(self.gpus.items())]
        return self._gpus_json

    def _build_json(self) -> dict[str, Any]:
        gpus = self._gpus_list()
        return {
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
            "gpus": gpus,
            "gpu_count": len(gpus),
            "gpus_busy": sum(1 for g in gpus if gpu_busy(g)),
            "gpus_simulated": any(g.get("simulated") for g in gpus),
            "gpu_model": gpus[0].get("name") if gpus else None,
        }


class Snapshot(list):  # type: list[dict[str, Any]]
    """Every host's dict, in inventory order, and ``layout``: a number that changes whenever any
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
                gs.sample = g
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
            h._json = h._build_json()  # here, on the reader's thread
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
        """Every host's dict; ``gpus=False`` leaves the GPU lists out (their counts stay).

        The dicts are shared with later snapshots: read them, never change them. A reader that
        keeps a snapshot keeps its samples alive, and is the one that frees them when it drops
        it: the app keeps hosts only, and reads the GPUs it shows with ``gpu``.
        """
        with self._lock:
            snap = Snapshot(h.to_json(gpus) for h in self.hosts.values())
            snap.layout = self.layout
            return snap

    def gpu(self, host: str, pos: int) -> dict[str, Any] | None:
        """A host's GPU at ``pos`` (index order) now, or None."""
        with self._lock:
            h = self.hosts.get(host)
            return None if h is None else h.gpu_json(pos)

    def get(self, host: str) -> HostState:
        return self.hosts[host]

    def gpu_count(self) -> int:
        with self._lock:
            return sum(len(h.gpus) for h in self.hosts.values())
