"""tui.model.health (the rules of health and healing) and the history's drains and incidents."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tui.control.history import History
from tui.model import health
from tui.model.health import Drain, DrainTargetError, HealthSpec, ProgressWatch


def test_targets_name_a_host_or_one_of_its_gpus() -> None:
    assert health.parse_target("h1") == ("h1", None)
    assert health.parse_target("h1:3", ["h1", "h2"]) == ("h1", 3)
    with pytest.raises(DrainTargetError, match="no host 'h9' in the inventory"):
        health.parse_target("h9:0", ["h1", "h2"])
    with pytest.raises(DrainTargetError, match="must be an index"):
        health.parse_target("h1:x")
    with pytest.raises(DrainTargetError, match="expected HOST or HOST:GPU"):
        health.parse_target(":1")
    host = Drain("h1", None, "bad PSU", "ann", 1.0)
    gpu = Drain("h2", 3, "XID 79", "rigdeck", 2.0, "health")
    assert host.covers("h1", 0) and host.covers("h1", None) and not host.covers("h2", 0)
    assert gpu.covers("h2", 3) and not gpu.covers("h2", 2)
    assert health.drained([host, gpu], "h2", 3) is gpu and health.drained([host, gpu], "h2", 1) is None
    assert Drain.from_dict(gpu.to_dict()) == gpu and gpu.target == "h2:3"


def test_a_job_is_hung_when_no_rank_moves_for_its_timeout_and_the_clock_restarts_per_attempt() -> None:
    spec = HealthSpec(hang_timeout=20, startup_timeout=60)
    w = ProgressWatch()
    w.observe("j", 0, [], now=100)
    assert w.hang("j", spec, now=159) is None
    hung = w.hang("j", spec, now=160)
    assert hung is not None and hung.last_step is None and "first step" in hung.message()
    w.observe("j", 0, [1, 3, None, 2], now=161)
    w.observe("j", 0, [3, 3], now=170)  # the same step again is no progress
    assert w.hang("j", spec, now=180) is None
    hung = w.hang("j", spec, now=181)
    assert hung is not None and hung.last_step == 3
    assert hung.message().startswith("hung: no rank reported a step after step 3 for 20 s")
    w.observe("j", 1, [], now=200)  # a new attempt: its start-up gets startup_timeout again
    assert w.hang("j", spec, now=250) is None


def test_the_loss_guard_wants_three_bad_steps_in_a_row_at_every_rank() -> None:
    rec = lambda step, loss, rank=0: {"step": step, "loss": loss, "rank": rank}  # noqa: E731
    ok = [rec(1, 0.5), rec(2, math.nan), rec(3, math.nan), rec(4, 0.4), rec(5, "nan"), rec(6, math.inf)]
    assert health.first_bad_loss(ok) is None
    # one rank still sound at step 7: not all ranks bad there
    bad = ok + [rec(7, math.nan), rec(7, 0.3, rank=1), rec(8, math.nan), rec(9, math.nan), rec(10, float("-inf"))]
    assert health.first_bad_loss(bad) == 8


def test_goodput_counts_each_step_once_as_its_newest_attempt_computed_it() -> None:
    # attempt 0: steps 1..10 one second apart from t=10; it dies; attempt 1 resumes from a
    # checkpoint at step 6, starts at t=40 and runs 7..20 one second apart.
    recs = [{"rank": 0, "step": s, "time": 9.0 + s, "restart": 0} for s in range(1, 11)]
    recs += [{"rank": 0, "step": s, "time": 40.0 + (s - 7), "restart": 1} for s in range(7, 21)]
    recs += [{"rank": 1, "step": s, "time": 9.0 + s, "restart": 0} for s in range(1, 11)]  # a second rank: same steps
    g = health.goodput(recs, started=5.0, now=55.0)
    assert g.steps == 20  # 1..6 from attempt 0, 7..20 from attempt 1
    assert g.useful_s == pytest.approx(20.0) and g.wall_s == 50.0 and g.ratio == pytest.approx(0.4)
    assert health.steps_rerun(recs, 1) == 4  # 7, 8, 9, 10 computed twice
    assert health.goodput([], started=0.0, now=10.0).ratio == 0.0


def test_drains_and_incidents_outlive_the_history_that_wrote_them(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    h = History(db)
    assert h.drain("h2", 3, "XID 79: GPU has fallen off the bus", "rigdeck", source="health") is True
    assert h.drain("h2", 3, "again", "ann") is False  # the first drain's reason stands
    assert h.drain("h1", None, "PSU swap", "ann") is True
    seq = h.add_incident("j1", {"kind": "gpu", "host": "h2", "gpu": 3, "detected_at": 10.0})
    h.update_incident("j1", seq, resumed_at=30.0, resume_s=12.5)
    h.close()
    h = History(db)
    assert [(d["host"], d["gpu"], d["reason"], d["source"]) for d in h.drains()] == [
        ("h1", None, "PSU swap", "operator"), ("h2", 3, "XID 79: GPU has fallen off the bus", "health")]
    assert h.incidents("j1") == [{"kind": "gpu", "host": "h2", "gpu": 3, "detected_at": 10.0,
                                  "resumed_at": 30.0, "resume_s": 12.5}]
    assert [d["gpu"] for d in h.undrain("h2", 3)] == [3]
    assert h.undrain("h2", 3) == []
    assert [d["host"] for d in h.undrain("h1", None)] == ["h1"] and h.drains() == []
    h.close()


def test_placement_never_uses_an_unhealthy_or_drained_gpu_and_says_why() -> None:
    from tests.kit.fakes import gpu, telemetry
    from tests.kit.specs import gpu_job
    from tui.model.scheduler import PlacementError, Scheduler, capacity_from_state
    from tui.model.state import ClusterState

    state = ClusterState([("h1", "10.0.0.1"), ("h2", "10.0.0.2")])
    bad = {**gpu(1), "health": "unhealthy", "health_reason": "XID 79: GPU has fallen off the bus"}
    warn = {**gpu(2), "health": "warn", "health_reason": "throttled: hardware slowdown"}
    state.apply_sample("h1", telemetry([gpu(0), bad, warn, gpu(3)]))
    state.apply_sample("h2", telemetry([gpu(0), gpu(1)]))
    drains = [Drain("h1", 3, "fan noise", "ann", 1.0), Drain("h2", None, "PSU swap", "ann", 1.0)]
    h1, h2 = capacity_from_state(state.snapshot(), drains=drains)
    assert h1.unusable == ((1, "unhealthy (XID 79: GPU has fallen off the bus)"), (3, "drained (fan noise)"))
    assert h2.state == "drained" and not h2.up
    s = Scheduler()
    placed = s.reserve("j1", gpu_job("two", 1, 2), [h1, h2])
    assert [(n.host, n.gpus) for n in placed.nodes] == [("h1", (0, 2))]  # a warning does not keep a GPU out
    s.release("j1")
    with pytest.raises(PlacementError) as e:
        s.reserve("j2", gpu_job("three", 1, 3), [h1, h2])
    assert "GPU 1 unhealthy (XID 79: GPU has fallen off the bus)" in str(e.value)
    assert "GPU 3 drained (fan noise)" in str(e.value) and "h2 drained" in str(e.value)


def test_the_agent_tells_each_ranks_newest_step_and_the_attempt_that_wrote_it(tmp_path: Path) -> None:
    import json

    from agent.jobs import _last_step

    path = tmp_path / "rank-0.jsonl"
    first = "".join(json.dumps({"time": 1.0 + s, "rank": 0, "step": s, "loss": 0.5}) + "\n" for s in range(1, 40))
    path.write_text(first)
    marks = [{"restart_count": 0, "sizes": {}}, {"restart_count": 1, "sizes": {"rank-0.jsonl": len(first)}}]
    # the new attempt has written nothing yet: the newest step is attempt 0's
    assert _last_step(str(path), marks) == {"step": 39, "time": 40.0, "loss": 0.5, "attempt": 0}
    more = (json.dumps({"time": 50.0, "rank": 0, "step": 30, "loss": 0.6}) + "\n"
            + json.dumps({"time": 51.0, "rank": 0, "event": "checkpoint", "path": "x"}) + "\n" + "not json\n")
    with path.open("a") as f:
        f.write(more)
    assert _last_step(str(path), marks) == {"step": 30, "time": 50.0, "loss": 0.6, "attempt": 1}
    # a tail that begins inside a record: the cut record is skipped, never misread
    assert _last_step(str(path), marks, max_bytes=len(more) + 10)["step"] == 30  # type: ignore[index]
    assert _last_step(str(path), marks, max_bytes=len(more) - 10) is None  # only a cut step record
    assert _last_step(str(tmp_path / "none.jsonl"), marks) is None


def test_the_healer_finds_each_fault_that_leaves_the_processes_alive(tmp_path: Path) -> None:
    from tui.control.healing import Healer
    from tui.remote.transport import TransportError

    h = History(tmp_path / "h.sqlite")
    healer = Healer(h)
    rec = {"job_id": "j1", "restarts": 0, "placement": [{"host": "h1", "gpus": [0, 1]}, {"host": "h2", "gpus": [0]}],
           "spec": {"health": {"hang_timeout": 20, "startup_timeout": 60, "host_timeout": 30, "on_nan": "restart"}}}

    def states(step: float | None, *, loss: float = 0.5, attempt: int = 0, h1_gpus: list | None = None,
               h2: object = None) -> dict:
        prog = {} if step is None else {"0": {"step": step, "loss": loss, "attempt": attempt}}
        return {"h1": {"state": "running", "progress": prog, "gpu_health": h1_gpus or []},
                "h2": h2 if h2 is not None else {"state": "running", "progress": {}, "gpu_health": []}}

    assert healer.look(rec, states(None), now=0) is None
    assert healer.look(rec, states(5), now=10) is None
    # a GPU the job does not use may fail: not this job's fault; one it uses is
    other = [{"index": 3, "health": "unhealthy", "reason": "XID 79: GPU has fallen off the bus"}]
    assert healer.look(rec, states(6, h1_gpus=other), now=11) is None
    mine = [{"index": 1, "health": "unhealthy", "reason": "XID 79: GPU has fallen off the bus", "simulated": True}]
    f = healer.look(rec, states(7, h1_gpus=mine), now=12)
    assert f is not None and (f.kind, f.host, f.gpu) == ("gpu", "h1", 1)
    assert f.message == "h1 GPU 1 (simulated): XID 79: GPU has fallen off the bus"
    # a host out of reach: a fault only after host_timeout
    gone = TransportError("h2", "connection refused")
    assert healer.look(rec, states(8, h2=gone), now=20) is None
    f = healer.look(rec, states(8, h2=gone), now=50)
    assert f is not None and f.kind == "host" and f.host == "h2"
    assert f.message.startswith("h2 unreachable for 38 s")  # since its last answer, at 12
    # no step for hang_timeout: the job hosts judge first; this watch, the backstop, BACKSTOP_S later
    assert healer.look(rec, states(9), now=60) is None
    assert healer.look(rec, states(9), now=89) is None
    f = healer.look(rec, states(9), now=90)
    assert f is not None and f.kind == "hang" and f.last_step == 9 and f.restart
    assert (f.section, f.timeout_s, f.cause()["section"]) == ("step", 20.0, "step")
    assert f.message == "hung: no rank reported a step after step 9 for 30 s (hang_timeout 20 s)"
    # the incident's cost is known when the next attempt takes its first step
    seq = healer.record("j1", f, attempt=0, stopped_at=75.0)
    assert healer.look({**rec, "restarts": 1}, states(9, attempt=0), now=80) is None  # the old attempt's step
    healer.look({**rec, "restarts": 1}, states(7, attempt=1), now=90)
    (inc,) = h.incidents("j1")
    assert seq == 0 and inc["kind"] == "hang" and inc["resume_s"] == 15.0 and inc["last_step"] == 9
    # the steps run twice: from the first step the next attempt reported to the last one before
    from tui.control.healing import with_reruns
    from tui.model.health import Incident

    records = [{"rank": 0, "step": s, "restart": 0} for s in range(1, 10)]
    records += [{"rank": 0, "step": s, "restart": 1} for s in range(6, 12)] + [{"event": "checkpoint", "restart": 1}]
    assert with_reruns([Incident.from_dict(inc)], records)[0].steps_rerun == 4  # 6, 7, 8, 9
    # a resumption no supervisor saw live (the next attempt ran between two looks) comes from the
    # metrics: the next attempt's first record; one seen live keeps its own time
    unseen = Incident(kind="host", detected_at=100.0, message="h2 unreachable", last_step=9, attempt=0)
    timed = [{**r, "time": 90.0 + r["step"]} for r in records if r.get("restart") == 0]
    timed += [{**r, "time": 104.5 + r["step"]} for r in records if r.get("restart") == 1 and r.get("step")]
    got = with_reruns([unseen], timed)[0]
    assert (got.resumed_at, got.resume_s, got.steps_rerun) == (110.5, 10.5, 4)
    assert with_reruns([Incident.from_dict(inc)], timed)[0].resume_s == 15.0
    assert with_reruns([unseen], records)[0].resume_s is None  # no times: nothing made up
    # NaN at every rank three reports in a row, counted from the first bad step
    rec1 = {**rec, "restarts": 1}
    for now, step in ((91, 8), (92, 9), (93, 10)):
        got = healer.look(rec1, states(step, loss=float("nan"), attempt=1), now=now)
    assert got is not None and got.kind == "nan" and got.last_step == 8 and got.restart
    assert "since step 8" in got.message
    # an operator's drain --now of a GPU the job runs on moves it; a plain drain does not
    h.drain("h2", 0, "fan", "ann")
    healer.drains_read = 0
    assert healer.look(rec1, states(11, attempt=1), now=94) is None
    h.drain("h2", 0, "fan", "ann", now=True)
    healer.drains_read = 0
    f = healer.look(rec1, states(12, attempt=1), now=95)
    assert f is not None and (f.kind, f.message) == ("drain", "h2:0 drained by ann (fan)")
    h.close()


def test_a_hang_a_job_host_judged_is_acted_on_at_the_next_look_with_its_stacks(tmp_path: Path) -> None:
    from tui.control.healing import Healer, stack_summary
    from tui.remote.transport import TransportError

    h = History(tmp_path / "h.sqlite")
    healer = Healer(h)
    rec = {"job_id": "j2", "restarts": 1, "placement": [{"host": "h1", "gpus": []}, {"host": "h2", "gpus": []}],
           "spec": {}}
    judged = {"section": "step", "stalled_s": 15.2, "timeout_s": 15.0, "basis": "learned", "last_step": 11,
              "message": "hung: no rank reported a step after step 11 for 15 s (step timeout 15 s, learned: ...)",
              "at": 1000.0, "host": "h2", "on_hang": "restart",
              "stacks": [{"rank": 3, "pid": 9, "top": "train.py:60 in stuck", "in_collective": False},
                         {"rank": 2, "pid": 8, "top": "distributed_c10d.py:1 in all_reduce", "in_collective": True}]}
    prog = {"0": {"step": 11, "attempt": 1}}
    old = {"h1": {"state": "running", "restart_count": 1, "progress": prog},
           "h2": {"state": "running", "restart_count": 0, "progress": {}, "hang": judged}}
    assert healer.look(rec, old, now=10) is None  # the last attempt's verdict is not this one's
    now = {"h1": {"state": "running", "restart_count": 1, "progress": prog},
           "h2": {"state": "running", "restart_count": 1, "progress": {}, "hang": judged}}
    # while a host is out of reach, the others' stall is its doing: host_timeout judges it, not the hang
    assert healer.look(rec, {**now, "h1": TransportError("h1", "timed out")}, now=11) is None
    f = healer.look(rec, now, now=12)  # at once: this watch's own timer has not run out
    assert f is not None and (f.kind, f.last_step, f.detect_s, f.section, f.timeout_s) == ("hang", 11, 15.2, "step",
                                                                                           15.0)
    assert f.message.endswith("(step timeout 15 s, learned: ...), judged by h2's job host") and f.restart
    summary, rows = stack_summary({**(f.stacks or {}), "h1": []})
    assert summary == "not in a collective: rank 3 at train.py:60 in stuck" and [r["rank"] for r in rows] == [2, 3]
    h.close()


def test_a_restart_a_job_host_made_in_place_is_adopted_once_with_its_cost(tmp_path: Path) -> None:
    """Who heals (``heals_on_host``), and what a controller makes of a job host's restarts:
    each one after the history's newest attempt, once, as an incident with its cost and the
    hang's stacks summed up; a hang such a host restarts is none of the controller's look."""
    from tui.control.healing import Healer, adopted, host_heals
    from tui.model.jobtext import incident_text

    one = {"launcher": "direct", "pools": [], "container": None}
    assert health.heals_on_host(one, 1) and health.heals_on_host({**one, "launcher": "torchrun"}, 1)
    assert not health.heals_on_host(one, 2) and not health.heals_on_host(one, 1, slurm=True)
    assert not health.heals_on_host({**one, "launcher": "mpirun"}, 1)
    assert not health.heals_on_host({**one, "container": {"image": "x"}}, 1)
    assert not health.heals_on_host({**one, "pools": [{"role": "primary"}]}, 1)
    hang = {"attempt": 0, "kind": "hang", "host": "h1", "detected_at": 100.0, "detect_s": 15.2, "last_step": 7,
            "message": "hung: no rank reported a step after step 7 for 15 s (step timeout 15 s, learned: ...)",
            "section": "step", "timeout_s": 15.0, "stopped_at": 101.0, "started_at": 101.5, "resumed_at": 106.0,
            "stacks": [{"rank": 1, "pid": 6, "top": "train.py:60 in stuck", "in_collective": False},
                       {"rank": 0, "pid": 5, "top": "distributed_c10d.py:1 in all_reduce", "in_collective": True}]}
    killed = {"attempt": 1, "kind": "exit", "host": "h1", "detected_at": 200.0, "detect_s": 0.1, "last_step": 15,
              "message": "rank 1 was killed by signal 9", "rank": 1, "exit_code": None, "signal": 9,
              "stopped_at": 200.5, "started_at": 201.0}
    states = {"h1": {"state": "running", "restart_count": 2, "heals": [hang, killed]}}
    assert [x["attempt"] for _, x in host_heals(states, 0)] == [0, 1]
    assert [x["attempt"] for _, x in host_heals(states, 1)] == [1]
    assert host_heals(states, 2) == [] and host_heals({"h1": {"state": "running"}}, 0) == []
    cause, inc = adopted("h1", hang)
    assert cause["message"] == (hang["message"] + ", judged by h1's job host; not in a collective: rank 1 at "
                                "train.py:60 in stuck")
    assert [r["rank"] for r in cause["stacks"]] == [0, 1] and cause["healed_by"] == "h1's job host"
    assert (inc.kind, inc.attempt, inc.last_step, inc.detect_s, inc.resume_s, inc.section) == (
        "hang", 0, 7, 15.2, 5.0, "step")
    cause, inc = adopted("h1", killed)
    assert (cause["kind"], cause["rank"], inc.resumed_at, inc.resume_s) == ("exit", 1, None, None)
    assert "(restarted in place by h1's job host) — rank 1 was killed by signal 9" in incident_text(inc)
    # the host restarts the job after its own hang verdict: the controller's look leaves it
    h = History(tmp_path / "h.sqlite")
    rec = {"job_id": "j3", "restarts": 0, "placement": [{"host": "h1", "gpus": []}], "spec": {}}
    judged = {"h1": {"state": "running", "restart_count": 0, "progress": {}, "hang": {**hang, "at": 100.0}}}
    assert Healer(h).look(rec, judged, now=12, hangs_on_host=True) is None
    found = Healer(h).look(rec, judged, now=12)
    assert found is not None and found.kind == "hang"
    h.close()


def test_the_health_table_of_a_job_spec_is_checked_and_kept() -> None:
    from tui.model.jobspec import JobSpec, JobSpecError, jobspec_from_toml

    base = 'name = "t"\ncommand = ["python", "train.py"]\n'
    assert jobspec_from_toml(base).health == HealthSpec()  # hangs learned, restart, 60 s, fail
    assert HealthSpec().hang_timeout is None and HealthSpec().startup_timeout is None
    spec = jobspec_from_toml(base + '[health]\nhang_timeout = "20s"\nstartup_timeout = 90\non_hang = "fail"\n'
                             'host_timeout = "2m"\non_nan = "restart"\n')
    assert spec.health == HealthSpec(20.0, 90.0, "fail", 120.0, "restart")
    assert JobSpec.from_dict(spec.to_dict()).health == spec.health
    for bad, field in (('hang_timeout = "-5s"', "health.hang_timeout"), ('on_hang = "retry"', "health.on_hang"),
                       ("host_timeout = 0", "health.host_timeout"), ("nan = 1", "health.nan")):
        with pytest.raises(JobSpecError) as e:
            jobspec_from_toml(base + "[health]\n" + bad + "\n")
        assert e.value.field == field


def test_a_diverged_loss_crosses_the_agents_wire_and_comes_back_a_float() -> None:
    import json

    from agent import protocol
    from agent.jobs import _wire_safe
    from tui.remote.agentclient import _job_state

    rec = {"step": 7, "loss": math.nan, "grad_norm": math.inf, "lr": 0.1}
    sent = protocol.decode(protocol.encode(protocol.ok(1, {"state": "running", "progress": {
        "0": _wire_safe(rec)}, "last_metrics": {"0": _wire_safe({"step": 7, "loss": -math.inf})}})))
    got = _job_state(sent["result"])
    p = got["progress"]["0"]
    assert math.isnan(p["loss"]) and p["grad_norm"] == math.inf and p["lr"] == 0.1 and "nonfinite" not in p
    assert got["last_metrics"]["0"]["loss"] == -math.inf
    assert _wire_safe({"loss": 0.5}) == {"loss": 0.5}
    assert json.dumps(_wire_safe(rec), allow_nan=False)


def test_status_text_says_goodput_and_each_incident_with_its_cost() -> None:
    from tui.model.health import Goodput, Incident
    from tui.model.jobtext import health_lines
    from tui.model.jobview import JobView

    hang = Incident("hang", 1.0, "hung: no rank reported a step after step 11 for 21 s", detect_s=21.3, last_step=11,
                    resume_s=13.9, steps_rerun=1)
    gpu = Incident("gpu", 2.0, "h1 GPU 1 (simulated): XID 79: GPU has fallen off the bus", host="h1", gpu=1)
    # A restart with each of its moments kept: detected at 100, stopped at 102.25, started at
    # 103.5, first step at 117.5 (14 s: a slow start-up, told apart from a slow stop).
    killed = Incident("exit", 100.0, "rank 1 exited -9", host="h2", rank=1, detect_s=0.4, last_step=30,
                      stopped_at=102.25, started_at=103.5, resumed_at=117.5, resume_s=15.25, steps_rerun=2)
    assert killed.parts() == {"detect": 0.4, "stop": 2.25, "start": 1.25, "first_step": 14.0}
    v = JobView(job_id="j", name="n", state="running", spec={}, incidents=(hang, gpu, killed),
                goodput=Goodput(9.0, 45.0, 30))
    assert health_lines(v) == [
        "goodput  20% (9 s in 30 step(s) that count, of 45 s)",
        "incident hang after step 11: detected in 21 s, next first step 14 s after the stop, 1 step(s) lost"
        " — hung: no rank reported a step after step 11 for 21 s",
        "incident gpu host h1 GPU 1: not resumed — h1 GPU 1 (simulated): XID 79: GPU has fallen off the bus",
        "incident exit host h2 rank 1 after step 30: detected in 0 s, stop 2.2 s + start 1.2 s + first step 14 s"
        " = next first step 18 s after detection, 2 step(s) lost — rank 1 exited -9",
    ]
    # One moment missing (a controller that stopped the attempt but could not start the next):
    # the part reads "?", nothing made up.
    assert Incident("exit", 1.0, "m", stopped_at=3.0, resumed_at=9.0).parts() == {
        "detect": None, "stop": 2.0, "start": None, "first_step": None}
    assert JobView.from_json(v.to_json()).incidents == v.incidents
    assert JobView.from_json(v.to_json()).goodput == v.goodput


def test_an_incident_is_notified_once_per_attempt(tmp_path: Path) -> None:
    import json
    import sys
    import time

    from tests.kit.fakes import WRITER, written_lines
    from tui.control.notify import Notifier
    from tui.model.userconfig import DEFAULT_ON, NotifyConfig

    assert "incident" in DEFAULT_ON
    out = tmp_path / "events.txt"
    h = History(tmp_path / "history.sqlite")
    n = Notifier(NotifyConfig(command=(sys.executable, "-c", WRITER, str(out))), h, user="ana")
    n.attach_jobs()
    h.create("j1", "train", {"hosts": []}, state="pending")
    h.update("j1", state="running", started=time.time(), placement=[{"host": "h1"}, {"host": "h2"}])
    inc = {"kind": "gpu", "host": "h2", "gpu": 1, "message": "h2 GPU 1 (simulated): XID 79: GPU has fallen off "
           "the bus", "detected_at": 1.0, "attempt": 0}
    h.add_incident("j1", inc)
    h.add_incident("j1", inc)  # the same attempt's incident again (another controller): told once
    n.close()
    (line,) = written_lines(out)
    ev = json.loads(line[0])
    assert (line[1], line[2]) == ("j1", "incident")
    assert ev["cause_text"] == inc["message"] and ev["host"] == "h2" and ev["hosts"] == ["h1", "h2"]
    assert ev["cause"] == {"kind": "gpu", "message": inc["message"], "host": "h2", "gpu": 1}
    h.close()


def test_the_faces_draw_unhealthy_and_drained_gpus_apart_with_the_reason() -> None:
    from tests.kit.fakes import gpu, telemetry
    from tui.app.widgets.clustermap import DRAINED_GLYPH, UNHEALTHY_GLYPH, cell_look, gpu_detail
    from tui.app.widgets.format import PLAIN
    from tui.app.widgets.tables import GpusTable, Widths, gpu_rows
    from tui.model.gpumap import FREE
    from tui.model.jobview import JobsSnapshot
    from tui.model.state import ClusterState

    state = ClusterState([("h1", "10.0.0.1")])
    bad = {**gpu(1), "health": "unhealthy", "health_reason": "XID 79: GPU has fallen off the bus"}
    state.apply_sample("h1", telemetry([gpu(0), bad, gpu(2)]))
    state.set_drains({("h1", 2): "drained by ann: fan noise", ("h1", 1): "drained by rigdeck: XID 79"})
    (host,) = state.snapshot()
    g0, g1, g2 = host.gpus
    assert (g0.health, g1.health, g2.health) == ("ok", "unhealthy", "drained")  # unhealthy stays what it is
    assert g2.health_reason == "drained by ann: fan noise"
    rows = dict(gpu_rows(state.snapshot(), Widths.for_width(160)))
    table = GpusTable()
    cells = {key: (table.render_cell("gpu", raw[1], PLAIN).plain, table.render_cell("job", raw[-2], PLAIN).plain)
             for key, raw in rows.items()}
    assert sorted(cells.values()) == [
        ("0", "-"),
        ("1 ✗", "unhealthy: XID 79: GPU has fallen off the bus"),
        ("2 ⊘", "drained by ann: fan noise"),  # a drain says "drained by" itself: not twice
    ]
    assert cell_look(g1, FREE, "util", None, False) == (UNHEALTHY_GLYPH, "crit")
    assert cell_look(g2, FREE, "job", None, False) == (DRAINED_GLYPH, "warn")
    assert "unhealthy: XID 79: GPU has fallen off the bus" in gpu_detail(host, g1, FREE, JobsSnapshot((), 0))
    state.set_drains({})
    assert [g.health for g in state.snapshot()[0].gpus] == ["ok", "unhealthy", "ok"]


def test_the_job_view_head_shows_goodput_once_something_failed() -> None:
    from tui.app.views.job import head_lines
    from tui.model.health import Goodput, Incident
    from tui.model.jobview import JobView

    inc = Incident("hang", 1.0, "hung: no rank reported a step after step 11 for 21 s", last_step=11)
    v = JobView(job_id="j", name="n", state="running", spec={}, restarts=1, incidents=(inc,),
                goodput=Goodput(36.0, 40.0, 30))
    assert "goodput [b]90%[/b]" in head_lines(v, now=100.0)[1]
    quiet = JobView(job_id="j", name="n", state="running", spec={}, goodput=Goodput(36.0, 40.0, 30))
    assert "goodput" not in head_lines(quiet, now=100.0)[1]  # nothing failed: no number to worry about


def test_the_app_poller_keeps_what_goodput_needs_and_the_incidents() -> None:
    from tui.control.jobwatch import _Track

    t = _Track({"job_id": "j", "name": "n", "state": "running", "spec": {}, "restarts": 0,
                "events": [{"event": "started", "time": 10.0}], "ended": 30.0})
    t.keep_steps([{"rank": 0, "step": s, "time": 10.0 + s, "restart": 0, "loss": 1.0, "extra": "x" * 100}
                  for s in range(1, 11)] + [{"rank": 0, "event": "checkpoint", "time": 15.0}])
    assert len(t.steps) == 10 and set(t.steps[0]) == {"rank", "step", "time", "restart"}
    g = t.goodput()
    assert g is not None and g.steps == 10 and g.wall_s == 20.0 and g.ratio == 0.5
    assert t.view().goodput == g and t.view(panels=False).goodput is None


def test_a_history_whose_drains_table_predates_drain_now_gets_the_column(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "history.sqlite"
    old = sqlite3.connect(db)
    old.execute("CREATE TABLE drains (host TEXT NOT NULL, gpu INTEGER NOT NULL, reason TEXT NOT NULL, "
                "who TEXT NOT NULL, at REAL NOT NULL, source TEXT NOT NULL, PRIMARY KEY (host, gpu))")
    old.execute("INSERT INTO drains VALUES ('h1', 2, 'fan', 'ann', 1.0, 'operator')")
    old.commit()
    old.close()
    h = History(db)
    assert [(d["target"] if "target" in d else (d["host"], d["gpu"]), d["now"]) for d in h.drains()] == [
        (("h1", 2), False)]
    h.close()


def test_a_gpu_a_job_host_moved_its_ranks_off_is_adopted_with_the_new_gpus_and_a_look_leaves_it_to_the_host(
        tmp_path: Path) -> None:
    """A job host's GPU heal (its ranks moved to a spare GPU on its host, agent/jobhost.py):
    the controller adopts it as the GPU's incident, with where the ranks went and the job's
    GPUs there from then on; a record not to trust is no move. A GPU fault of a job whose host
    acts on it first is left to the host while it heals and for the backstop's time after the
    look first saw it; past that, or for a job the controller heals, the look acts."""
    from tui.control.healing import BACKSTOP_S, Healer, adopted, gpu_moved, moved_placement

    heal = {"attempt": 0, "kind": "gpu", "host": "h2", "gpu": 1, "gpus": [3, 2], "moved": {"1": 3},
            "reasons": {"1": "XID 79: GPU has fallen off the bus (simulated)"}, "detected_at": 10.0,
            "last_step": 12, "stopped_at": 11.0, "started_at": 11.5, "resumed_at": 14.0,
            "message": "h2 GPU 1 (simulated): XID 79: GPU has fallen off the bus; ranks moved to GPU 3 on h2, "
                       "restart in place"}
    assert gpu_moved(heal) == (1, [3, 2], {1: 3})
    cause, inc = adopted("h2", heal)
    assert (cause["kind"], cause["gpu"], cause["moved_to"], cause["healed_by"]) == ("gpu", 1, [3, 2], "h2's job host")
    assert (inc.kind, inc.host, inc.gpu, inc.resume_s, inc.healed_by) == ("gpu", "h2", 1, 3.0, "h2's job host")
    assert inc.message.endswith("ranks moved to GPU 3 on h2, restart in place")
    for bad in ({"gpu": True}, {"gpus": []}, {"gpus": [3, 1]}, {"moved": {"1": "x"}}, {"moved": {"2": 3}},
                {"moved": None}, {"kind": "exit"}, {"gpus": [-1]}):
        assert gpu_moved({**heal, **bad}) is None, bad
    placement = [{"host": "h2", "gpus": [1, 2], "slots": 2}, {"host": "h3", "gpus": [1]}]
    assert moved_placement(placement, "h2", [3, 2]) == [{"host": "h2", "gpus": [3, 2], "slots": 2},
                                                        {"host": "h3", "gpus": [1]}]
    assert placement[0]["gpus"] == [1, 2]  # (a copy)
    # the look: the host acts first
    h = History(tmp_path / "h.sqlite")
    rec = {"job_id": "j4", "restarts": 0, "placement": [{"host": "h2", "gpus": [1]}], "spec": {}}
    bad_gpu = [{"index": 1, "health": "unhealthy", "reason": "XID 79: GPU has fallen off the bus"}]
    running = {"h2": {"state": "running", "restart_count": 0, "progress": {}, "gpu_health": bad_gpu}}
    healing = {"h2": {**running["h2"], "healing": {"kind": "gpu"}}}
    healer = Healer(h)
    assert healer.look(rec, running, now=100, gpus_on_host=True) is None
    assert healer.look(rec, healing, now=100 + BACKSTOP_S + 1, gpus_on_host=True) is None  # the host is at it
    late = healer.look(rec, running, now=100 + BACKSTOP_S, gpus_on_host=True)  # the host did nothing
    assert late is not None and (late.kind, late.gpu) == ("gpu", 1)
    now = Healer(h).look(rec, running, now=100)
    assert now is not None and now.kind == "gpu"
    healer.forget("j4")
    assert healer.gpu_seen == {}
    h.close()


def test_ranks_on_their_way_out_are_not_judged_hung_by_the_controllers_look(tmp_path: Path) -> None:
    """Every rank's progress marked ``exiting`` (agent/jobs.py: it has ended or marked its exit):
    neither the watch's own timer nor a job host's verdict is a hang; one rank still in its
    program is judged as before."""
    from tui.control.healing import Healer

    h = History(tmp_path / "h.sqlite")
    healer = Healer(h)
    rec = {"job_id": "j3", "restarts": 0, "placement": [{"host": "h1", "gpus": []}, {"host": "h2", "gpus": []}],
           "spec": {"health": {"hang_timeout": 20}}}

    def states(exiting: tuple[bool, bool], hang: dict | None = None) -> dict:  # type: ignore[type-arg]
        return {host: {"state": "running", "restart_count": 0, "hang": hang,
                       "progress": {str(r): {"step": 40, "attempt": 0, **({"exiting": True} if ex else {})}}}
                for r, (host, ex) in enumerate(zip(("h1", "h2"), exiting, strict=True))}

    assert healer.look(rec, states((False, False)), now=100) is None  # step 40 seen at 100
    assert healer.look(rec, states((True, True)), now=200) is None  # 100 s of silence, all exiting
    judged = {"section": "step", "stalled_s": 21, "timeout_s": 20, "last_step": 40, "at": 150.0,
              "message": "hung: no rank reported a step after step 40 for 21 s (hang_timeout 20 s)"}
    assert healer.look(rec, states((True, True), judged), now=201) is None
    f = healer.look(rec, states((True, False)), now=202)
    assert f is not None and f.kind == "hang" and f.last_step == 40, f
    h.close()


def test_a_quiet_hang_is_the_controllers_once_every_host_says_its_ranks_are_asleep(tmp_path: Path) -> None:
    """Each job host of a job of several hosts says its ranks are asleep with no step for its quiet
    timeout (``idle``, agent/hangrule.py); the controller judges the job hung only when every host
    of this attempt says so, with the words of the host that has waited least."""
    from tui.control.healing import Healer

    h = History(tmp_path / "h.sqlite")
    healer = Healer(h)
    rec = {"job_id": "jq", "restarts": 0, "placement": [{"host": "h1", "gpus": []}, {"host": "h2", "gpus": []}],
           "spec": {}}

    def idle(stalled: float, asleep: float | None = None, stacks: list[Any] | None = None) -> dict[str, Any]:
        return {"section": "step", "stalled_s": stalled, "timeout_s": 3.0, "basis": "quiet", "last_step": 11,
                "learned_from": 0.3, "at": 1000.0, **({} if asleep is None else {"asleep_s": asleep}),
                **({} if stacks is None else {"stacks": stacks})}

    prog = {"0": {"step": 11, "attempt": 0}}
    one = {"h1": {"state": "running", "restart_count": 0, "progress": prog, "idle": idle(4.1)},
           "h2": {"state": "running", "restart_count": 0, "progress": prog}}
    assert healer.look(rec, one, now=10) is None  # h2's ranks are not asleep (a straggler computes there)
    both = {"h1": one["h1"], "h2": dict(one["h2"], idle=idle(3.4))}
    f = healer.look(rec, both, now=11)
    assert f is not None and (f.kind, f.last_step, f.detect_s, f.section, f.timeout_s) == ("hang", 11, 3.4, "step", 3.0)
    assert f.message == ("hung: no rank reported a step after step 11 for 3 s, every rank asleep (quiet timeout 3 s: "
                         "every rank asleep, using no CPU; learned: 10 x the typical step (0.3 s), at least 3 s), "
                         "judged by the controller: every host's ranks asleep (h1, h2)") and f.restart
    old = {"h1": both["h1"], "h2": dict(both["h2"], restart_count=1)}
    assert Healer(h).look(rec, old, now=11) is None  # hosts in different attempts: not this attempt's word
    # a host says so at part of the quiet timeout (for the lost-host rule): no step for long
    # enough is not enough while its ranks have not been asleep as long
    early = {"h1": dict(one["h1"], idle=idle(4.1, 4.0)), "h2": dict(one["h2"], idle=idle(3.4, 2.9))}
    assert Healer(h).look(rec, early, now=12) is None
    stack = [{"rank": 1, "pid": 42, "top": "stuck (train.py:9)", "in_collective": False}]
    later = {"h1": dict(one["h1"], idle=idle(4.6, 4.5, stack)), "h2": dict(one["h2"], idle=idle(3.9, 3.4, []))}
    f = Healer(h).look(rec, later, now=12.5)
    assert f is not None and (f.kind, f.detect_s) == ("hang", 3.4)
    assert f.stacks == {"h1": stack}  # taken by h1's job host when it said so; h2's none: the controller asks
    h.close()


def test_a_host_out_of_reach_while_every_other_host_waits_asleep_is_lost_at_once(tmp_path: Path) -> None:
    """``host_timeout`` (60 s) is for a host out of reach while the job goes on; where every other
    host says its ranks are asleep with no step (``idle``), the job waits for the lost host: it is
    judged at the first look that finds it out of reach."""
    from tui.control.healing import Healer
    from tui.remote.transport import TransportError

    h = History(tmp_path / "h.sqlite")
    healer = Healer(h)
    rec = {"job_id": "jh", "restarts": 0, "placement": [{"host": "h1", "gpus": []}, {"host": "h2", "gpus": []},
                                                        {"host": "h3", "gpus": []}], "spec": {}}
    idle = {"section": "step", "stalled_s": 3.2, "timeout_s": 3.0, "basis": "quiet", "last_step": 40,
            "learned_from": 0.3, "at": 1000.0}
    prog = {"0": {"step": 40, "attempt": 0}}
    up = {h: {"state": "running", "restart_count": 0, "progress": prog} for h in ("h1", "h2", "h3")}
    assert healer.look(rec, up, now=100) is None
    lost = {**up, "h3": TransportError("h3", "timed out")}
    assert healer.look(rec, lost, now=101) is None  # the others still step: host_timeout's to judge
    waiting = {"h1": dict(up["h1"], idle=idle), "h2": dict(up["h2"], idle=idle), "h3": lost["h3"]}
    f = healer.look(rec, waiting, now=104)
    assert f is not None and (f.kind, f.host, f.detect_s) == ("host", "h3", 4.0)
    assert f.message == ("h3 unreachable for 4 s (h3: timed out), and the job waits for it: every rank on h1, h2 "
                         "asleep with no step")
    h.close()
