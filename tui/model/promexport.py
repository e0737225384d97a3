"""What the controller knows, as Prometheus' text exposition format (version 0.0.4).

Every metric family is declared once: a GPU's in ``agent/promtext.py`` (the agent writes the
same series into its textfile for node_exporter, ``agent/textfile.py``), the others below;
``FAMILIES`` lists them all (docs/observability.md lists the same). ``cluster_exposition`` fills
them from the cluster's snapshot (``tui.model.hostviews``), the jobs' views (``tui.model.jobview``)
and the queue, and ``Exposition`` (``agent.promtext``'s, over ``FAMILIES``) writes the text:
``# HELP`` and ``# TYPE`` once per family, every series of a family with the same label names
(an unknown value is ``""``), label values escaped, no series twice. Names and units follow
Prometheus' conventions as node_exporter and dcgm-exporter use them: base units (``_bytes``,
``_celsius``, ``_watts``, ``_hertz``, ``_seconds``, ``_ratio`` for a 0 to 1 fraction), counters
ending in ``_total``.

A job is labelled ``job_id``, not ``job``: Prometheus gives every scraped series a ``job`` label
of its own (the scrape job's name) and renames a ``job`` the target sends to ``exported_job``.

No I/O here: the controller (``tui.control.service``) gathers the inputs, and its HTTP server
(``tui.control.metricsserver``) sends the text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from agent import promtext
from agent.promtext import (
    GPU,
    GPU_FAMILIES,
    MIB,
    TYPES,
    Family,
    add_gpu,
    bool_label,
    escape_help,
    escape_label,
    format_value,
    gpu_labels,
    ratio,
    scaled,
)
from tui.model.hostviews import GpuView, HostView
from tui.model.jobstate import STATES, UNKNOWN
from tui.model.jobview import JobView
from tui.model.state import HostStatus

__all__ = [
    "CONTENT_TYPE", "FAMILIES", "GPU", "JOB", "MIB", "TYPES", "Exposition", "Family", "cluster_exposition",
    "escape_help", "escape_label", "family", "format_value", "gpu_owner",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# A job's state set: every recorded state, and "unknown" (while hosts of a live job cannot be reached).
JOB_STATES = (*STATES, UNKNOWN)


# ---------------------------------------------------------------------------------------------
# The families

HOST = ("host",)
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
    # GPUs: agent/promtext.py
    *GPU_FAMILIES,
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


class Exposition(promtext.Exposition):
    """The series of one scrape of the controller, over ``FAMILIES``, written as text by ``text``."""

    def __init__(self) -> None:
        super().__init__(FAMILIES)


# ---------------------------------------------------------------------------------------------
# From what the controller knows


class Queued(Protocol):
    """A waiting job as the queue lists it (``tui.control.queue.QueueEntry``)."""

    @property
    def priority(self) -> int: ...

    @property
    def queued_at(self) -> float: ...


def gpu_owner(g: GpuView) -> tuple[str, str, str]:
    """(job_id, rank, user) of whoever holds the GPU, by ``agent.promtext.gpu_owner``'s rule (the
    one the hosts' textfiles follow too)."""
    claim = (g.claim.job_id, g.claim.user) if g.claim is not None else None
    return promtext.gpu_owner([(p.job_id, p.rank, p.user) for p in g.processes], claim)


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
                                "gpu_source": h.gpu_source, "simulated": bool_label(h.any_simulated)}, 1)
    s = h.host_sample
    if s is None or not h.up:
        return  # a stale or down host's last figures are not now's
    e.add("rigdeck_host_cpu_utilization_ratio", one, ratio(s.cpu_pct))
    for n, name in enumerate(("rigdeck_host_load1", "rigdeck_host_load5", "rigdeck_host_load15")):
        e.add(name, one, s.load[n] if n < len(s.load) else None)
    e.add("rigdeck_host_memory_used_bytes", one, scaled(s.mem_used_mb, MIB))
    e.add("rigdeck_host_memory_total_bytes", one, scaled(s.mem_total_mb, MIB))
    e.add("rigdeck_host_disk_read_bytes_per_second", one, s.disk_read_bps)
    e.add("rigdeck_host_disk_written_bytes_per_second", one, s.disk_write_bps)
    e.add("rigdeck_host_network_receive_bytes_per_second", one, s.net_rx_bps)
    e.add("rigdeck_host_network_transmit_bytes_per_second", one, s.net_tx_bps)


def _add_gpu(e: Exposition, g: GpuView) -> None:
    labels = gpu_labels(g.host, g.index, g.uuid, gpu_owner(g), g.simulated)
    # A stale or down host's figures are the last good ones, not now's: no measurements.
    add_gpu(e, labels, g.name, g.health, g.health_reason, None if g.stale else lambda key: getattr(g, key))


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
