"""Live signals (tui/model/diagnose.py) from synthetic metrics records, and the [scaling] table."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.distributed import scaled_lr as runtime_scaled_lr
from tui.model.diagnose import Signal, StepTimes, scaled_lr, signals, signals_from_records
from tui.model.jobspec import JobSpec, JobSpecError, jobspec_from_toml


def records(hosts: list[str], steps: int, step_time: Any, **extra: Any) -> list[dict[str, Any]]:
    """One record per rank per step; ``step_time(rank, step)`` and each extra ``f(rank, step)``."""
    out = []
    for step in range(steps):
        for rank, host in enumerate(hosts):
            r = {"time": 1000.0 + step, "rank": rank, "host": host, "step": step, "loss": 1.0}
            if step:
                r["step_time"] = step_time(rank, step)
                for k, f in extra.items():
                    r[k] = f(rank, step)
            out.append(r)
    return out


HOSTS = ["h1", "h2", "h3"]


def test_a_slow_rank_is_a_straggler_named_by_host_and_rank() -> None:
    found = signals_from_records(records(HOSTS, 10, lambda r, s: 0.5 if r == 2 else 0.2 + 0.01 * (s % 2)))
    (sig,) = found
    assert (sig.kind, sig.verdict, sig.host, sig.rank) == ("straggler", "bad", "h3", 2)
    assert "rank 2 on h3" in sig.summary and "2.4x" in sig.summary
    assert sig.to_json() == {"kind": "straggler", "verdict": "bad", "host": "h3", "rank": 2,
                             "summary": sig.summary, "advice": sig.advice}
    assert Signal.from_json(sig.to_json()).to_json() == sig.to_json()


def test_straggler_margin_and_jitter() -> None:
    assert signals_from_records(records(HOSTS, 10, lambda r, s: 0.25 if r == 2 else 0.2)) == ()  # 1.25x
    warn = signals_from_records(records(HOSTS, 10, lambda r, s: 0.3 if r == 2 else 0.2))
    assert [(s.kind, s.verdict, s.rank) for s in warn] == [("straggler", "warn", 2)]
    # 2x, but a millisecond apart: jitter
    assert signals_from_records(records(HOSTS, 10, lambda r, s: 0.002 if r == 0 else 0.001)) == ()
    # one rank alone, or too few steps: nothing to compare
    assert signals_from_records(records(["h1"], 10, lambda r, s: 5.0)) == ()
    assert signals_from_records(records(HOSTS, 3, lambda r, s: 0.9 if r == 1 else 0.1)) == ()


def test_synchronous_ranks_the_busy_time_finds_the_straggler_not_comm_bound() -> None:
    # All-reduce makes every step 0.5 s; ranks 0 and 1 wait 0.3 s in it for rank 2.
    comm = lambda r, s: 0.02 if r == 2 else 0.32  # noqa: E731
    found = signals_from_records(records(HOSTS, 12, lambda r, s: 0.5, comm_time=comm))
    assert [(s.kind, s.rank, s.host) for s in found] == [("straggler", 2, "h3")]


def test_only_the_recent_window_counts() -> None:
    # rank 1 was slow at the start, fine for the last 20 steps
    recs = records(HOSTS, 40, lambda r, s: 1.0 if (r == 1 and s < 20) else 0.2)
    assert signals_from_records(recs) == ()
    times = StepTimes()
    times.add(recs[:30])
    assert [s.rank for s in signals(times)] == [1]


def test_input_bound_with_share_gpu_utilization_and_read_throughput() -> None:
    recs = records(HOSTS, 10, lambda r, s: 0.4, data_time=lambda r, s: 0.3 if r == 1 else 0.01)
    (sig,) = signals_from_records(recs, read_bps={"h2": 250e6})
    assert (sig.kind, sig.verdict, sig.host, sig.rank) == ("input_bound", "bad", "h2", None)
    assert "75% of step time waiting for data" in sig.summary and "its disks reading 250 MB/s now" in sig.summary
    assert "GPU utilization unknown" in sig.summary and sig.read_bps == 250e6
    low = signals_from_records(recs, gpu_util={"h2": 15.0})
    assert "GPU utilization 15%" in low[0].summary and "read rate unknown" in low[0].summary
    # busy GPUs: waiting for data is not what holds it back
    assert signals_from_records(recs, gpu_util={"h2": 95.0}) == ()
    # a small share is fine
    assert signals_from_records(records(HOSTS, 10, lambda r, s: 0.4, data_time=lambda r, s: 0.05)) == ()
    mid = signals_from_records(records(HOSTS, 10, lambda r, s: 0.4, data_time=lambda r, s: 0.16))
    assert {(s.kind, s.verdict) for s in mid} == {("input_bound", "warn")} and len(mid) == 3


def test_comm_bound_takes_the_least_share_of_any_rank() -> None:
    recs = records(HOSTS, 10, lambda r, s: 0.4, comm_time=lambda r, s: 0.24 + 0.01 * r)
    (sig,) = signals_from_records(recs)
    assert (sig.kind, sig.verdict, sig.host, sig.rank) == ("comm_bound", "bad", None, None)
    assert "60% of step time in all-reduce" in sig.summary and "bucket_cap_mb" in sig.advice
    assert signals_from_records(records(HOSTS, 10, lambda r, s: 0.4, comm_time=lambda r, s: 0.05)) == ()
    # a rank that does not measure it: no verdict
    part = records(HOSTS, 10, lambda r, s: 0.4, comm_time=lambda r, s: 0.3)
    for r in part:
        if r["rank"] == 0:
            r.pop("comm_time", None)
    assert signals_from_records(part) == ()


SCALING = {"reference_world_size": 8, "base_lr": 0.1, "warmup_steps": 100}


def test_lr_scaling_shows_the_scaled_rate_and_checks_a_reported_one() -> None:
    assert signals_from_records([], spec={"scaling": SCALING}, world=8) == ()
    assert signals_from_records([], spec={}, world=4) == ()
    (sig,) = signals_from_records([], spec={"scaling": SCALING}, world=4)
    assert (sig.kind, sig.verdict) == ("lr_scaling", "ok")
    assert "learning rate 0.05 (0.1 x 4/8)" in sig.summary and "100 steps" in sig.summary
    good = [{"rank": 0, "step": 50, "lr": runtime_scaled_lr(0.1, 8, 4, 50, 100)}]
    (sig,) = signals_from_records(good, spec={"scaling": SCALING}, world=4)
    assert sig.verdict == "ok" and "agrees" in sig.summary
    (sig,) = signals_from_records([{"rank": 0, "step": 500, "lr": 0.1}], spec={"scaling": SCALING}, world=4)
    assert sig.verdict == "warn" and "expected 0.05" in sig.summary


@pytest.mark.parametrize("step", [0, 1, 37, 99, 100, 1000])
@pytest.mark.parametrize("world", [1, 4, 16])
def test_scaled_lr_is_the_runtime_rule(step: int, world: int) -> None:
    assert scaled_lr(0.1, 8, world, step, 100) == pytest.approx(runtime_scaled_lr(0.1, 8, world, step, 100))


def test_worst_first() -> None:
    recs = records(HOSTS, 10, lambda r, s: 0.3 if r == 2 else 0.2, data_time=lambda r, s: 0.19 if r == 0 else 0.0)
    found = signals_from_records(recs, spec={"scaling": SCALING}, world=3)
    assert [(s.kind, s.verdict) for s in found] == [("input_bound", "bad"), ("straggler", "warn"), ("lr_scaling", "ok")]


SPEC = 'name = "j"\ncommand = ["x"]\n'


def test_scaling_table_parses_and_round_trips() -> None:
    spec = jobspec_from_toml(SPEC + "[scaling]\nreference_world_size = 8\nbase_lr = 0.1\nwarmup_steps = 500\n")
    assert spec.scaling is not None and spec.scaling.to_dict() == {"reference_world_size": 8, "base_lr": 0.1,
                                                                   "warmup_steps": 500}
    assert JobSpec.from_dict(spec.to_dict()) == spec
    assert jobspec_from_toml(SPEC).scaling is None


@pytest.mark.parametrize("table, field, expected", [
    ("reference_world_size = 0\nbase_lr = 0.1", "scaling.reference_world_size", "an integer >= 1"),
    ("reference_world_size = 8\nbase_lr = -1", "scaling.base_lr", "a number > 0"),
    ("reference_world_size = 8\nbase_lr = 0.1\nwarmup_steps = 1.5", "scaling.warmup_steps", "an integer >= 0"),
    ("base_lr = 0.1", "scaling.reference_world_size", "required in [scaling]"),
    ("reference_world_size = 8", "scaling.base_lr", "required in [scaling]"),
    ("reference_world_size = 8\nbase_lr = 0.1\nbase_batch = 3", "scaling.base_batch", ""),
])
def test_scaling_errors_name_the_field(table: str, field: str, expected: str) -> None:
    with pytest.raises(JobSpecError) as e:
        jobspec_from_toml(SPEC + "[scaling]\n" + table + "\n", "/tmp/x/job.toml")
    assert e.value.field == field and expected in e.value.expected and "/tmp/x/job.toml" in str(e.value)


def test_median_without_one_matches_the_plain_median() -> None:
    import random
    import statistics

    from tui.model.diagnose import _median_without

    rng = random.Random(7)
    for n in range(2, 40):
        values = [rng.choice([0.1, 0.2, 0.3, rng.random()]) for _ in range(n)]
        ordered = sorted(values)
        for i, v in enumerate(values):
            assert _median_without(ordered, v) == pytest.approx(statistics.median(values[:i] + values[i + 1:]))


def test_hundreds_of_ranks_one_straggler() -> None:
    hosts = [f"h{i // 8}" for i in range(512)]
    (sig,) = signals_from_records(records(hosts, 6, lambda r, s: 0.4 if r == 300 else 0.2 + 0.001 * (r % 5)))
    assert (sig.rank, sig.host) == (300, "h37")
