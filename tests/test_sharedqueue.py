"""A shared queue on the test bed (simulated GPUs): a user's GPU quota holds their job in the
queue naming the quota until one of theirs ends, and a higher-priority job preempts a
preemptible one, which goes back to the queue and resumes from its checkpoint, each step once.

The controller is the real one, in this process, with its poller running (what ``rigdeck serve``
holds); jobs of several users are submitted through its ``launch(user=...)``, which only an
in-process caller can set. ``rigdeck queue`` and ``rigdeck metrics`` are the real CLI over the
same history."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kit import ROOT, TICKER, wait_until
from tests.kit.bedcli import Cli
from tests.testbed import TestBed
from tui.control.history import History
from tui.control.service import ControllerService
from tui.model.identity import local_user
from tui.model.jobspec import JobSpec, load_jobspec
from tui.model.jobstate import TERMINAL
from tui.model.scheduler import PlacementError
from tui.model.userconfig import load_config
from tui.remote.inventoryfile import load_inventory

pytestmark = pytest.mark.testbed

STEPS = ROOT / "tests" / "jobscripts" / "ckpt_steps.py"


class Shared:
    """The bed's CLI, and a controller service over the same history and config."""

    def __init__(self, cli: Cli, config: str):
        self.cli = cli
        path = cli.tmp / "config.toml"
        path.write_text(config)
        cli.env["RIGDECK_CONFIG"] = str(path)
        self.history = History(cli.tmp / "home" / "history.sqlite")
        self.svc = ControllerService(load_inventory(cli.inventory), history=self.history,
                                     queue_policy=load_config(path).queue)
        self.svc.start(telemetry=False, jobs=True)

    def spec(self, name: str, body: str) -> JobSpec:
        return load_jobspec(self.cli.spec(name, body))

    def state(self, job_id: str) -> str:
        return str((self.history.get(job_id) or {}).get("state"))

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout: float) -> None:
        wait_until(lambda: self.state(job_id) in states, timeout,
                   f"{job_id} to be {' or '.join(states)} (it is {self.state(job_id)})")

    def close(self) -> None:
        for rec in self.history.list():
            if rec["state"] not in TERMINAL:
                try:
                    self.svc.stop(rec["job_id"], grace_s=1.0)
                except Exception:  # the bed's cleanup takes what is left
                    pass
        self.svc.close()


@pytest.fixture
def shared_factory(testbed: TestBed, tmp_path: Path) -> Iterator[Any]:
    made: list[Shared] = []

    def make(config: str) -> Shared:
        made.append(Shared(Cli(testbed, tmp_path), config))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _ticker(gpus: int, **extra: str) -> str:
    lines = [f'command = ["{{python}}", "{TICKER}", "--steps", "100000", "--sleep", "0.5"]',
             f'workdir = "{ROOT}"', "nodes = 1", f"gpus_per_node = {gpus}", *[f"{k} = {v}" for k, v in extra.items()]]
    return "\n".join(lines) + "\n"


def test_a_gpu_quota_holds_alices_third_job_naming_the_quota_until_one_of_hers_ends(shared_factory: Any) -> None:
    s = shared_factory('[[quota]]\nuser = "alice"\ngpus = 4\n')
    a1 = s.svc.launch(s.spec("a1", _ticker(2)), user="alice")
    a2 = s.svc.launch(s.spec("a2", _ticker(2)), user="alice")
    assert a1.state != "queued" and a2.state != "queued", (a1.waiting, a2.waiting)
    a3 = s.svc.launch(s.spec("a3", _ticker(2)), user="alice")
    assert a3.state == "queued", a3
    assert a3.waiting == (f"quota of user alice: 4 GPUs at once; 4 held by {a1.job_id}, {a2.job_id}, this job "
                          "needs 2: it starts when enough of them end"), a3.waiting
    # --no-queue: refused at once, naming the quota
    with pytest.raises(PlacementError, match="not started: quota of user alice: 4 GPUs at once"):
        s.svc.launch(s.spec("a4", _ticker(2)), user="alice", queue=False)
    # the quota holds back alice's jobs only: bob's starts though it came after
    b1 = s.svc.launch(s.spec("b1", _ticker(2)), user="bob")
    assert b1.state != "queued", b1.waiting
    line = s.cli.json("queue")  # the real CLI over the same history and config
    assert [(e["job_id"], e["user"], e["waiting"]) for e in line] == [(a3.job_id, "alice", a3.waiting)]
    assert 0 < line[0]["fairshare"] <= 1
    assert "quota of user alice" in s.cli.run("queue").stdout
    s.svc.stop(a1.job_id)
    s.wait_state(a3.job_id, ("running",), 120)  # the poller starts it once alice holds 2

    def events() -> list[str]:
        return [e["event"] for e in (s.history.get(a3.job_id) or {})["events"]]

    # The queue records "dequeued" once the launch it made returned, a moment after "started".
    wait_until(lambda: "dequeued" in events(), 30, f"{a3.job_id}'s dequeued event")
    assert events()[:1] == ["queued"], events()
    assert (s.history.get(a3.job_id) or {})["user"] == "alice"


def _steps_of(metrics: list[dict[str, Any]], rank: int) -> list[int]:
    return [m["step"] for m in metrics if m.get("rank") == rank and m.get("event") is None and "step" in m]


def test_a_higher_priority_job_preempts_and_the_preempted_job_resumes_from_its_checkpoint(
        shared_factory: Any, tmp_path: Path) -> None:
    s = shared_factory("")  # the defaults: fair share, preemption on
    h1 = s.cli.bed.hosts[0].name
    victim = s.spec("victim", f"""
command = ["{{python}}", "{STEPS}", "--steps", "40", "--sleep", "0.25", "--checkpoint-every", "5"]
workdir = "{ROOT}"
hosts = ["{h1}"]
gpus_per_node = 4
preemptible = true
grace = "2s"
[checkpoint]
dir = "{tmp_path}/ckpt/{{job_id}}"
owner = "all"
""")
    v = s.svc.launch(victim, user="bob")
    assert v.state != "queued", v.waiting

    def reached(step: int) -> bool:
        return max(_steps_of(s.svc.metrics(v.job_id), 0), default=0) >= step

    wait_until(lambda: reached(12), 120, "the victim's step 12")
    urgent = s.spec("urgent", _ticker(4, priority="10", hosts=f'["{h1}"]').replace("100000", "8"))
    u = s.svc.launch(urgent, user="alice")  # the launch follows the preempted job's stop
    s.wait_state(u.job_id, ("running", "succeeded"), 120)
    events = (s.history.get(u.job_id) or {})["events"]
    assert [e.get("jobs") for e in events if e["event"] == "preempting"] == [[v.job_id]], events
    s.wait_state(u.job_id, ("succeeded",), 120)
    s.wait_state(v.job_id, ("succeeded",), 180)  # back in when room frees, and to its end
    rec = s.history.get(v.job_id) or {}
    assert rec["preempted"] == 1 and rec["restarts"] == 1, rec
    names = [e["event"] for e in rec["events"]]
    assert names.index("preempted") < names.index("requeued") < names.index("resumed"), names
    assert next(e for e in rec["events"] if e["event"] == "preempted")["by"] == u.job_id
    # `rigdeck metrics`: every step of every rank once, the resumed attempt's from its checkpoint on
    metrics = s.cli.json("metrics", v.job_id)
    for rank in range(4):
        assert _steps_of(metrics, rank) == list(range(1, 41)), (rank, _steps_of(metrics, rank))
        (resumed,) = [m for m in metrics if m.get("event") == "resumed" and m.get("rank") == rank]
        k = resumed["from_step"]
        assert k >= 10 and k % 5 == 0, resumed
        redone = [m for m in metrics if m.get("rank") == rank and m.get("step") is not None and m.get("restart") == 1]
        assert min(m["step"] for m in redone) == k + 1
    log = s.cli.run("logs", v.job_id, "--rank", "0").stdout
    k0 = next(m["from_step"] for m in metrics if m.get("event") == "resumed" and m.get("rank") == 0)
    assert f"rank 0 resumed from step {k0}" in log
    # at most one checkpoint interval lost: the first attempt got no further than 4 steps past it
    before = log[: log.index(f"rank 0 resumed from step {k0}")]
    last = max(int(line.split("step=")[1].split()[0]) for line in before.splitlines() if "step=" in line)
    assert k0 <= last < k0 + 5, (k0, last)


def test_a_waiting_jobs_priority_moves_it_up_the_line_and_an_ended_job_is_retried_as_its_owners(
        shared_factory: Any) -> None:
    s = shared_factory("")
    fill = [s.svc.launch(s.spec(f"fill{i}", _ticker(4)), user="alice") for i in range(3)]  # every GPU
    assert all(f.state != "queued" for f in fill), [f.waiting for f in fill]
    q1 = s.svc.launch(s.spec("q1", _ticker(4)), user="bob")
    q2 = s.svc.launch(s.spec("q2", _ticker(4)), user="bob")
    assert [e["job_id"] for e in s.cli.json("queue")] == [q1.job_id, q2.job_id]
    out = s.cli.run("priority", q2.job_id, "5").stdout
    assert f"{q2.job_id}: priority 5 (queued, position 1 in the queue)" in out, out
    assert [(e["job_id"], e["priority"]) for e in s.cli.json("queue")] == [(q2.job_id, 5), (q1.job_id, 0)]
    changed = [e for e in (s.history.get(q2.job_id) or {})["events"] if e["event"] == "reprioritised"]
    assert [(e["from"], e["to"], e["by"]) for e in changed] == [(0, 5, local_user())]
    bad = s.cli.run("priority", q2.job_id, "high", check=False)
    assert bad.returncode == 2 and "invalid int value: 'high'" in bad.stderr
    running = s.cli.run("retry", fill[0].job_id, check=False)
    assert running.returncode == 2 and "only an ended job is retried (stop it first)" in running.stderr
    s.svc.stop(fill[0].job_id)
    s.wait_state(q2.job_id, ("running",), 120)  # the higher priority takes the freed GPUs
    assert s.state(q1.job_id) == "queued"
    again = s.cli.json("retry", fill[0].job_id)
    assert again["job_id"] != fill[0].job_id and again["state"] == "queued", again
    new, old = s.history.get(again["job_id"]) or {}, s.history.get(fill[0].job_id) or {}
    assert new["user"] == "alice" and new["spec"] == old["spec"]  # her work, as it was
    assert [(e["event"], e["job"], e["by"]) for e in new["events"] if e["event"] == "retry of"] == [
        ("retry of", fill[0].job_id, local_user())]
    assert [e["job"] for e in old["events"] if e["event"] == "retried"] == [again["job_id"]]
    assert [e["job_id"] for e in s.cli.json("queue")] == [q1.job_id, again["job_id"]]
