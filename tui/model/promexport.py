"""What the controller knows, as Prometheus' text exposition format (version 0.0.4).

Every metric family is declared once below (``FAMILIES``: its name, type, unit, labels and
meaning; docs/observability.md lists the same); ``cluster_exposition`` fills them from the
cluster's snapshot (``tui.model.views``), the jobs' views (``tui.model.jobview``) and the queue,
and ``Exposition`` writes the text: ``# HELP`` and ``# TYPE`` once per family, every series of a
family with the same label names (an unknown value is ``""``), label values escaped, no series
twice. Names and units follow Prometheus' conventions as node_exporter and dcgm-exporter use them:
base units (``_bytes``, ``_celsius``, ``_watts``, ``_hertz``, ``_seconds``, ``_ratio`` for a
0 to 1 fraction), counters ending in ``_total``.

A job is labelled ``job_id``, not ``job``: Prometheus gives every scraped series a ``job`` label
of its own (the scrape job's name) and renames a ``job`` the target sends to ``exported_job``.

No I/O here: the controller (``tui.control.service``) gathers the inputs, and its HTTP server
(``tui.control.metricsserver``) sends the text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from tui.model.health import HEALTH_STATES
from tui.model.jobstate import STATES, UNKNOWN
from tui.model.jobview import JobView
from tui.model.state import HostStatus
from tui.model.views import GpuView, HostView

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MIB = 1024 * 1024  # the agent's ``_mb`` figures are MiB (agent/telemetry.py)

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = ("gauge", "counter")
# A job's state set: every recorded state, and "unknown" (while hosts of a live job cannot be reached).
JOB_STATES = (*STATES, UNKNOWN)


@dataclass(frozen=True)
class Family:
    """One metric family: what ``# HELP`` and ``# TYPE`` say, and its label names (every series
    of it has exactly these). ``unit``: the base unit, for the docs ("" for a plain number)."""

    name: str
    type: str
    unit: str
    labels: tuple[str, ...]
    help: str

    def __post_init__(self) -> None:
        if not _NAME.fullmatch(self.name):
            raise ValueError(f"{self.name!r}: not a metric name")
        if self.type not in TYPES:
            raise ValueError(f"{self.name}: type {self.type!r}, expected one of {', '.join(TYPES)}")
        if (self.type == "counter") != self.name.endswith("_total"):
            raise ValueError(f"{self.name}: a counter's name ends in _total, and only a counter's")
        bad = [n for n in self.labels if not _LABEL.fullmatch(n) or n.startswith("__")]
        if bad or len(set(self.labels)) != len(self.labels):
            raise ValueError(f"{self.name}: label names {self.labels!r}")


# ---------------------------------------------------------------------------------------------
# The families

HOST = ("host",)
GPU = ("host", "gpu", "uuid", "job_id", "rank", "user", "simulated")
JOB = ("job_id", "name", "user")
HOST_STATUSES = tuple(s.value for s in HostStatus)

FAMILIES: tuple[Family, ...] = (
    # The controller and its hosts
    Family("rigdeck_hosts", "gauge", "", ("status",),
           "Inventory hosts by the controller's connection status (up, connecting, stale, down)."),
    Family("rigdeck_host_up", "gauge", "", HOST,
           "1 when the host's agent is connected and sending telemetry, else 0."),
    Family("rigdeck_host_sample_age_seconds", "gauge", "seconds", HOST,
           "Seconds since the host's last telemetry sample reached the controller."),
    Family("rigdeck_host_info", "gauge", "", ("host", "hostname", "agent_version", "gpu_source", "simulated"),
           "1 for every host, its agent's facts in the labels."),
    Family("rigdeck_host_cpu_utilization_ratio", "gauge", "ratio", HOST,
           "Share of the host's CPU time busy over the last sample interval (0 to 1)."),
    Family("rigdeck_host_load1", "gauge", "", HOST, "The host's 1-minute load average."),
    Family("rigdeck_host_load5", "gauge", "", HOST, "The host's 5-minute load average."),
    Family("rigdeck_host_load15", "gauge", "", HOST, "The host's 15-minute load average."),
    Family("rigdeck_host_memory_used_bytes", "gauge", "bytes", HOST, "Host memory in use (total less available)."),
    Family("rigdeck_host_memory_total_bytes", "gauge", "bytes", HOST, "Host memory in all."),
    Family("rigdeck_host_disk_read_bytes_per_second", "gauge", "bytes per second", HOST,
           "Bytes read from the host's disks per second over the last sample interval."),
    Family("rigdeck_host_disk_written_bytes_per_second", "gauge", "bytes per second", HOST,
           "Bytes written to the host's disks per second over the last sample interval."),
    Family("rigdeck_host_network_receive_bytes_per_second", "gauge", "bytes per second", HOST,
           "Bytes received by the host's network interfaces per second over the last sample interval."),
    Family("rigdeck_host_network_transmit_bytes_per_second", "gauge", "bytes per second", HOST,
           "Bytes sent by the host's network interfaces per second over the last sample interval."),
    Family("rigdeck_jobs_poll_age_seconds", "gauge", "seconds", (),
           "Seconds since the controller's job poller last looked at every live job."),
    # GPUs
    Family("rigdeck_gpu_info", "gauge", "", (*GPU, "model"), "1 for every GPU, its model in the labels."),
    Family("rigdeck_gpu_utilization_ratio", "gauge", "ratio", GPU,
           "Share of the last sample interval the GPU was running kernels (0 to 1)."),
    Family("rigdeck_gpu_memory_used_bytes", "gauge", "bytes", GPU, "GPU memory in use."),
    Family("rigdeck_gpu_memory_total_bytes", "gauge", "bytes", GPU, "GPU memory in all."),
    Family("rigdeck_gpu_temperature_celsius", "gauge", "celsius", GPU, "GPU temperature."),
    Family("rigdeck_gpu_power_watts", "gauge", "watts", GPU, "GPU power draw."),
    Family("rigdeck_gpu_power_limit_watts", "gauge", "watts", GPU, "GPU enforced power limit."),
    Family("rigdeck_gpu_sm_clock_hertz", "gauge", "hertz", GPU, "GPU SM clock."),
    Family("rigdeck_gpu_ecc_uncorrected_errors_total", "counter", "errors", GPU,
           "Uncorrected ECC errors since the driver loaded (NVML's volatile count; absent without ECC)."),
    Family("rigdeck_gpu_health", "gauge", "", (*GPU, "health"),
           "The GPU's health as a state set: 1 for its state (ok, warn, unhealthy, drained), 0 for the others."),
    Family("rigdeck_gpu_health_reason", "gauge", "", (*GPU, "reason"),
           "1 with why the GPU is not ok (the agent's judgement or the drain), only while it has a reason."),
    # Jobs
    Family("rigdeck_job_state", "gauge", "", (*JOB, "state"),
           "The job's state as a state set: 1 for its state, 0 for every other job state."),
    Family("rigdeck_job_step", "gauge", "", JOB, "The newest training step the job's ranks reported."),
    Family("rigdeck_job_loss", "gauge", "", JOB,
           "The loss the job's ranks reported at its newest step, as rigdeck status shows it."),
    Family("rigdeck_job_steps_per_second", "gauge", "steps per second", JOB, "The job's recent step rate."),
    Family("rigdeck_job_goodput_ratio", "gauge", "ratio", JOB,
           "Time in steps that count over wall time since the job first started (0 to 1)."),
    Family("rigdeck_job_restarts_total", "counter", "restarts", JOB, "Gang restarts of the job."),
    Family("rigdeck_job_incidents_total", "counter", "incidents", JOB,
           "Faults rigdeck found in the job and acted on (an unhealthy GPU, a hang, a NaN loss, a lost host, "
           "a drain --now)."),
    Family("rigdeck_job_ranks", "gauge", "", JOB, "Ranks the job's placement has."),
    Family("rigdeck_job_ranks_running", "gauge", "", JOB, "The job's ranks running now."),
    Family("rigdeck_job_start_time_seconds", "gauge", "seconds", JOB,
           "When the job's current attempt started, seconds since the Unix epoch."),
    # The queue
    Family("rigdeck_queue_jobs", "gauge", "", ("priority",), "Jobs waiting in the queue, by priority."),
    Family("rigdeck_queue_oldest_wait_seconds", "gauge", "seconds", ("priority",),
           "How long the longest-waiting job of each priority has waited."),
)

_BY_NAME = {f.name: f for f in FAMILIES}
if len(_BY_NAME) != len(FAMILIES):
    raise ValueError("a metric family declared twice")


def family(name: str) -> Family:
    return _BY_NAME[name]


# ---------------------------------------------------------------------------------------------
# The text format


def escape_label(value: str) -> str:
    """A label value as the format writes it between quotes: ``\\``, ``"`` and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text: str) -> str:
    """``# HELP`` text: ``\\`` and newline escaped (quotes stay as they are)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(v: float) -> str:
    """A sample value: integers without a point, floats as Python's shortest repr, NaN and the
    infinities as the format spells them."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


class Exposition:
    """The series of one scrape, family by family, written as text by ``text``."""

    def __init__(self) -> None:
        self._series: dict[str, dict[tuple[str, ...], float]] = {}

    def add(self, name: str, labels: Mapping[str, object], value: float | None) -> None:
        """One series of the family ``name``; ``labels`` must name exactly its label names (None
        is ""). A None value adds nothing: an unknown figure is no series, not a zero."""
        if value is None:
            return
        fam = _BY_NAME[name]
        if set(labels) != set(fam.labels):
            raise ValueError(f"{name}: labels {sorted(labels)}, expected {sorted(fam.labels)}")
        key = tuple("" if labels[n] is None else str(labels[n]) for n in fam.labels)
        series = self._series.setdefault(name, {})
        if key in series:
            raise ValueError(f"{name}: the series {dict(zip(fam.labels, key, strict=True))} twice")
        series[key] = value

    def series(self, name: str) -> dict[tuple[str, ...], float]:
        """The family's series so far: label values (in its label order) -> value."""
        return dict(self._series.get(name, {}))

    def text(self) -> str:
        """The exposition: the families in declaration order, each with its HELP and TYPE, those
        with no series left out."""
        out: list[str] = []
        for fam in FAMILIES:
            series = self._series.get(fam.name)
            if not series:
                continue
            out.append(f"# HELP {fam.name} {escape_help(fam.help)}")
            out.append(f"# TYPE {fam.name} {fam.type}")
            for key, value in series.items():
                if fam.labels:
                    pairs = ",".join(f'{n}="{escape_label(v)}"' for n, v in zip(fam.labels, key, strict=True))
                    out.append(f"{fam.name}{{{pairs}}} {format_value(value)}")
                else:
                    out.append(f"{fam.name} {format_value(value)}")
        return "\n".join(out) + "\n" if out else ""


# ---------------------------------------------------------------------------------------------
# From what the controller knows


class Queued(Protocol):
    """A waiting job as the queue lists it (``tui.control.queue.QueueEntry``)."""

    @property
    def priority(self) -> int: ...

    @property
    def queued_at(self) -> float: ...


def _bool(v: bool) -> str:
    return "true" if v else "false"


def _scaled(v: float | None, factor: float) -> float | None:
    return None if v is None else v * factor


def _ratio(pct: float | None) -> float | None:
    """A percentage as a ratio (divided, not multiplied by 0.01: 17.1 reads 0.171, not 0.17100000000000001)."""
    return None if pct is None else pct / 100


def gpu_owner(g: GpuView) -> tuple[str, str, str]:
    """(job_id, rank, user) of whoever holds the GPU: its first process that is a job's rank,
    else its claim (a job's, between ranks), else its first process's user (someone outside
    rigdeck); "" for what is not known."""
    rank_proc = next((p for p in g.processes if p.job_id), None)
    if rank_proc is not None:
        rank = "" if rank_proc.rank is None else str(rank_proc.rank)
        user = rank_proc.user or (g.claim.user if g.claim else None) or ""
        return rank_proc.job_id or "", rank, user
    if g.claim is not None and (g.claim.job_id or g.claim.user):
        return g.claim.job_id or "", "", g.claim.user or ""
    foreign = next((p.user for p in g.processes if p.user), None)
    return "", "", foreign or ""


def _job_users(hosts: Sequence[HostView]) -> dict[str, str]:
    """job_id -> the user its ranks run as, from the GPUs' processes and claims."""
    users: dict[str, str] = {}
    for h in hosts:
        for g in h.gpus or ():
            job, _rank, user = gpu_owner(g)
            if job and user:
                users.setdefault(job, user)
    return users


def _add_host(e: Exposition, h: HostView, monotonic: float) -> None:
    one = {"host": h.name}
    e.add("rigdeck_host_up", one, 1 if h.up else 0)
    if h.sampled_at is not None:
        e.add("rigdeck_host_sample_age_seconds", one, max(0.0, monotonic - h.sampled_at))
    e.add("rigdeck_host_info", {"host": h.name, "hostname": h.hostname, "agent_version": h.agent_version,
                                "gpu_source": h.gpu_source, "simulated": _bool(h.any_simulated)}, 1)
    s = h.host_sample
    if s is None or not h.up:
        return  # a stale or down host's last figures are not now's
    e.add("rigdeck_host_cpu_utilization_ratio", one, _ratio(s.cpu_pct))
    for n, name in enumerate(("rigdeck_host_load1", "rigdeck_host_load5", "rigdeck_host_load15")):
        e.add(name, one, s.load[n] if n < len(s.load) else None)
    e.add("rigdeck_host_memory_used_bytes", one, _scaled(s.mem_used_mb, MIB))
    e.add("rigdeck_host_memory_total_bytes", one, _scaled(s.mem_total_mb, MIB))
    e.add("rigdeck_host_disk_read_bytes_per_second", one, s.disk_read_bps)
    e.add("rigdeck_host_disk_written_bytes_per_second", one, s.disk_write_bps)
    e.add("rigdeck_host_network_receive_bytes_per_second", one, s.net_rx_bps)
    e.add("rigdeck_host_network_transmit_bytes_per_second", one, s.net_tx_bps)


def _add_gpu(e: Exposition, g: GpuView) -> None:
    job, rank, user = gpu_owner(g)
    labels = {"host": g.host, "gpu": g.index, "uuid": g.uuid, "job_id": job, "rank": rank, "user": user,
              "simulated": _bool(g.simulated)}
    e.add("rigdeck_gpu_info", {**labels, "model": g.name}, 1)
    for state in HEALTH_STATES:
        e.add("rigdeck_gpu_health", {**labels, "health": state}, 1 if g.health == state else 0)
    if g.health_reason:
        e.add("rigdeck_gpu_health_reason", {**labels, "reason": g.health_reason}, 1)
    if g.stale:
        return  # its host is stale or down: the figures are the last good ones, not now's
    e.add("rigdeck_gpu_utilization_ratio", labels, _ratio(g.utilization_pct))
    e.add("rigdeck_gpu_memory_used_bytes", labels, _scaled(g.memory_used_mb, MIB))
    e.add("rigdeck_gpu_memory_total_bytes", labels, _scaled(g.memory_total_mb, MIB))
    e.add("rigdeck_gpu_temperature_celsius", labels, g.temperature_c)
    e.add("rigdeck_gpu_power_watts", labels, g.power_w)
    e.add("rigdeck_gpu_power_limit_watts", labels, g.power_limit_w)
    e.add("rigdeck_gpu_sm_clock_hertz", labels, _scaled(g.sm_clock_mhz, 1_000_000))
    e.add("rigdeck_gpu_ecc_uncorrected_errors_total", labels, g.ecc_volatile_errors)


def _add_job(e: Exposition, v: JobView, user: str) -> None:
    labels = {"job_id": v.job_id, "name": v.name, "user": user}
    states = JOB_STATES if v.state in JOB_STATES else (*JOB_STATES, v.state)
    for state in states:
        e.add("rigdeck_job_state", {**labels, "state": state}, 1 if v.state == state else 0)
    row = v.row
    e.add("rigdeck_job_step", labels, row.step)
    e.add("rigdeck_job_loss", labels, row.loss)
    e.add("rigdeck_job_steps_per_second", labels, row.step_rate)
    e.add("rigdeck_job_goodput_ratio", labels, v.goodput.ratio if v.goodput is not None else None)
    e.add("rigdeck_job_restarts_total", labels, v.restarts)
    e.add("rigdeck_job_incidents_total", labels, len(v.incidents))
    e.add("rigdeck_job_ranks", labels, row.ranks_total)
    e.add("rigdeck_job_ranks_running", labels, row.ranks_running)
    e.add("rigdeck_job_start_time_seconds", labels, v.started)


def _add_queue(e: Exposition, queue: Iterable[Queued], now: float) -> None:
    by_priority: dict[int, list[float]] = {}
    for q in queue:
        by_priority.setdefault(int(q.priority), []).append(float(q.queued_at))
    for prio, since in sorted(by_priority.items()):
        one = {"priority": prio}
        e.add("rigdeck_queue_jobs", one, len(since))
        e.add("rigdeck_queue_oldest_wait_seconds", one, max(0.0, now - min(since)))


def cluster_exposition(
    hosts: Sequence[HostView],
    jobs: Sequence[JobView],
    queue: Iterable[Queued] = (),
    *,
    now: float,
    monotonic: float,
    host_users: Mapping[str, str] | None = None,
    jobs_polled_at: float | None = None,
) -> Exposition:
    """The series of everything the controller knows now.

    ``hosts``: a snapshot with GPUs (``ClusterState.snapshot()``); ``jobs``: the jobs' views;
    ``queue``: the waiting jobs; ``now``: the wall clock (job and queue times are on it);
    ``monotonic``: the clock the samples' arrival is on; ``host_users``: each inventory host's
    SSH user, the user of a job none of whose processes is seen on a GPU (a CPU-only or ended
    job's ranks ran as it on its first host); ``jobs_polled_at``: the job poller's last round.
    """
    e = Exposition()
    for status in HOST_STATUSES:
        e.add("rigdeck_hosts", {"status": status}, sum(1 for h in hosts if h.status == status))
    for h in hosts:
        _add_host(e, h, monotonic)
        for g in h.gpus or ():
            _add_gpu(e, g)
    users = _job_users(hosts)
    for v in jobs:
        first = next((n.get("host") for n in v.placement if n.get("host")), None)
        user = users.get(v.job_id) or (host_users or {}).get(str(first)) or ""
        _add_job(e, v, user)
    _add_queue(e, queue, now)
    if jobs_polled_at is not None:
        e.add("rigdeck_jobs_poll_age_seconds", {}, max(0.0, now - jobs_polled_at))
    return e
