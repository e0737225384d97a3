"""The shared queue's rules (tui/model/fairshare.py): config, usage, fair-share factors, quotas,
who may be preempted. Pure: no bed."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from tui.model import fairshare as fs
from tui.model.jobspec import JobSpecError, jobspec_from_toml
from tui.model.userconfig import ConfigError, parse_config

NOW = 1_800_000_000.0
CFG = Path("/etc/rigdeck/config.toml")


def rec(job_id: str, user: str, gpus: int, runs: list[tuple[float, float | None]], *, state: str = "running",
        priority: int = 0, **spec: object) -> dict[str, object]:
    """A job record that ran ``runs`` ((start, end or None while it runs), seconds before NOW)."""
    events: list[dict[str, object]] = []
    for start, end in runs:
        events.append({"event": "started", "time": NOW - start, "gpus": gpus})  # as JobManager records it
        if end is not None:
            events.append({"event": "restart", "time": NOW - end})
    ended = NOW - runs[-1][1] if state in ("succeeded", "failed", "stopped") and runs[-1][1] is not None else None
    return {"job_id": job_id, "user": user, "state": state, "priority": priority, "created": NOW - 10_000,
            "ended": ended, "events": events, "spec": {"nodes": 1, "gpus_per_node": gpus, **spec}}


def test_the_config_tables_parse_and_copy_back() -> None:
    text = """
[queue]
half_life_hours = 2
preemption = false
shares = { alice = 2, vision = 3 }

[[group]]
name = "vision"
members = ["bob", "carol"]

[[quota]]
user = "alice"
gpus = 4

[[quota]]
group = "vision"
gpu_hours = 100
"""
    p = parse_config(text, CFG).queue
    assert p.half_life_s == 7200 and not p.preemption and p.fair
    assert p.share_of == {"alice": 2.0, "vision": 3.0}
    assert p.group_of("carol") == "vision" and p.group_of("alice") is None
    assert [q.label for q in p.quotas_of("bob")] == ["quota of group vision"]
    assert p.quotas_of("alice") == [fs.Quota("user", "alice", 4, None)]
    from tui.model import tomlwrite

    # What `rigdeck server setup` writes for the server reads back the same.
    assert parse_config(tomlwrite.dumps(fs.policy_to_toml(p))).queue == p


@pytest.mark.parametrize(("text", "field", "expected"), [
    ('[queue]\norder = "lottery"', "queue.order", '"fairshare" or "fifo"'),
    ("[queue]\nhalf_life_hours = 0", "queue.half_life_hours", "hours > 0"),
    ("[queue]\nshares = { alice = -1 }", "queue.shares.alice", "a number > 0"),
    ('[[group]]\nname = "g"\nmembers = []', "group[0].members", "a non-empty list of user names"),
    ('[[group]]\nname = "g"', "group[0].members", "(required)"),
    ('[[group]]\nname = "a"\nmembers = ["x"]\n[[group]]\nname = "b"\nmembers = ["x"]', "group[1].members",
     "users in one group each"),
    ('[[quota]]\nuser = "alice"', "quota[0]", "a limit: gpus"),
    ('[[quota]]\nuser = "alice"\ngroup = "g"\ngpus = 1', "quota[0]", "exactly one of user"),
    ('[[quota]]\ngroup = "nope"\ngpus = 1', "quota[0].group", "the name of a [[group]]"),
    ('[[quota]]\nuser = "alice"\ngpus = 1.5', "quota[0].gpus", "an integer >= 0"),
    ('[[quota]]\nuser = "alice"\ngpux = 1', "quota[0].gpux", "did you mean 'gpus'"),
    ('quota = 3', "quota", "an array of tables"),
])
def test_a_bad_table_names_the_file_the_field_and_what_was_expected(text: str, field: str, expected: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(text, CFG)
    assert str(CFG) in str(e.value) and f"field '{field}'" in str(e.value) and expected in str(e.value)


def test_a_jobs_runs_are_its_gpu_time_with_restarts_and_requeues_ending_a_run() -> None:
    r = rec("a", "alice", 2, [(3600, 1800), (600, None)])
    assert fs.run_intervals(r, NOW) == [(NOW - 3600, NOW - 1800, 2), (NOW - 600, NOW, 2)]
    assert fs.week_gpu_hours(fs.run_intervals(r, NOW), NOW) == pytest.approx(2 * (1800 + 600) / 3600)
    done = rec("b", "bob", 1, [(7200, 3600)], state="succeeded")
    done["events"] = done["events"][:1]  # it ended by itself: the record's end closes the run
    assert fs.run_intervals(done, NOW) == [(NOW - 7200, NOW - 3600, 1)]
    assert fs.run_intervals(rec("c", "carol", 0, [(60, None)]), NOW) == []  # CPU only: no GPU time


def test_decayed_usage_halves_with_each_half_life() -> None:
    hour = [(NOW - 3600, NOW, 1)]
    assert fs.decayed_gpu_hours(hour, NOW, 1e12) == pytest.approx(1.0)
    fresh = fs.decayed_gpu_hours(hour, NOW, 3600)
    old = fs.decayed_gpu_hours([(NOW - 7200, NOW - 3600, 1)], NOW, 3600)
    assert old == pytest.approx(fresh / 2)
    assert fresh == pytest.approx(1 / (2 * math.log(2)))  # the integral of 2^(-t/h) over one h


def test_the_projected_usage_is_one_half_life_ahead_with_the_gpus_held_now() -> None:
    h = 3600.0
    past = fs.decayed_gpu_hours([(NOW - 7200, NOW - 3600, 1)], NOW, h)
    assert fs.projected_gpu_hours(past, 0, h) == pytest.approx(
        fs.decayed_gpu_hours([(NOW - 7200, NOW - 3600, 1)], NOW + h, h))  # nothing held: it decays
    # one GPU held from now on: exactly what an hour of it adds by then
    assert fs.projected_gpu_hours(0.0, 1, h) == pytest.approx(fs.decayed_gpu_hours([(NOW, NOW + h, 1)], NOW + h, h))
    assert fs.projected_gpu_hours(past, 3, h) == pytest.approx(past / 2 + 3 * fs.projected_gpu_hours(0.0, 1, h))


def test_the_factor_is_two_to_the_minus_usage_over_share() -> None:
    p = fs.QueuePolicy(share_of={"alice": 2})
    sh = fs.shares(p, ["alice", "bob", "carol"], {"alice": 50.0, "bob": 50.0, "carol": 0.0})
    # alice: half the usage, half the shares: 2^-1; bob: half the usage, a quarter: 2^-2
    assert sh.factor["alice"] == pytest.approx(0.5)
    assert sh.factor["bob"] == pytest.approx(0.25)
    assert sh.factor["carol"] == pytest.approx(1.0)
    order = sorted(["alice", "bob", "carol"], key=sh.key)
    assert order == ["carol", "alice", "bob"]
    assert fs.shares(p, ["x"], {}).factor == {"x": 1.0}  # nobody has used anything: all equal


def test_a_groups_factor_comes_first_then_its_members() -> None:
    p = fs.QueuePolicy(groups=(fs.Group("vision", ("bob", "carol")),))
    # vision used 60 of 100 with half the shares: below alice; within it, carol used less
    sh = fs.shares(p, ["alice", "bob", "carol"], {"alice": 40.0, "bob": 50.0, "carol": 10.0})
    assert sorted(["bob", "carol", "alice"], key=sh.key) == ["alice", "carol", "bob"]
    assert sh.account_factor["bob"] == sh.account_factor["carol"] == pytest.approx(2 ** (-0.6 / 0.5))
    assert sh.factor["carol"] == pytest.approx(2 ** (-0.1 / 0.25))


def test_a_gpus_quota_names_itself_the_jobs_holding_it_and_when_it_frees() -> None:
    p = fs.QueuePolicy(quotas=(fs.Quota("user", "alice", gpus=4),))
    held = [rec("a1", "alice", 2, [(60, None)]), rec("a2", "alice", 2, [(30, None)]),
            rec("b1", "bob", 4, [(30, None)])]
    why = fs.quota_block(p, "alice", 2, held, NOW)
    assert why is not None and why.startswith("quota of user alice: 4 GPUs at once; 4 held by a1, a2")
    assert "starts when enough of them end" in why
    assert fs.quota_block(p, "alice", 2, held[:1] + held[2:], NOW) is None
    assert fs.quota_block(p, "bob", 8, held, NOW) is None  # no quota of bob's


def test_a_gpu_hours_quota_says_when_the_week_frees_it() -> None:
    p = fs.QueuePolicy(groups=(fs.Group("vision", ("bob",)),), quotas=(fs.Quota("group", "vision", gpu_hours=10),))
    used = [rec("b1", "bob", 4, [(6 * 86400, 6 * 86400 - 3 * 3600)], state="succeeded")]  # 12 GPU-hours
    why = fs.quota_block(p, "bob", 1, used, NOW)
    assert why is not None and why.startswith("quota of group vision: 10 GPU-hours per rolling week, 12.00 used")
    # under 10 once its first half hour (2 of its 4 GPUs' hours) has left the week: in 1 day 30 min
    frees = fs._frees_at([i for r in used for i in fs.run_intervals(r, NOW)], 10, NOW)
    assert frees == pytest.approx(NOW + 86400 + 1800, abs=1)
    assert fs._clock(frees) in why


def test_preemptible_needs_a_checkpoint_dir_or_says_it_may_start_over() -> None:
    assert fs.preemptible({"preemptible": True, "checkpoint": {"dir": "/ck/{job_id}"}})
    assert not fs.preemptible({"preemptible": True, "checkpoint": {"dir": None}})
    assert fs.preemptible({"preemptible": "restart"})
    assert not fs.preemptible({})
    spec = jobspec_from_toml('name = "t"\ncommand = ["x"]\npreemptible = true\n[checkpoint]\ndir = "/ck"\n')
    assert spec.preemptible is True and spec.to_dict()["preemptible"] is True
    with pytest.raises(JobSpecError, match=r"field 'preemptible': expected a \[checkpoint\] dir"):
        jobspec_from_toml('name = "t"\ncommand = ["x"]\npreemptible = true\n', "/s/job.toml")
    with pytest.raises(JobSpecError, match=r"field 'preemptible': expected true .*\"restart\"") as e:
        jobspec_from_toml('name = "t"\ncommand = ["x"]\npreemptible = "yes"\n', "/s/job.toml")
    assert "/s/job.toml" in str(e.value)


def test_a_preemption_is_pending_until_the_job_starts_again_or_is_stopped_by_someone() -> None:
    events = [{"event": "started"}, {"event": "stop requested"}, {"event": "preempted"}]
    assert fs.preempt_pending({"events": events})
    assert not fs.preempt_pending({"events": [*events, {"event": "stop requested"}]})
    assert not fs.preempt_pending({"events": [*events, {"event": "requeued"}, {"event": "started"}]})
    assert not fs.preempt_pending({"events": events[:2]})


def test_a_jobs_owner_is_read_from_its_record() -> None:
    assert fs.job_user({"user": "alice"}) == "alice"
    assert fs.job_user({}) == "?"


# -- the queue's order, quotas and preemption, over a stand-in manager (no bed) ----------------


class _Manager:
    """What JobQueue asks of a JobManager: one host of 4 GPUs, each claimed by a job or free."""

    def __init__(self, history: Any, claims: dict[int, str]):
        from tui.model.scheduler import Scheduler

        self.history = history
        self.scheduler = Scheduler()
        self.claims = claims  # GPU -> job id
        self.launched: list[str] = []
        self.stopped: list[str] = []
        self.looked: list[str] = []
        self.ctl = type("Ctl", (), {"inventory": type("Inv", (), {"names": ["h1"]})()})()

    def check_pins(self, spec: Any) -> None:
        pass

    def check_joined(self, user: Any) -> None:
        pass

    def snapshot_code(self, spec: Any) -> Any:
        return spec

    def capacity(self, hosts: Any) -> list[Any]:
        from tui.model.scheduler import HostCapacity

        return [HostCapacity("h1", "10.0.0.1", True, 8, (0, 1, 2, 3), (), True, "Simulated GPU",
                             claimed=tuple((g, j, "u") for g, j in sorted(self.claims.items())))]

    def launch(self, spec: Any, *, job_id: str, capacity: Any = None, **_: Any) -> None:
        self.launched.append(job_id)

    def stop(self, job_id: str, wait: bool = True) -> None:
        self.stopped.append(job_id)
        self.history.add_event(job_id, {"event": "stop requested"})
        self.history.update(job_id, state="stopping")

    def view(self, job_id: str, live: bool = True) -> Any:
        return self.history.get(job_id)

    def supervise_once(self, rec: Any) -> None:
        self.looked.append(rec["job_id"])  # its hosts still stop it: it stays stopping


def _job(history: Any, job_id: str, user: str, gpus: int, *, state: str = "queued", priority: int = 0,
         started: float | None = None, ended: float | None = None, **spec: Any) -> None:
    from tui.model.jobspec import JobSpec

    s = JobSpec(name=job_id, command=("true",), workdir="/", nodes=1, gpus_per_node=gpus, priority=priority,
                **spec).to_dict()
    history.create(job_id, job_id, s, state=state, user=user)
    history.update(job_id, priority=priority)
    if started is not None:
        history.update(job_id, started=started, placement=[{"host": "h1", "gpus": list(range(gpus))}])
        history.add_event(job_id, {"event": "started"})
        events = (history.get(job_id) or {})["events"]
        events[-1]["time"] = started
        history.update(job_id, events=events)
    if ended is not None:
        history.update(job_id, ended=ended)


def test_the_queue_orders_one_priority_by_fair_share_and_fifo_by_arrival(tmp_path: Path) -> None:
    import time

    from tui.control.history import History
    from tui.control.queue import JobQueue

    h = History(tmp_path / "h.sqlite")
    now = time.time()
    _job(h, "c-old", "carol", 4, state="succeeded", started=now - 3000, ended=now - 600)  # carol used 4 GPUs
    _job(h, "c1", "carol", 1)
    _job(h, "a1", "alice", 1)
    _job(h, "urgent", "carol", 1, priority=5)
    jm = _Manager(h, {0: "x", 1: "x", 2: "x", 3: "x"})
    fair = JobQueue(jm, fs.QueuePolicy(half_life_s=3600))  # type: ignore[arg-type]
    entries = fair.entries()
    assert [(e.job_id, e.user) for e in entries] == [("urgent", "carol"), ("a1", "alice"), ("c1", "carol")]
    assert entries[1].fairshare == 1.0 and entries[2].fairshare is not None and entries[2].fairshare < 0.6
    fifo = JobQueue(jm, fs.QueuePolicy(order="fifo"))  # type: ignore[arg-type]
    assert [e.job_id for e in fifo.entries()] == ["urgent", "c1", "a1"]
    assert all(e.fairshare is None for e in fifo.entries())


def test_a_job_over_its_quota_waits_naming_it_and_does_not_hold_back_the_next(tmp_path: Path) -> None:
    import time

    from tui.control.history import History
    from tui.control.queue import JobQueue

    h = History(tmp_path / "h.sqlite")
    _job(h, "a0", "alice", 2, state="running", started=time.time() - 60)
    _job(h, "a1", "alice", 1)
    _job(h, "b1", "bob", 1)
    jm = _Manager(h, {0: "a0", 1: "a0"})
    q = JobQueue(jm, fs.QueuePolicy(order="fifo", quotas=(fs.Quota("user", "alice", gpus=2),)))  # type: ignore[arg-type]
    assert q.advance() == ["b1"]
    assert (h.get("a1") or {})["waiting"].startswith("quota of user alice: 2 GPUs at once; 2 held by a0")
    from tui.model.jobspec import JobSpec
    from tui.model.scheduler import PlacementError

    with pytest.raises(PlacementError, match="not started: quota of user alice"):
        q.submit(JobSpec(name="a2", command=("true",), workdir="/", nodes=1, gpus_per_node=1), queue=False,
                 user="alice")


@pytest.mark.parametrize(("gpus", "victims"), [(1, ["v2"]), (2, ["v2", "v1"]), (3, [])])
def test_preemption_stops_the_fewest_newest_preemptible_jobs_that_make_room(
        tmp_path: Path, gpus: int, victims: list[str]) -> None:
    import time

    from tui.control.history import History
    from tui.control.queue import JobQueue
    from tui.model.jobspec import CheckpointSpec

    h = History(tmp_path / "h.sqlite")
    now = time.time()
    ck = {"preemptible": True, "checkpoint": CheckpointSpec(dir="/ck/{job_id}")}
    _job(h, "v1", "bob", 1, state="running", started=now - 60, **ck)
    _job(h, "v2", "bob", 1, state="running", started=now - 30, **ck)
    _job(h, "keep", "bob", 2, state="running", started=now - 10)  # not preemptible
    _job(h, "urgent", "alice", gpus, priority=10)
    jm = _Manager(h, {0: "v1", 1: "v2", 2: "keep", 3: "keep"})
    q = JobQueue(jm, fs.QueuePolicy())  # type: ignore[arg-type]
    assert q.advance() == []
    assert jm.stopped == victims
    waiting = (h.get("urgent") or {})["waiting"]
    if victims:
        assert waiting == f"preempting job {', '.join(victims)} (it starts once they have stopped)"
        assert all((h.get(v) or {})["preempted"] == 1 and fs.preempt_pending(h.get(v) or {}) for v in victims)
        jm.stopped.clear()
        assert q.advance() == [] and jm.stopped == []  # stopping: nothing more is preempted meanwhile
        assert sorted(jm.looked) == sorted(victims)  # the queue looks at them: their end frees the room
    else:
        assert "GPU" in waiting  # 3 GPUs cannot be freed: no job is stopped for nothing
    assert not jm.launched


def test_a_running_job_of_higher_spec_priority_is_never_preempted(tmp_path: Path) -> None:
    import time

    from tui.control.history import History
    from tui.control.queue import JobQueue
    from tui.model.jobspec import CheckpointSpec

    h = History(tmp_path / "h.sqlite")
    # started at once, never queued: only its spec holds its priority
    _job(h, "high", "bob", 4, state="running", started=time.time() - 5, priority=20, preemptible=True,
         checkpoint=CheckpointSpec(dir="/ck"))
    h.update("high", priority=None)
    _job(h, "urgent", "alice", 1, priority=10)
    jm = _Manager(h, {0: "high", 1: "high", 2: "high", 3: "high"})
    assert JobQueue(jm, fs.QueuePolicy()).advance() == [] and jm.stopped == []  # type: ignore[arg-type]


def test_one_round_that_frees_several_gpus_shares_them_as_it_grants_them(tmp_path: Path) -> None:
    """Four GPUs free at once, alice's four jobs first in line, bob's two after, equal shares and
    no past use: each GPU granted counts at once, so the round alternates between them rather
    than giving alice all four (she was ahead only until the first was hers)."""
    from tui.control.history import History
    from tui.control.queue import JobQueue

    h = History(tmp_path / "h.sqlite")
    for job_id, user in (("a1", "alice"), ("a2", "alice"), ("a3", "alice"), ("a4", "alice"),
                         ("b1", "bob"), ("b2", "bob")):
        _job(h, job_id, user, 1)

    class Claiming(_Manager):
        def launch(self, spec: Any, *, job_id: str, capacity: Any = None, **_: Any) -> None:
            super().launch(spec, job_id=job_id)
            self.claims[min(set(range(4)) - set(self.claims))] = job_id
            self.history.update(job_id, state="running")

    jm = Claiming(h, {})
    q = JobQueue(jm, fs.QueuePolicy(half_life_s=3600))  # type: ignore[arg-type]
    assert q.advance() == ["a1", "b1", "a2", "b2"]
    assert [e.job_id for e in q.entries()] == ["a3", "a4"]
    fifo = Claiming(History(tmp_path / "f.sqlite"), {})
    for job_id, user in (("a1", "alice"), ("a2", "alice"), ("a3", "alice"), ("a4", "alice"), ("b1", "bob")):
        _job(fifo.history, job_id, user, 1)
    assert JobQueue(fifo, fs.QueuePolicy(order="fifo")).advance() == ["a1", "a2", "a3", "a4"]  # type: ignore[arg-type]
