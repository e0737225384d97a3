"""What the faces read about hosts and GPUs: frozen, typed views of the cluster state.

``ClusterState`` builds them where the telemetry arrives (on the reader's thread, once per
sample) and hands the same objects to every reader: they are immutable, so sharing them is
safe, and reading a field of a slots dataclass is cheaper than a dict lookup. The agent's
samples stay dicts (``agent/telemetry.py``'s wire format); the builders here are the one place
that reads them for the faces, so a key the agent renames breaks here, not in a widget.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tui.model.health import DRAINED, UNHEALTHY
from tui.model.slurm import agent_node_text

BUSY_UTIL_PCT = 5.0  # a GPU with no processes counts as busy from this utilization up


def _filler(cls: type) -> type:
    """A mutable twin of the frozen slots dataclass ``cls``: same slots, same order, so an
    instance filled through its plain ``__init__`` can become a ``cls`` (``obj.__class__ =
    cls``) and is then as frozen as one made by ``cls(...)``.

    The builders below use it because a frozen ``__init__`` stores each field with
    ``object.__setattr__``, four to five times the cost of a plain store, and views are built
    for every GPU of every sample on the telemetry readers' threads, which share the GIL with
    the UI. Positional, every field, in order."""
    fields = [(f.name, f.type) for f in dataclasses.fields(cls)]
    twin = dataclasses.make_dataclass(
        f"_{cls.__name__}Filler", fields, slots=True, eq=False, repr=False, match_args=False
    )
    if twin.__slots__ != cls.__slots__:  # type: ignore[attr-defined]
        raise TypeError(f"{cls.__name__}: the filler's slots differ")
    return twin


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process holding a GPU: a job's rank (``job_id``, ``rank``) or a foreign one."""

    pid: int | None
    user: str | None = None
    used_memory_mb: int | None = None
    job_id: str | None = None
    rank: int | None = None

    @staticmethod
    def from_sample(p: Mapping[str, Any]) -> GpuProcess:
        g = p.get
        v = _GpuProcessFiller(g("pid"), g("user"), g("used_memory_mb"), g("job_id"), g("rank"))
        v.__class__ = GpuProcess
        return v


_GpuProcessFiller = _filler(GpuProcess)


@dataclass(frozen=True, slots=True)
class GpuClaim:
    """Who holds a GPU's claim on its host (agent/claims.py), whether or not anything runs."""

    job_id: str | None = None
    user: str | None = None
    since: float | None = None
    # Who granted it: None for rigdeck's own claim (agent/claims.py), "slurm" for a GPU Slurm
    # allocated to a job of its own (agent/slurmnode.py; job_id is then Slurm's job id).
    scheduler: str | None = None

    @classmethod
    def from_sample(cls, c: Any) -> GpuClaim | None:
        if not isinstance(c, Mapping) or not c:
            return None
        scheduler = c.get("scheduler")
        return cls(c.get("job_id"), c.get("user"), c.get("since"),
                   str(scheduler) if scheduler else None)


@dataclass(frozen=True, slots=True)
class HostKey:
    """A host key a host presented that known_hosts does not accept: ``expected`` is set when
    known_hosts records another key for the host (it changed), unset when it records none."""

    fingerprint: str | None = None
    type: str | None = None
    expected: str | None = None
    name: str | None = None

    @property
    def changed(self) -> bool:
        return self.expected is not None

    @classmethod
    def from_info(cls, k: Mapping[str, Any] | None) -> HostKey | None:
        """From the controller's ``{"type", "fingerprint"[, "expected"], "name"}``."""
        if not k:
            return None
        return cls(k.get("fingerprint"), k.get("type"), k.get("expected"), k.get("name"))


@dataclass(frozen=True, slots=True)
class HostSample:
    """A host's own metrics from its last sample (any the agent left out are None)."""

    cpu_pct: float | None = None
    cpu_per_core: tuple[float, ...] = ()
    load: tuple[float, ...] = ()  # 1, 5 and 15 minute load averages
    mem_used_mb: int | None = None
    mem_total_mb: int | None = None
    swap_used_mb: int | None = None
    swap_total_mb: int | None = None
    disk_read_bps: float | None = None
    disk_write_bps: float | None = None
    net_rx_bps: float | None = None
    net_tx_bps: float | None = None
    # Why Slurm keeps its jobs off this host's node, as a line (its agent read the node drained
    # or down: agent/slurmnode.py); rigdeck's placement keeps off it too. None otherwise.
    slurm_unavailable: str | None = None

    @staticmethod
    def from_sample(s: Mapping[str, Any] | None) -> HostSample | None:
        if not s:
            return None
        g = s.get
        v = _HostSampleFiller(
            g("cpu_pct"),
            tuple(g("cpu_per_core") or ()),
            tuple(g("load") or ()),
            g("mem_used_mb"),
            g("mem_total_mb"),
            g("swap_used_mb"),
            g("swap_total_mb"),
            g("disk_read_bps"),
            g("disk_write_bps"),
            g("net_rx_bps"),
            g("net_tx_bps"),
            agent_node_text(g("slurm")) if g("slurm") else None,
        )
        v.__class__ = HostSample
        return v


_HostSampleFiller = _filler(HostSample)


_NO_PROCESSES: tuple[GpuProcess, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU as of its host's last sample. ``stale``: its host is stale or down (the values
    are the last good ones); ``history``: recent utilization, oldest first (the sparkline)."""

    host: str
    index: int
    uuid: str
    name: str
    simulated: bool
    utilization_pct: float | None
    memory_used_mb: int | None
    memory_total_mb: int | None
    temperature_c: float | None
    power_w: float | None
    power_limit_w: float | None
    sm_clock_mhz: int | None
    ecc_volatile_errors: int | None
    processes: tuple[GpuProcess, ...]
    claim: GpuClaim | None
    stale: bool
    history: tuple[float, ...]
    health: str = "ok"  # ok | warn | unhealthy (the agent's judgement), drained (the controller's)
    health_reason: str | None = None

    @property
    def busy(self) -> bool:
        """Processes hold it, its host claims it for a job, or it is loaded."""
        return bool(self.processes or self.claim) or (self.utilization_pct or 0.0) >= BUSY_UTIL_PCT

    @property
    def job_ids(self) -> list[str]:
        """The job of each of its processes that belongs to one (repeats kept)."""
        return [p.job_id for p in self.processes if p.job_id]

    @staticmethod
    def from_sample(
        host: str,
        index: int,
        uuid: str,
        name: str,
        s: Mapping[str, Any],
        stale: bool,
        history: Iterable[float],
        processes: tuple[GpuProcess, ...] | None = None,
    ) -> GpuView:
        """From the agent's GPU sample ``s`` (``processes``: already converted, when known)."""
        g = s.get
        if processes is None:
            procs = g("processes")
            processes = tuple(map(GpuProcess.from_sample, procs)) if procs else _NO_PROCESSES
        claim = g("claim")
        v = _GpuViewFiller(
            host,
            index,
            uuid,
            name,
            bool(g("simulated")),
            g("utilization_pct"),
            g("memory_used_mb"),
            g("memory_total_mb"),
            g("temperature_c"),
            g("power_w"),
            g("power_limit_w"),
            g("sm_clock_mhz"),
            g("ecc_volatile_errors"),
            processes,
            GpuClaim.from_sample(claim) if claim else None,
            stale,
            tuple(history),
            g("health") or "ok",
            g("health_reason"),
        )
        v.__class__ = GpuView
        return v


_GpuViewFiller = _filler(GpuView)


@dataclass(frozen=True, slots=True)
class HostView:
    """One host: its connection, its agent, its last sample and its GPUs.

    ``gpus`` lists the GPUs in index order, or is None in a hosts-only snapshot; the counts
    (``gpu_count``, ``gpus_busy``, ``gpus_simulated``, ``gpu_model``, ``gpus_unhealthy``,
    ``gpus_drained``) are there either way.
    ``status`` is a ``HostStatus`` value ("connecting", "up", "stale", "down").
    """

    name: str
    address: str
    status: str
    reason: str | None
    error_kind: str | None  # why it is down, when a transport error said so
    host_key: HostKey | None  # for host key problems: what the trust dialog shows
    agent_version: str | None
    agent_pid: int | None
    hostname: str | None
    upgrade_pending: str | None
    simulated: bool
    gpu_source: str | None
    samples: int
    host_sample: HostSample | None
    gpus: tuple[GpuView, ...] | None
    gpu_count: int
    gpus_busy: int
    gpus_simulated: bool
    gpu_model: str | None
    gpus_unhealthy: int  # its agent calls them unhealthy (tui.model.health)
    gpus_drained: int  # kept out of placement (rigdeck drain, or after a fault)
    sampled_at: float | None  # when the last sample arrived (monotonic, this process's clock)

    @property
    def up(self) -> bool:
        return self.status == "up"

    @property
    def sample_age_s(self) -> float | None:
        """Seconds since the last sample arrived (now), or None before the first."""
        return None if self.sampled_at is None else time.monotonic() - self.sampled_at

    @property
    def any_simulated(self) -> bool:
        """The host or any of its GPUs is simulated."""
        return self.simulated or self.gpus_simulated

    @staticmethod
    def make(*fields: Any) -> HostView:
        """``HostView(*fields)`` (every field, in order), built as the GPU views are."""
        v = _HostViewFiller(*fields)
        v.__class__ = HostView
        return v


_HostViewFiller = _filler(HostView)


@dataclass(frozen=True, slots=True)
class GpuCounts:
    """A host's GPUs counted: what a hosts-only snapshot keeps of them."""

    count: int
    busy: int
    simulated: bool  # any of them
    model: str | None  # the first one's
    unhealthy: int
    drained: int


def count_gpus(gpus: Sequence[GpuView]) -> GpuCounts:
    """A host's GPUs counted: busy, simulated, unhealthy, drained, and the first one's model."""
    busy = unhealthy = drained = 0
    simulated = False
    for g in gpus:
        if g.busy:
            busy += 1
        if g.simulated:
            simulated = True
        if g.health == UNHEALTHY:
            unhealthy += 1
        elif g.health == DRAINED:
            drained += 1
    return GpuCounts(len(gpus), busy, simulated, (gpus[0].name or None) if gpus else None, unhealthy, drained)
