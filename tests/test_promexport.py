"""tui.model.promexport: what the controller knows, in Prometheus' text format (0.0.4).

The exposition of the recorded cluster (tests/ui_fixtures.py) is read back by a strict reader of
the format written here from its specification (promtool and a real Prometheus read it in
tests/test_exporter.py): every line a HELP, a TYPE or a sample of the family declared just
above it, label values unescaped, no series twice.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

import pytest

from tests import h100data
from tests.kit.prom import Read, read
from tests.ui_fixtures import (
    FAILED_JOB,
    HAND_DRAIN,
    JOB,
    NOW,
    XID_REASON,
    RecordedJobs,
    cluster_state,
    gpu_sample,
    healing_jobs,
    healing_state,
    host_sample,
)
from tui.model.jobview import JobView
from tui.model.promexport import (
    FAMILIES,
    MIB,
    Exposition,
    Family,
    cluster_exposition,
    escape_label,
    family,
    format_value,
)
from tui.model.state import ClusterState


@dataclass(frozen=True)
class Waiting:
    """A queued job as the queue lists it (what the exposition reads of a QueueEntry)."""

    priority: int
    queued_at: float


def recorded_views(jobs: RecordedJobs) -> list[JobView]:
    views = [jobs.detail(row.job_id) for row in jobs.snapshot().rows]
    return [v for v in views if v is not None]


def exposition(state: ClusterState | None = None, jobs: RecordedJobs | None = None,
               monotonic: float = 35.0, **kw: Any) -> Read:
    state = state if state is not None else cluster_state()
    views = recorded_views(jobs if jobs is not None else RecordedJobs())
    text = cluster_exposition(state.snapshot(), views, now=NOW, monotonic=monotonic,
                              host_users={"h1": "root", "h2": "root", "h3": "root"}, **kw).text()
    return read(text)


# -- the format --------------------------------------------------------------------------------


def test_label_values_and_help_are_escaped_as_the_format_says() -> None:
    assert escape_label('a\\b"c\nd') == 'a\\\\b\\"c\\nd'
    jobs = RecordedJobs()
    track = jobs._tracks[JOB]
    weird = 'we"ird\\name\nsecond line'
    track.rec = {**track.rec, "name": weird}
    e = cluster_exposition(cluster_state().snapshot(), recorded_views(jobs), now=NOW, monotonic=35.0)
    text = e.text()
    assert 'name="we\\"ird\\\\name\\nsecond line"' in text
    r = read(text)  # one line per sample: the newline in the name did not split it
    assert r.value("rigdeck_job_restarts_total", job_id=JOB, name=weird) == 0


def test_values_are_written_as_the_format_reads_them() -> None:
    assert format_value(3) == "3" and format_value(True) == "1"
    assert format_value(2.0) == "2" and format_value(0.25) == "0.25"
    assert format_value(float("nan")) == "NaN"
    assert format_value(float("inf")) == "+Inf" and format_value(float("-inf")) == "-Inf"
    assert float(format_value(1e300)) == 1e300


def test_every_family_has_its_help_and_type_once_and_one_label_set() -> None:
    r = exposition(healing_state(), healing_jobs(), queue=[Waiting(0, NOW - 30)], jobs_polled_at=NOW - 1)
    assert set(r.types) == {f.name for f in FAMILIES}, "the recorded cluster has a series of every family"
    for (name, labels), _ in r.samples.items():
        fam = family(name)
        assert r.types[name] == fam.type and r.helps[name] == fam.help
        assert tuple(n for n, _ in labels) == fam.labels, name


def test_a_family_is_declared_by_the_conventions() -> None:
    with pytest.raises(ValueError, match="_total"):
        Family("rigdeck_job_restarts", "counter", "", ("job_id",), "x")
    with pytest.raises(ValueError, match="_total"):
        Family("rigdeck_things_total", "gauge", "", (), "x")
    with pytest.raises(ValueError, match="label names"):
        Family("rigdeck_x", "gauge", "", ("host", "host"), "x")
    with pytest.raises(ValueError, match="not a metric name"):
        Family("rigdeck-x", "gauge", "", (), "x")
    for f in FAMILIES:
        assert f.name.startswith("rigdeck_")
        assert not re.search(r"_(mb|mib|mhz|pct|percent|ms|kb)(_|$)", f.name), f"not a base unit: {f.name}"


def test_a_series_twice_or_with_other_labels_is_refused() -> None:
    e = Exposition()
    e.add("rigdeck_host_up", {"host": "h1"}, 1)
    with pytest.raises(ValueError, match="twice"):
        e.add("rigdeck_host_up", {"host": "h1"}, 0)
    with pytest.raises(ValueError, match="expected"):
        e.add("rigdeck_host_up", {"host": "h1", "gpu": "0"}, 1)
    e.add("rigdeck_host_load1", {"host": "h1"}, None)  # unknown: no series, not a zero
    assert "rigdeck_host_load1" not in e.text() and e.series("rigdeck_host_up") == {("h1",): 1}


# -- GPUs --------------------------------------------------------------------------------------


def test_gpu_series_are_in_base_units_labelled_with_their_job_rank_and_user() -> None:
    r = exposition()
    # h1 GPU 0: JOB's rank 0; h2 GPU 3: bob's own process, no job.
    g0 = gpu_sample(1, 0, 29, JOB, 0)
    ddp = {"host": "h1", "gpu": "0", "uuid": "SIM-00000001-0", "job_id": JOB, "rank": "0", "user": "root",
           "simulated": "true"}
    assert r.value("rigdeck_gpu_utilization_ratio", **ddp) == pytest.approx(g0["utilization_pct"] / 100)
    assert r.value("rigdeck_gpu_memory_used_bytes", **ddp) == g0["memory_used_mb"] * MIB
    assert r.value("rigdeck_gpu_memory_total_bytes", **ddp) == 81920 * 1024 * 1024
    assert r.value("rigdeck_gpu_temperature_celsius", **ddp) == g0["temperature_c"]
    assert r.value("rigdeck_gpu_power_watts", **ddp) == g0["power_w"]
    assert r.value("rigdeck_gpu_power_limit_watts", **ddp) == 700
    assert r.value("rigdeck_gpu_sm_clock_hertz", **ddp) == 1980e6
    assert r.value("rigdeck_gpu_ecc_uncorrected_errors_total", **ddp) == 0
    assert r.value("rigdeck_gpu_info", **ddp, model="Simulated GPU") == 1
    bob = r.series("rigdeck_gpu_utilization_ratio")
    assert {"host": "h2", "gpu": "3", "uuid": "SIM-00000002-3", "job_id": "", "rank": "", "user": "bob",
            "simulated": "true"} in bob
    idle = [s for s in bob if s["host"] == "h1" and s["gpu"] == "3"]
    assert idle == [{**ddp, "gpu": "3", "uuid": "SIM-00000001-3", "job_id": "", "rank": "", "user": ""}]
    # Ranks 0..3 of JOB, each on one GPU.
    ranks = sorted(s["rank"] for s in r.series("rigdeck_gpu_info") if s["job_id"] == JOB)
    assert ranks == ["0", "1", "2", "3"]


def test_a_gpu_that_is_real_says_so_too() -> None:
    """The sample rigdeck's NVML collector took of a real H100 under load (tests/data/gpu-h100)."""
    state = ClusterState([("g1", "10.0.0.1")])
    recorded = h100data.samples("nvml")[0]
    state.apply_sample("g1", recorded, received_at=30.0)
    r = exposition(state)
    labels = {"host": "g1", "gpu": "0", "uuid": h100data.UUID, "simulated": "false"}
    assert r.value("rigdeck_gpu_info", **labels, model="NVIDIA H100 80GB HBM3") == 1
    assert r.value("rigdeck_gpu_memory_used_bytes", **labels) == 7342 * 2**20
    assert r.value("rigdeck_gpu_ecc_uncorrected_errors_total", **labels) == 0
    assert r.value("rigdeck_host_info", host="g1", simulated="false") == 1
    # a card without ECC (NVML: not supported) has no ECC series at all
    no_ecc = {**recorded, "gpus": [{**recorded["gpus"][0], "ecc_volatile_errors": None}]}
    state.apply_sample("g1", no_ecc, received_at=31.0)
    assert exposition(state).series("rigdeck_gpu_ecc_uncorrected_errors_total") == []


def test_a_gpu_between_a_jobs_attempts_is_labelled_from_its_claim() -> None:
    state = ClusterState([("h1", "10.0.0.1")])
    claimed = {**gpu_sample(1, 0, 0), "claim": {"job_id": "j9", "user": "ann", "since": 1.0}}
    state.apply_sample("h1", host_sample(1, 0, [claimed, gpu_sample(1, 1, 0)]), received_at=30.0)
    r = exposition(state)
    owners = {s["gpu"]: (s["job_id"], s["rank"], s["user"]) for s in r.series("rigdeck_gpu_info")}
    assert owners == {"0": ("j9", "", "ann"), "1": ("", "", "")}


def test_gpu_health_is_a_state_set_with_its_reason() -> None:
    r = exposition(healing_state(), healing_jobs())
    health = {(s["host"], s["gpu"], s["health"]): r.value("rigdeck_gpu_health", **s)
              for s in r.series("rigdeck_gpu_health")}
    assert len(health) == 12 * 4
    states = {(h, g): [st for (hh, gg, st), v in health.items() if (hh, gg) == (h, g) and v == 1]
              for h, g, _ in health}
    assert all(len(s) == 1 for s in states.values()), "exactly one state of each GPU is 1"
    assert states[("h1", "1")] == ["unhealthy"]  # drained too, but the fault is what it reads
    assert states[("h2", "2")] == ["drained"] and states[("h1", "0")] == ["ok"]
    reasons = {(s["host"], s["gpu"]): s["reason"] for s in r.series("rigdeck_gpu_health_reason")}
    assert reasons == {("h1", "1"): XID_REASON, ("h2", "2"): HAND_DRAIN}


# -- hosts and the controller ------------------------------------------------------------------


def test_hosts_up_and_sample_age_and_a_down_host() -> None:
    r = exposition(monotonic=31.5)  # the last samples arrived at 29 (ui_fixtures' ticks)
    assert r.value("rigdeck_hosts", status="up") == 2 and r.value("rigdeck_hosts", status="down") == 1
    assert r.value("rigdeck_host_up", host="h1") == 1 and r.value("rigdeck_host_up", host="h3") == 0
    assert r.value("rigdeck_host_sample_age_seconds", host="h2") == 2.5
    assert {"host": "h3"} not in r.series("rigdeck_host_sample_age_seconds")  # it never sent one
    assert r.value("rigdeck_host_memory_total_bytes", host="h1") == 64000 * MIB
    assert r.value("rigdeck_host_cpu_utilization_ratio", host="h1") == pytest.approx((8.0 + 21.0 * 2 + 1) / 100)
    assert r.value("rigdeck_host_load15", host="h2") == 1
    assert r.value("rigdeck_host_info", host="h1", hostname="tb1-h1", agent_version="3f9c2a71d04b8e15") == 1


def test_a_stale_hosts_gpus_keep_identity_and_health_but_no_figures() -> None:
    state = cluster_state()
    assert state.mark_stale(5.0, now=40.0) == ["h1", "h2"]
    r = exposition(state, monotonic=40.0)
    assert r.value("rigdeck_host_up", host="h1") == 0 and r.value("rigdeck_hosts", status="stale") == 2
    assert r.value("rigdeck_host_sample_age_seconds", host="h1") == 11
    assert r.series("rigdeck_gpu_utilization_ratio") == [] and r.series("rigdeck_host_load1") == []
    assert len(r.series("rigdeck_gpu_info")) == 8 and len(r.series("rigdeck_gpu_health")) == 32


def test_queue_depth_and_oldest_wait_by_priority() -> None:
    queue = [Waiting(0, NOW - 30), Waiting(5, NOW - 7), Waiting(0, NOW - 90)]
    r = exposition(queue=queue, jobs_polled_at=NOW - 0.5)
    assert r.value("rigdeck_queue_jobs", priority="0") == 2 and r.value("rigdeck_queue_jobs", priority="5") == 1
    assert r.value("rigdeck_queue_oldest_wait_seconds", priority="0") == 90
    assert r.value("rigdeck_queue_oldest_wait_seconds", priority="5") == 7
    assert r.value("rigdeck_jobs_poll_age_seconds") == 0.5
    assert exposition().series("rigdeck_queue_jobs") == []  # nothing waits: no series


# -- jobs --------------------------------------------------------------------------------------


def test_a_jobs_series_say_its_state_progress_goodput_restarts_and_incidents() -> None:
    jobs = healing_jobs()
    r = exposition(healing_state(), jobs)
    ddp = {"job_id": JOB, "name": "ddp", "user": "root"}
    view = jobs.detail(JOB)
    assert view is not None and view.goodput is not None
    assert r.value("rigdeck_job_state", **ddp, state="running") == 1
    assert sum(r.value("rigdeck_job_state", **ddp, state=s["state"]) for s in r.series("rigdeck_job_state")
               if s["job_id"] == JOB) == 1
    assert r.value("rigdeck_job_step", **ddp) == view.row.step
    assert r.value("rigdeck_job_loss", **ddp) == view.row.loss
    assert r.value("rigdeck_job_steps_per_second", **ddp) == pytest.approx(view.row.step_rate)
    assert r.value("rigdeck_job_goodput_ratio", **ddp) == pytest.approx(view.goodput.ratio)
    assert 0 < r.value("rigdeck_job_goodput_ratio", **ddp) < 1
    assert r.value("rigdeck_job_restarts_total", **ddp) == 1
    assert r.value("rigdeck_job_incidents_total", **ddp) == 1
    assert r.value("rigdeck_job_ranks", **ddp) == 4 and r.value("rigdeck_job_ranks_running", **ddp) == 4
    assert r.value("rigdeck_job_start_time_seconds", **ddp) == view.started
    fragile = {"job_id": FAILED_JOB, "name": "fragile", "user": "root"}  # ended: its user from its host
    assert r.value("rigdeck_job_state", **fragile, state="failed") == 1
    assert r.value("rigdeck_job_ranks_running", **fragile) == 0
    assert {"job_id": FAILED_JOB, "name": "fragile", "user": "root"} not in r.series("rigdeck_job_goodput_ratio")


def test_a_nan_loss_and_a_job_of_unknown_state_are_written_as_such() -> None:
    jobs = RecordedJobs()
    views = recorded_views(jobs)
    nan = replace(views[0], last_loss=math.nan, state="unknown", unreachable=("h2",))
    text = cluster_exposition(cluster_state().snapshot(), [nan], now=NOW, monotonic=35.0).text()
    r = read(text)
    assert f'rigdeck_job_loss{{job_id="{JOB}",name="ddp",user="root"}} NaN' in text
    assert r.value("rigdeck_job_state", job_id=JOB, state="unknown") == 1
    assert r.value("rigdeck_job_state", job_id=JOB, state="running") == 0


# -- the docs ----------------------------------------------------------------------------------


def _doc_row(f: Family) -> str:
    """The row docs/observability.md has for ``f`` (*GPU* and *job* stand for those label sets)."""
    from tui.model.promexport import GPU, JOB

    if f.labels[:len(GPU)] == GPU:
        labels = "*GPU*" + "".join(f", `{n}`" for n in f.labels[len(GPU):])
    elif f.labels[:len(JOB)] == JOB:
        labels = "*job*" + "".join(f", `{n}`" for n in f.labels[len(JOB):])
    else:
        labels = ", ".join(f"`{n}`" for n in f.labels) or "none"
    return f"| `{f.name}` | {f.type} | {f.unit or '-'} | {labels} | {f.help} |"


def test_every_metric_is_documented_as_it_is_declared() -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "docs" / "observability.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `rigdeck_")]
    assert rows == [_doc_row(f) for f in FAMILIES]
