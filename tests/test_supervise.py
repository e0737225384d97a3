"""Who acts on a job: the lease a controller takes to apply the gang rules, and when it lets go.

The hosts are a double here (their job states as agents report them); the same path runs against
real hosts in tests/test_jobs.py and tests/test_ui_e2e.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tui.control.history import History
from tui.control.jobs import JobManager
from tui.remote.agentclient import TypedAgents


class _Hosts(TypedAgents):
    """Stands in for the controller: each host's answer to ``job_status``."""

    def __init__(self, states: dict[str, dict[str, Any]]):
        self.states = states

    def request_many(self, hosts: list[str], method: str, **kw: Any) -> dict[str, Any]:
        assert method == "job_status", method
        return {h: dict(self.states[h]) for h in hosts}


def _running_job(tmp_path: Path) -> History:
    history = History(tmp_path / "history.sqlite")
    history.create("j1", "train", {"name": "train", "command": ["true"]}, state="running")
    history.update("j1", placement=[{"host": "h1", "gpus": [], "ranks": [0]},
                                    {"host": "h2", "gpus": [], "ranks": [1]}])
    return history


def test_a_controller_that_only_looks_does_not_keep_the_job_from_the_next(tmp_path: Path) -> None:
    history = _running_job(tmp_path)
    hosts = _Hosts({"h1": {"state": "running"}, "h2": {"state": "stopping"}})
    # `rigdeck status`, or a `launch` without --wait, sees a change, applies it and exits.
    JobManager(hosts, history).supervise_once(history.get("j1"))  # type: ignore[arg-type]
    rec = history.get("j1")
    assert rec is not None and rec["state"] == "stopping"
    assert rec["supervisor"] is None  # it let go
    # The app sees the next change at once, not a minute later.
    hosts.states = {"h1": {"state": "succeeded"}, "h2": {"state": "succeeded"}}
    JobManager(hosts, history).supervise_once(history.get("j1"))  # type: ignore[arg-type]
    rec = history.get("j1")
    assert rec is not None and rec["state"] == "succeeded"


def test_a_waiting_supervisor_keeps_its_lease_and_others_only_look(tmp_path: Path) -> None:
    history = _running_job(tmp_path)
    hosts = _Hosts({"h1": {"state": "running"}, "h2": {"state": "stopping"}})
    waiter = JobManager(hosts, history)  # type: ignore[arg-type]
    assert history.try_lease("j1", waiter.owner, 60.0)  # as `launch --wait` does each round
    waiter.supervise_once(history.get("j1"))  # type: ignore[arg-type]
    rec = history.get("j1")
    assert rec is not None and rec["state"] == "stopping" and rec["supervisor"] == waiter.owner
    hosts.states = {"h1": {"state": "succeeded"}, "h2": {"state": "succeeded"}}
    JobManager(hosts, history).supervise_once(history.get("j1"))  # type: ignore[arg-type]
    rec = history.get("j1")
    assert rec is not None and rec["state"] == "stopping"  # not its job to say
    waiter.supervise_once(history.get("j1"))  # type: ignore[arg-type]
    rec = history.get("j1")
    assert rec is not None and rec["state"] == "succeeded"


class _Starts(TypedAgents):
    """Stands in for the controller at a launch: h2's start breaks (a bug, not the network)."""

    def __init__(self) -> None:
        from tui.model.inventory import HostSpec, Inventory

        self.inventory = Inventory(hosts=(HostSpec(name="h1", address="10.9.0.1"),
                                          HostSpec(name="h2", address="10.9.0.2")),
                                   path=None, known_hosts=Path("/dev/null"))
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    def request(self, host: str, method: str, timeout: float = 30.0, **params: Any) -> Any:
        self.calls.append((method, (host,)))
        if method == "probe_port":
            return {"port": 29500}
        if method == "job_start":
            if host == "h2":
                raise RuntimeError("boom")
            return {"job_dir": "/x", "jobhost_pid": 1}
        raise AssertionError(method)

    def request_many(self, hosts: list[str], method: str, **kw: Any) -> dict[str, Any]:
        self.calls.append((method, tuple(hosts)))
        return {h: {} for h in hosts}


def test_a_start_that_breaks_anywhere_stops_what_started_and_leaves_no_job_starting(tmp_path: Path) -> None:
    import pytest

    from tui.model.jobspec import jobspec_from_toml
    from tui.model.scheduler import Placement

    history = History(tmp_path / "history.sqlite")
    ctl = _Starts()
    jm = JobManager(ctl, history)  # type: ignore[arg-type]
    spec = jobspec_from_toml('name = "t"\ncommand = ["true"]\nworkdir = "/tmp"\nhosts = ["h1", "h2"]\n')
    placement = Placement.from_plan_nodes([{"host": "h2", "address": "10.9.0.2", "slots": 1, "gpus": [0]},
                                           {"host": "h1", "address": "10.9.0.1", "slots": 1, "gpus": [1]}])
    history.create("t-1", "t", spec.to_dict(), state="pending")
    with pytest.raises(RuntimeError, match="boom"):
        jm._start("t-1", spec, placement, restart_count=0)
    rec = history.get("t-1")
    assert rec is not None and rec["state"] == "failed"
    assert rec["cause"]["message"] == "start failed: RuntimeError: boom"
    assert ("job_stop", ("h1",)) in ctl.calls  # h1 had started: stopped
    assert ("job_release", ("h2",)) in ctl.calls  # h2's claim given back


class _Metrics(TypedAgents):
    """Stands in for the controller: one host whose rank wrote odd records."""

    def request(self, host: str, method: str, timeout: float = 30.0, **params: Any) -> Any:
        assert method == "job_metrics"
        if host != "h1":
            return {}
        records = [{"step": "warmup", "loss": 9.0}, {"step": 1, "loss": 0.5, "restart": 0},
                   {"step": 1, "loss": 0.4, "restart": 1}, {"step": None, "event": "checkpoint"}]
        return {"0": {"records": records, "next_offset": 1, "more": False, "offset_key": "0"}}


def test_metrics_keep_the_newest_attempt_of_a_step_and_survive_a_step_that_is_not_a_number(tmp_path: Path) -> None:
    history = _running_job(tmp_path)
    got = JobManager(_Metrics(), history).metrics("j1")  # type: ignore[arg-type]
    # A step that is not a number sorts first (with the event), instead of breaking the sort;
    # attempt 1's step 1 replaced attempt 0's.
    assert sorted((str(r["step"]), r.get("loss")) for r in got) == [("1", 0.4), ("None", None), ("warmup", 9.0)]
    assert got[-1]["step"] == 1


def test_a_stop_is_done_only_when_no_host_has_a_process_or_a_claim_of_the_job_left() -> None:
    """``left_behind``: what keeps ``rigdeck stop`` waiting (and a launch behind it queued)."""
    from tui.control.jobs import left_behind
    from tui.remote.transport import TransportError

    done = {"state": "stopped", "tagged_processes": 0, "claims_held": []}
    assert left_behind({"h1": done, "h2": dict(done)}) == {}
    assert left_behind({"h1": {"state": "stopped"}}) == {}  # an older agent: no claim key, no process count
    left = left_behind({
        "h1": done,
        "h2": {**done, "state": "stopping"},
        "h3": {**done, "tagged_processes": 1},  # the job host, exiting after it wrote its end
        "h4": {**done, "claims_held": [0, 2]},
        "h5": {**done, "claims_held": None},  # the claim directory was busy: not known yet
        "h6": TransportError("h6", "connection refused"),
    })
    assert left == {"h2": "still stopping", "h3": "1 process left", "h4": "GPU 0,2 still claimed",
                    "h5": "GPU claims not read yet", "h6": left["h6"]}
    assert left["h6"].startswith("unreachable (")


class _Relaunch(TypedAgents):
    """Stands in for the controller at a preempted job's relaunch: h1 still keeps the end of the
    attempt that was preempted (its ``state.json``) until this attempt's ``job_start`` reaches it."""

    def __init__(self) -> None:
        from tui.model.inventory import HostSpec, Inventory

        self.inventory = Inventory(hosts=(HostSpec(name="h1", address="10.9.0.1"),), path=None,
                                   known_hosts=Path("/dev/null"))
        self.job: dict[str, Any] = {"state": "stopped", "restart_count": 0, "tagged_processes": 0, "claims_held": []}

    def request(self, host: str, method: str, timeout: float = 30.0, **params: Any) -> Any:
        if method == "job_check":
            return {"problems": [], "free_mb": 1000.0}
        if method == "job_claim":
            return {"claimed": params["gpus"]}
        if method == "probe_port":
            return {"port": 29500}
        if method == "job_start":
            self.job = {"state": "starting", "restart_count": params["plan"]["restart_count"]}
            return {"job_dir": "/x", "jobhost_pid": 1}
        raise AssertionError(method)

    def request_many(self, hosts: list[str], method: str, **kw: Any) -> dict[str, Any]:
        if method == "job_status":
            return {h: dict(self.job) for h in hosts}
        return {h: {} for h in hosts}


def test_a_look_while_a_preempted_job_restarts_does_not_take_the_preempted_attempts_end_for_this_ones(
        tmp_path: Path) -> None:
    """A preempted job back from the queue keeps its id, and its host says ``stopped`` (how the
    preempted attempt ended) until the new start reaches it. A look at the job meanwhile (another
    controller, or a launch following the stop in another thread) must not requeue it again: that
    cleared its placement under the running start, and the job, started, read ``starting``
    forever (fresh-clone run 29)."""
    from tui.model.jobspec import jobspec_from_toml
    from tui.model.scheduler import HostCapacity

    history = History(tmp_path / "history.sqlite")
    ctl = _Relaunch()
    spec = jobspec_from_toml('name = "victim"\ncommand = ["true"]\nworkdir = "/tmp"\nhosts = ["h1"]\n'
                             'gpus_per_node = 1\npreemptible = "restart"\n')
    history.create("v-1", "victim", spec.to_dict(), state="queued", user="bob")
    history.update("v-1", preempted=1, events=[
        {"time": 1.0, "event": "started", "restart_count": 0, "hosts": ["h1"], "gpus": 1},
        {"time": 2.0, "event": "stop requested", "grace_s": 2.0, "by": "bob"},
        {"time": 2.0, "event": "preempted", "by": "u-1"},
        {"time": 3.0, "event": "requeued", "waiting": "preempted by job u-1"}])
    assert history.take_queued("v-1")  # the queue takes it from the line, as JobQueue._start does
    other = JobManager(ctl, history)  # type: ignore[arg-type]  # another controller, looking
    looks: list[str] = []

    def look(job_id: str, state: str, fields: dict[str, Any]) -> None:
        if job_id == "v-1" and state in ("pending", "starting") and not looks:
            looks.append(state)  # one look at a time (its own writes announce too)
            other.supervise_once(history.get("v-1"))  # type: ignore[arg-type]
            looks.remove(state)

    history.observers.append(look)
    jm = JobManager(ctl, history)  # type: ignore[arg-type]
    capacity = [HostCapacity("h1", "10.9.0.1", True, 8, (0,), (), True, "Simulated GPU")]
    jm.launch(spec, job_id="v-1", look=False, capacity=capacity)
    history.observers.remove(look)
    rec = history.get("v-1")
    assert rec is not None and rec["state"] == "running", rec["state"]
    assert [n["host"] for n in rec["placement"] or ()] == ["h1"] and rec["restarts"] == 1
    names = [e["event"] for e in rec["events"]]
    assert names.count("requeued") == 1 and names[-2:] == ["resumed", "started"], names
    # The hosts are told: what they say from now on is this attempt's, and is read.
    ctl.job = {"state": "running", "restart_count": 1}
    jm.supervise_once(history.get("v-1"))  # type: ignore[arg-type]
    assert (history.get("v-1") or {})["state"] == "running"
    ctl.job = {"state": "succeeded", "restart_count": 1, "tagged_processes": 0, "claims_held": []}
    jm.supervise_once(history.get("v-1"))  # type: ignore[arg-type]
    assert (history.get("v-1") or {})["state"] == "succeeded"


def test_a_preempted_job_back_in_the_queue_is_stopped_once_its_last_hosts_hold_nothing_of_it(
        tmp_path: Path) -> None:
    """The launch that preempted a job follows that job's stop (``await_stopped``). Once the
    preempted job is back in the queue (no placement any more) it is done as soon as the hosts
    it ran on hold no process and no GPU claim of it: not a job "recorded queued" waited on
    until the timeout, while the launch that made room stays blocked."""
    history = History(tmp_path / "history.sqlite")
    ctl = _Relaunch()
    history.create("v-1", "victim", {"name": "victim"}, state="queued", user="bob")
    history.update("v-1", preempted=1, restarts=0, placement=None, events=[
        {"time": 1.0, "event": "started", "restart_count": 0, "hosts": ["h1"], "gpus": 1},
        {"time": 2.0, "event": "preempted", "by": "u-1"},
        {"time": 3.0, "event": "requeued", "waiting": "preempted by job u-1"}])
    jm = JobManager(ctl, history)  # type: ignore[arg-type]
    ctl.job = {"state": "stopped", "restart_count": 0, "tagged_processes": 0, "claims_held": [0]}
    assert jm.await_stopped(["v-1"], timeout=0.0) == {"v-1": {"h1": "GPU 0 still claimed"}}
    ctl.job = {"state": "stopped", "restart_count": 0, "tagged_processes": 0, "claims_held": []}
    assert jm.await_stopped(["v-1"], timeout=0.0) == {}
    assert (history.get("v-1") or {})["state"] == "queued"  # looked at, not changed


class _TwoHosts(_Relaunch):
    """Two hosts that start the job when told; ``on_start`` runs as the start reaches the last."""

    def __init__(self) -> None:
        from tui.model.inventory import HostSpec, Inventory

        self.inventory = Inventory(hosts=(HostSpec(name="h1", address="10.9.0.1"),
                                          HostSpec(name="h2", address="10.9.0.2")),
                                   path=None, known_hosts=Path("/dev/null"))
        self.jobs: dict[str, dict[str, Any]] = {}
        self.on_start: Any = None

    def request(self, host: str, method: str, timeout: float = 30.0, **params: Any) -> Any:
        if method == "job_start":
            self.jobs[host] = {"state": "running", "restart_count": params["plan"]["restart_count"]}
            if len(self.jobs) == 2 and self.on_start is not None:
                self.on_start()
            return {"job_dir": "/x", "jobhost_pid": 1}
        return super().request(host, method, timeout, **params)

    def request_many(self, hosts: list[str], method: str, **kw: Any) -> dict[str, Any]:
        if method == "job_status":
            return {h: dict(self.jobs[h]) if h in self.jobs else RuntimeError(f"no job j on {h}") for h in hosts}
        return {h: {} for h in hosts}


def _two_host_spec() -> Any:
    from tui.model.jobspec import jobspec_from_toml

    return jobspec_from_toml('name = "t"\ncommand = ["true"]\nworkdir = "/tmp"\nhosts = ["h1", "h2"]\n')


def _capacity() -> Any:
    from tui.model.scheduler import HostCapacity

    return [HostCapacity("h1", "10.9.0.1", True, 8, (0,), (), True, "Simulated GPU"),
            HostCapacity("h2", "10.9.0.2", True, 8, (0,), (), True, "Simulated GPU")]


def test_a_start_whose_starter_died_before_recording_it_is_recorded_by_the_next_look(tmp_path: Path) -> None:
    """The server killed after telling every host to start a job and before writing its start
    down (fresh-clone run 17): the job runs with its record still ``starting``. The next
    controller's look records the start (once, from the placement) before anything else, so the
    job never runs or ends without its ``started`` event."""
    from tui.model.scheduler import Placement

    history = History(tmp_path / "history.sqlite")
    ctl = _TwoHosts()
    spec = _two_host_spec()
    placement = Placement.from_plan_nodes([{"host": "h1", "address": "10.9.0.1", "slots": 1, "gpus": [0]},
                                           {"host": "h2", "address": "10.9.0.2", "slots": 1, "gpus": [0]}])
    # What the kill -9 leaves: the record as _start_on wrote it before telling the hosts, and
    # both hosts running the attempt.
    history.create("j", "t", spec.to_dict(), state="pending")
    history.update("j", state="starting", placement=placement.to_plan_nodes(), restarts=0)
    ctl.jobs = {"h1": {"state": "running", "restart_count": 0}, "h2": {"state": "running", "restart_count": 0}}
    nxt = JobManager(ctl, history)  # type: ignore[arg-type]  # the next server
    nxt.supervise_once(history.get("j"))  # type: ignore[arg-type]
    rec = history.get("j")
    assert rec is not None and rec["state"] == "running"
    started = [e for e in rec["events"] if e["event"] == "started"]
    assert len(started) == 1 and started[0]["hosts"] == ["h1", "h2"] and started[0]["gpus"] == 2
    assert started[0]["restart_count"] == 0 and rec["started"] is not None
    ctl.jobs = {h: {"state": "succeeded", "restart_count": 0, "tagged_processes": 0, "claims_held": []}
                for h in ("h1", "h2")}
    nxt.supervise_once(history.get("j"))  # type: ignore[arg-type]
    rec = history.get("j")
    assert rec is not None and rec["state"] == "succeeded"
    assert [e["event"] for e in rec["events"]] == ["started", "succeeded"]


def test_a_look_that_records_a_start_first_is_not_doubled_or_undone_by_the_starter(tmp_path: Path) -> None:
    """Another controller looks as the start reaches the last host, sees every host run it and
    end, and records the start and the end; the starter, back from its hosts, writes neither
    its ``started`` again nor ``running`` over the end."""
    history = History(tmp_path / "history.sqlite")
    ctl = _TwoHosts()
    other = JobManager(ctl, history)  # type: ignore[arg-type]

    def look() -> None:
        for h in ctl.jobs:
            ctl.jobs[h] = {"state": "succeeded", "restart_count": 0, "tagged_processes": 0, "claims_held": []}
        other.supervise_once(history.get("j"))  # type: ignore[arg-type]

    ctl.on_start = look
    jm = JobManager(ctl, history)  # type: ignore[arg-type]
    jm.launch(_two_host_spec(), job_id="j", look=False, capacity=_capacity())
    rec = history.get("j")
    assert rec is not None and rec["state"] == "succeeded", rec["state"]
    assert [e["event"] for e in rec["events"]] == ["started", "succeeded"], rec["events"]
    assert rec["events"][0]["seen"] is True  # the look's, not the starter's


def test_a_look_during_a_start_records_nothing_until_every_host_runs_it(tmp_path: Path) -> None:
    """Halfway through a start (one host told, the other not yet) a look leaves the record as
    it is: the start is the starter's to record."""
    history = History(tmp_path / "history.sqlite")
    ctl = _TwoHosts()
    history.create("j", "t", _two_host_spec().to_dict(), state="starting")
    history.update("j", placement=[{"host": "h1", "gpus": [0]}, {"host": "h2", "gpus": [0]}], restarts=0)
    ctl.jobs = {"h1": {"state": "running", "restart_count": 0}}
    JobManager(ctl, history).supervise_once(history.get("j"))  # type: ignore[arg-type]
    rec = history.get("j")
    assert rec is not None and rec["state"] == "starting" and rec["events"] in ([], None)


def test_a_look_waits_for_a_silent_host_only_until_every_other_host_says_its_ranks_wait_asleep() -> None:
    """A cut link keeps its request waiting to its timeout; a look does not wait that long where
    the job waits for that host: the hosts that answered are asked again while it is silent, and
    once each says its ranks are asleep (``idle``) and the silent one has kept the look waiting
    SILENT_S, it is out of reach for this look; not before either holds."""
    import threading
    import time

    from tui.control import jobs as jobs_mod
    from tui.remote.transport import TransportError

    def look(idle_after: float) -> tuple[dict[str, Any], float, dict[str, int]]:
        cut = threading.Event()
        t0 = time.monotonic()
        asked: dict[str, int] = {"h1": 0, "h2": 0}

        def ask(h: str) -> Any:
            asked[h] += 1
            if h == "h2":
                cut.wait(30)  # the cut link: no answer until the test ends
                return TransportError(h, "timed out")
            asleep = time.monotonic() - t0 > idle_after
            return {"state": "running", **({"idle": {"stalled_s": 1.6, "asleep_s": 1.6}} if asleep else {})}

        try:
            return jobs_mod._states_until_stalled(ask, ["h1", "h2"]), time.monotonic() - t0, asked
        finally:
            cut.set()

    for idle_after in (1.0, jobs_mod.SILENT_S + 0.6):  # asleep before the silence is long enough; after
        got, took, asked = look(idle_after)
        assert isinstance(got["h2"], TransportError) and "every other host said its ranks wait asleep" in str(got["h2"])
        assert got["h1"]["idle"] and asked["h1"] >= 2 and asked["h2"] == 1
        least = max(idle_after, jobs_mod.SILENT_S)
        assert least <= took < least + jobs_mod.REASK_S + 1.0, (idle_after, took)

    # a slow host while the others still step: the look waits for its answer
    def slow(h: str) -> Any:
        if h == "h2":
            time.sleep(jobs_mod.SILENT_S + 0.5)
        return {"state": "running", "host": h}

    got = jobs_mod._states_until_stalled(slow, ["h1", "h2"])
    assert got == {"h1": {"state": "running", "host": "h1"}, "h2": {"state": "running", "host": "h2"}}
