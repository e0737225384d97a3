"""A pipeline-parallel job's stages (tui.model.stages): mp_plan and mp_stage records folded into
the StagesView the Job view and `rigdeck status` show, kept in the job history, and carried to a
server's faces (tui.model.wire)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tui.control.history import History
from tui.control.jobwatch import JobWatch, _Track
from tui.control.server import encode_detail
from tui.model import wire
from tui.model.jobview import JobDetail
from tui.model.stages import (
    StageRow,
    StagesFold,
    StagesView,
    clean_plan,
    plan_from_events,
    stages_from_records,
)


def plan(**over: Any) -> dict[str, Any]:
    """A plan as docs/contracts.md's mp_plan event carries it: 6 blocks, the heavy one (2) alone."""
    p = {
        "version": 1, "optimize": "speed", "schedule": "simple", "microbatches": 4, "partitions": 3,
        "blocks": 6, "cuts": [2, 3], "source": "profiled",
        "stages": [
            {"stage": 0, "blocks": [0, 2], "time_s": 0.020, "memory_bytes": 3_000_000, "send_bytes": 65536},
            {"stage": 1, "blocks": [2, 3], "time_s": 0.040, "memory_bytes": 9_000_000, "send_bytes": 65536},
            {"stage": 2, "blocks": [3, 6], "time_s": 0.030, "memory_bytes": 4_000_000, "send_bytes": 0},
        ],
        "bubble": 2 / 6,
        "equal_split": {"cuts": [2, 4], "max_time_s": 0.055, "max_memory_bytes": 12_000_000},
    }
    p.update(over)
    return p


def stage(rank: int, step: int, step_time: float, busy: float, peak: int) -> dict[str, Any]:
    return {"time": 1700000000.0 + step, "rank": rank, "host": f"h{rank + 1}", "event": "mp_stage",
            "stage": rank, "step": step, "step_time_s": step_time, "busy_s": busy, "peak_bytes": peak}


RECORDS = [
    {"time": 1700000000.0, "rank": 0, "host": "h1", "event": "mp_plan", "plan": plan()},
    {"time": 1700000001.0, "rank": 0, "host": "h1", "step": 1, "loss": 2.0},
    stage(0, 5, 0.50, 0.10, 3_500_000), stage(1, 5, 0.50, 0.30, 9_500_000), stage(2, 5, 0.50, 0.20, 4_200_000),
    stage(0, 10, 0.40, 0.12, 3_600_000),  # the newest of stage 0 wins
]


def test_records_fold_into_the_plan_and_each_stages_latest_measurement() -> None:
    fold = StagesFold()
    assert fold.add(RECORDS[1:]) is None and fold.view() is None  # measurements but no plan yet
    got = fold.add(RECORDS[:1])
    assert got == clean_plan(plan())
    view = fold.view(activation_checkpointing=False)
    assert view is not None
    assert (view.optimize, view.schedule, view.microbatches, view.partitions, view.blocks) == (
        "speed", "simple", 4, 3, 6)
    assert view.cuts == (2, 3) and view.source == "profiled" and view.expected_bubble == pytest.approx(1 / 3)
    assert view.equal_cuts == (2, 4) and view.equal_max_time_s == 0.055
    s0, s1, s2 = view.stages
    assert (s0.first_block, s0.end_block, s1.first_block, s1.end_block, s2.first_block, s2.end_block) == (
        0, 2, 2, 3, 3, 6)
    assert (s0.step, s0.step_time_s, s0.busy_s, s0.peak_bytes, s0.host) == (10, 0.40, 0.12, 3_600_000, "h1")
    assert s1.expected_time_s == 0.040 and s1.expected_memory_bytes == 9_000_000
    assert s0.bubble == pytest.approx(0.7) and s1.bubble == pytest.approx(0.4) and s2.bubble == pytest.approx(0.6)
    assert view.measured_bubble == pytest.approx((0.7 + 0.4 + 0.6) / 3)
    assert view.expected_max_time_s == 0.040


def test_a_stage_not_yet_measured_has_no_bubble_and_the_mean_skips_it() -> None:
    view = stages_from_records(RECORDS[:3])
    assert view is not None
    assert [s.bubble for s in view.stages] == [pytest.approx(0.8), None, None]
    assert view.measured_bubble == pytest.approx(0.8)
    assert StageRow(0, 0, 1, step_time_s=0.1, busy_s=0.3).bubble == 0.0  # clamped, never negative


@pytest.mark.parametrize("bad", [
    None, [], "plan", {"stages": []}, {"stages": [{"stage": 1, "blocks": [0, 1]}]},
    {"stages": [{"stage": 0, "blocks": [0]}]}, {"stages": [{"stage": 0, "blocks": ["a", 1]}]},
])
def test_what_is_not_a_plan_is_left_out(bad: Any) -> None:
    fold = StagesFold()
    assert fold.add([{"event": "mp_plan", "plan": bad}]) is None and fold.plan is None


def test_a_plan_is_copied_with_its_known_keys_and_types_only() -> None:
    p = clean_plan(plan(optimize="\x1b]0;pwned\x07speed", extra="x" * 10000, microbatches="4",
                        stages=[{"stage": 0, "blocks": [0, 6], "time_s": "slow", "memory_bytes": -1, "more": 1}],
                        cuts="none"))
    assert p is not None
    assert "extra" not in p and p["microbatches"] is None and p["cuts"] == []
    assert p["stages"] == [{"stage": 0, "blocks": [0, 6], "time_s": None, "memory_bytes": None, "send_bytes": None}]
    assert "\x1b" not in p["optimize"] and "\x07" not in p["optimize"]
    # Measurements of the wrong type count as not measured.
    fold = StagesFold()
    fold.add([{"event": "mp_plan", "plan": plan()},
              {"event": "mp_stage", "stage": 1, "step": 5, "step_time_s": "x", "busy_s": True, "peak_bytes": 1.5},
              {"event": "mp_stage", "stage": "0", "step": 5, "step_time_s": 1.0, "busy_s": 0.5}])
    view = fold.view()
    assert view is not None
    assert [(s.step, s.step_time_s, s.busy_s, s.peak_bytes) for s in view.stages] == [
        (None, None, None, None), (5, None, None, None), (None, None, None, None)]


def test_the_history_keeps_the_plan_once_and_a_finished_job_shows_it(tmp_path: Path) -> None:
    """JobWatch keeps a plan it reads in the job's history events (once: reading the metrics
    again, as a restarted app does, adds nothing); a job whose metrics are not read any more
    (it ended, its hosts are gone) still shows it."""
    history = History(tmp_path / "history.sqlite")
    history.create("j1", "pipe", {"name": "pipe", "model_parallel": {"activation_checkpointing": True}})
    watch = JobWatch(SimpleNamespace(ctl=None, history=history))
    fold = StagesFold()
    new = fold.add(RECORDS)
    assert new is not None
    watch._keep_plan(history.get("j1") or {}, new)
    watch._keep_plan(history.get("j1") or {}, new)
    rec = history.get("j1")
    assert rec is not None
    assert [e["event"] for e in rec["events"]] == ["mp_plan"] and plan_from_events(rec["events"]) == new
    assert isinstance(rec["events"][0]["time"], float)
    # A new plan (the job re-profiled after a restart) is kept too; the newest is the one shown.
    other = clean_plan(plan(cuts=[3, 4], stages=[
        {"stage": 0, "blocks": [0, 3]}, {"stage": 1, "blocks": [3, 4]}, {"stage": 2, "blocks": [4, 6]}]))
    assert other is not None
    watch._keep_plan(rec, other)
    rec = history.get("j1")
    assert rec is not None and len(rec["events"]) == 2 and plan_from_events(rec["events"]) == other

    rec["state"] = "succeeded"
    detail = _Track(rec).detail()  # nothing read: the plan comes from the history
    assert detail.stages is not None and detail.stages.cuts == (3, 4)
    assert detail.stages.activation_checkpointing is True
    assert all(s.step_time_s is None for s in detail.stages.stages)
    track = _Track(rec)
    track.stages.add(RECORDS)  # read: the metrics' plan and measurements
    assert track.detail().stages == fold.view(activation_checkpointing=True)
    history.close()


def test_stages_cross_the_wire_to_a_servers_faces() -> None:
    """The server sends a JobDetail as encode_detail makes it; the remote client rebuilds it
    from JobDetail's type hints (tui/client.py): the stages come back equal."""
    track = _Track({"job_id": "j1", "name": "pipe", "state": "running", "spec": {"name": "pipe"},
                    "placement": [], "events": []})
    track.stages.add(RECORDS)
    detail = track.detail()
    assert detail.stages is not None
    sent = json.loads(json.dumps(encode_detail(detail, 0)))
    sent.pop("logs")
    hints = wire._hints(JobDetail)
    fields = {k: wire.decode(hints[k], v) for k, v in sent.items() if k in hints}
    got = fields["stages"]
    assert isinstance(got, StagesView) and got == detail.stages
    assert got.measured_bubble == detail.stages.measured_bubble
    none = _Track({**track.rec, "job_id": "j2"}).detail()
    assert wire.decode(hints["stages"], json.loads(json.dumps(encode_detail(none, 0)))["stages"]) is None


def test_status_json_form() -> None:
    view = stages_from_records(RECORDS, spec={"model_parallel": {"activation_checkpointing": False}})
    assert view is not None
    d = json.loads(json.dumps(view.to_json()))
    assert set(d) == {"optimize", "schedule", "microbatches", "partitions", "blocks", "cuts", "source",
                      "activation_checkpointing", "expected_bubble", "measured_bubble", "equal_split", "stages"}
    assert d["partitions"] == 3 and d["cuts"] == [2, 3] and d["activation_checkpointing"] is False
    assert d["stages"][1] == {"stage": 1, "blocks": [2, 3], "expected_time_s": 0.04, "expected_memory_bytes": 9_000_000,
                              "send_bytes": 65536, "step": 5, "step_time_s": 0.5, "busy_s": 0.3,
                              "peak_bytes": 9_500_000, "bubble": pytest.approx(0.4), "rank": 1, "host": "h2"}
