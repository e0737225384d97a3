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
