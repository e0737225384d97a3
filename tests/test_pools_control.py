"""The controller's rules for a job made of worker pools (docs/contracts.md, "Worker pools:
controller rules and what the faces show"): the primary's success ends the job, a failed host
fails the gang, a failed evaluator that continues is reported once per attempt.

The hosts are a double here: their job states as the agents report them (``state.json`` with
``replicas`` and ``primary_succeeded``), recorded from the contract's shapes; the same rules run
against real hosts in the test bed's end-to-end test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tui.control.history import History
from tui.control.jobs import JobManager, overall_state
from tui.model.jobspec import jobspec_from_toml
from tui.model.jobstate import describe_cause
from tui.model.jobview import JobView
from tui.model.poolview import pool_lines, pools_view
from tui.model.scheduler import Placement
from tui.remote.agentclient import TypedAgents
from tui.remote.transport import TransportError

# 1 primary (h1), 2 workers (h1, h2), 1 evaluator (h3): one plan node per replica.
PLACEMENT = [
    {"host": "h1", "address": "10.9.0.1", "slots": 1, "gpus": [0], "ranks": [0], "pool": "primary", "replica": 0},
    {"host": "h1", "address": "10.9.0.1", "slots": 1, "gpus": [1], "ranks": [1], "pool": "worker", "replica": 0},
    {"host": "h2", "address": "10.9.0.2", "slots": 1, "gpus": [0], "ranks": [2], "pool": "worker", "replica": 1},
    {"host": "h3", "address": "10.9.0.3", "slots": 1, "gpus": [], "ranks": [3], "pool": "evaluator", "replica": 0},
]
# The history's copy of the spec, with the pools as tui.model.poolspec writes them.
SPEC = {**jobspec_from_toml('name = "ps"\ncommand = ["true"]\nworkdir = "/tmp"\ngrace = 7\n').to_dict(),
        "pools": [{"role": "primary", "replicas": 1}, {"role": "worker", "replicas": 2},
                  {"role": "evaluator", "replicas": 1, "on_failure": "continue"}]}


def replica(node_index: int, pool: str, idx: int, state: str = "running", **kw: Any) -> dict[str, Any]:
    return {"node_index": node_index, "pool": pool, "replica": idx, "ranks": [node_index], "state": state,
            "exit_code": None, "signal": None, "message": None, **kw}


def host(state: str, replicas: list[dict[str, Any]], restart_count: int = 0, **kw: Any) -> dict[str, Any]:
    return {"state": state, "restart_count": restart_count, "replicas": replicas, **kw}


def running() -> dict[str, dict[str, Any]]:
    return {
        "h1": host("running", [replica(0, "primary", 0), replica(1, "worker", 0)]),
        "h2": host("running", [replica(2, "worker", 1)]),
        "h3": host("running", [replica(3, "evaluator", 0)]),
    }


class _Hosts(TypedAgents):
    """Stands in for the controller: each host's ``job_status``; ``job_stop`` stops a host's
    replicas (as its agent would) and is recorded with its grace."""

    def __init__(self, states: dict[str, dict[str, Any]]):
        self.states = states
        self.stops: list[tuple[tuple[str, ...], float | None]] = []
        self.finishing: set[str] = set()  # hosts "stopping" by themselves: done at the next look

    def request_many(self, hosts: list[str], method: str, **kw: Any) -> dict[str, Any]:
        if method == "job_stop":
            self.stops.append((tuple(hosts), kw.get("grace_s")))
            for h in hosts:
                st = self.states[h]
                st["state"] = "stopped"
                st["replicas"] = [{**r, "state": "stopped"} if r["state"] == "running" else r for r in st["replicas"]]
            return {h: {"stopped": True} for h in hosts}
        assert method == "job_status", method
        out = {h: dict(self.states[h]) for h in dict.fromkeys(hosts)}
        for h in self.finishing & set(out):
            self.states[h]["state"] = "succeeded"
        return out


def _job(tmp_path: Path, restarts: int = 0, max_restarts: int = 0) -> History:
    history = History(tmp_path / "history.sqlite")
    spec = {**SPEC, "restart": {**SPEC["restart"], "max_restarts": max_restarts}}
    history.create("j1", "ps", spec, state="running")
    history.update("j1", placement=PLACEMENT, restarts=restarts,
                   pool_sizing={"text": "reduction servers 1 x 10 Gbps = 10 Gbps < workers 3 x 10 Gbps = 30 Gbps: "
                                        "3 would match",
                                "ok": False})
    return history


@pytest.mark.parametrize("primary_host", ["succeeded", "stopping"])
def test_the_primary_succeeding_stops_the_other_pools_and_the_job_succeeded(tmp_path: Path, primary_host: str) -> None:
    history = _job(tmp_path)
    states = running()
    # The primary's ranks exited 0: its host stops its worker (still "stopping", or done) and
    # ends succeeded; it is not asked to stop by the controller.
    states["h1"] = host(primary_host, [replica(0, "primary", 0, "succeeded", exit_code=0),
                                       replica(1, "worker", 0, "stopped")], primary_succeeded=True)
    hosts = _Hosts(states)
    hosts.finishing = {"h1"} if primary_host == "stopping" else set()
    assert overall_state({h: dict(s) for h, s in states.items()}) == "succeeded"
    jm = JobManager(hosts, history)  # type: ignore[arg-type]
    jm.scheduler.adopt("j1", Placement.from_plan_nodes(PLACEMENT))
    jm.supervise_once(history.get("j1"))  # type: ignore[arg-type]
    rec = history.get("j1")
    assert rec is not None and rec["state"] == "succeeded"  # not "stopped"
    # The hosts still running replicas were stopped, with the job's grace; the primary's was not.
    assert hosts.stops == [(("h2", "h3"), 7.0)]
    assert rec["events"][-1]["event"] == "succeeded"
    assert rec["events"][-1]["primary_succeeded"] == "h1"
    assert rec["events"][-1]["stopped_hosts"] == ["h2", "h3"]
    assert "j1" not in jm.scheduler.reservations()  # its GPUs given back
    view = pools_view(rec, hosts.states)
    assert view is not None
    assert [(p.role, p.state) for p in view.pools] == [("primary", "succeeded"), ("worker", "stopped"),
                                                       ("evaluator", "stopped")]


def test_hosts_that_stopped_after_the_primary_succeeded_still_make_the_job_succeeded() -> None:
    states: dict[str, Any] = {"h1": host("succeeded", [], primary_succeeded=True), "h2": host("stopped", [])}
    assert overall_state(states) == "succeeded"
    # Without the primary's word, a host that stopped makes it stopped, as for any job.
    assert overall_state({"h1": host("succeeded", []), "h2": host("stopped", [])}) == "stopped"
    # The primary decides: a worker that errors once its peer is gone (a collective cut short),
    # or a host out of reach, does not undo its success.
    assert overall_state({"h1": host("succeeded", [], primary_succeeded=True), "h2": host("failed", [])}) == "succeeded"
    assert overall_state({"h1": host("succeeded", [], primary_succeeded=True),
                          "h2": TransportError("h2", "unreachable")}) == "succeeded"
    # Before it, a failure anywhere fails the gang.
    assert overall_state({"h1": host("running", []), "h2": host("failed", [])}) == "failed"


def test_a_worker_failing_fails_the_gang_and_the_cause_names_the_pool(tmp_path: Path) -> None:
    history = _job(tmp_path)
    states = running()
    cause = {"host": "h2", "rank": 2, "exit_code": 1, "signal": None, "pool": "worker", "replica": 1}
    states["h2"] = host("failed", [replica(2, "worker", 1, "failed", exit_code=1)], cause=cause, ended=5.0)
    hosts = _Hosts(states)
    jm = JobManager(hosts, history)  # type: ignore[arg-type]
    jm.supervise_once(history.get("j1"))  # type: ignore[arg-type]
    rec = history.get("j1")
    assert rec is not None and rec["state"] == "failed"
    assert rec["cause"]["pool"] == "worker"
    assert describe_cause(rec["cause"]) == "worker 1 on h2 (rank 2) exited 1"
    assert hosts.stops and set(hosts.stops[0][0]) == {"h1", "h3"}  # the rest of the gang stopped
    assert not [e for e in rec["events"] if e["event"] == "replica failed"]  # a gang failure, not a report


def test_a_failed_evaluator_that_continues_is_reported_once_per_attempt_and_training_goes_on(tmp_path: Path) -> None:
    history = _job(tmp_path)
    states = running()
    states["h3"] = host("succeeded", [replica(3, "evaluator", 0, "failed", signal=9)])
    hosts = _Hosts(states)
    jm = JobManager(hosts, history)  # type: ignore[arg-type]
    for _ in range(3):  # every look sees it; one event
        jm.supervise_once(history.get("j1"))  # type: ignore[arg-type]
    rec = history.get("j1")
    assert rec is not None and rec["state"] == "running"
    assert hosts.stops == []  # nothing stopped
    failed = [e for e in rec["events"] if e["event"] == "replica failed"]
    assert len(failed) == 1
    e = failed[0]
    assert (e["pool"], e["replica"], e["host"], e["signal"], e["exit_code"], e["continues"], e["restart_count"]) == \
        ("evaluator", 0, "h3", 9, None, True, 0)
    assert e["message"] == 'evaluator 0 on h3 was killed by signal 9; training continues (on_failure = "continue")'
    # The next attempt's failure is its own event.
    history.update("j1", restarts=1)
    for st in states.values():
        st["restart_count"] = 1
    states["h3"]["replicas"] = [replica(3, "evaluator", 0, "failed", exit_code=3)]
    jm.supervise_once(history.get("j1"))  # type: ignore[arg-type]
    rec = history.get("j1")
    assert rec is not None
    failed = [e for e in rec["events"] if e["event"] == "replica failed"]
    assert [(e["restart_count"], e["exit_code"]) for e in failed] == [(0, None), (1, 3)]
    assert failed[1]["message"].startswith("evaluator 0 on h3 exited 3; training continues")
    # What the faces show: the evaluator failed, the rest runs, both events listed.
    view = pools_view(rec, hosts.states)
    assert view is not None
    assert [(p.role, p.replicas, p.hosts, p.state) for p in view.pools] == [
        ("primary", 1, ("h1",), "running"), ("worker", 2, ("h1", "h2"), "running"),
        ("evaluator", 1, ("h3",), "failed")]
    lines = pool_lines(view)
    assert any(line.startswith("evaluator") and line.rstrip().endswith("failed") for line in lines)
    assert "sizing   reduction servers 1 x 10 Gbps = 10 Gbps < workers 3 x 10 Gbps = 30 Gbps: 3 would match" in lines
    assert lines[-1].startswith("replica  evaluator 0 on h3 exited 3")


def test_an_evaluator_set_to_stop_fails_the_gang_not_a_report(tmp_path: Path) -> None:
    history = History(tmp_path / "history.sqlite")
    spec = {**SPEC, "pools": [{"role": "primary"}, {"role": "evaluator", "on_failure": "stop"}]}
    history.create("j1", "ps", spec, state="running")
    history.update("j1", placement=[PLACEMENT[0], PLACEMENT[3]])
    # A host whose evaluator failed but did not say the gang must stop: no report either.
    states = {"h1": host("running", [replica(0, "primary", 0)]),
              "h3": host("running", [replica(1, "evaluator", 0, "failed", exit_code=1)])}
    jm = JobManager(_Hosts(states), history)  # type: ignore[arg-type]
    jm.supervise_once(history.get("j1"))  # type: ignore[arg-type]
    rec = history.get("j1")
    assert rec is not None and not [e for e in rec["events"] if e["event"] == "replica failed"]


def test_the_view_carries_the_pools_and_their_sizing_across_json(tmp_path: Path) -> None:
    history = _job(tmp_path)
    states = running()
    states["h2"]["replicas"] = [replica(2, "worker", 1, "stopping")]
    jm = JobManager(_Hosts(states), history)  # type: ignore[arg-type]
    v = jm.view("j1")
    assert v.pools is not None
    j = v.to_json()
    assert j["pools"] == [
        {"role": "primary", "replicas": 1, "hosts": ["h1"], "state": "running", "replica_states": ["running"],
         "on_failure": "stop"},
        {"role": "worker", "replicas": 2, "hosts": ["h1", "h2"], "state": "running",
         "replica_states": ["running", "stopping"], "on_failure": "stop"},
        {"role": "evaluator", "replicas": 1, "hosts": ["h3"], "state": "running", "replica_states": ["running"],
         "on_failure": "continue"},
    ]
    assert j["pool_sizing"]["ok"] is False
    back = JobView.from_json(j)
    assert back.pools == v.pools
    assert back.pools is not None and back.pools.pool("worker") is not None
    assert back.pools.pools[1].state_text == "1 running · 1 stopping"
    # Hosts last seen running a job that has since ended (the look that recorded its end):
    # those replicas were stopped with it.
    ended = pools_view({**history.get("j1"), "state": "succeeded"}, running())  # type: ignore[dict-item]
    assert ended is not None and {p.state for p in ended.pools} == {"stopped"}
    # A job without pools says so: no rows, no sizing.
    history.create("j2", "plain", {"name": "plain", "command": ["true"]}, state="running")
    history.update("j2", placement=[{"host": "h1", "slots": 1, "gpus": [], "ranks": [0]}])
    plain = jm.view("j2", live=False).to_json()
    assert plain["pools"] == [] and plain["pool_sizing"] is None
    assert JobView.from_json(plain).pools is None


def test_a_host_not_yet_told_of_a_job_being_started_reads_as_starting_not_out_of_reach() -> None:
    from tui.control.jobs import not_yet_told
    from tui.remote.agentlink import AgentError
    from tui.remote.transport import TransportError

    told = AgentError("h2", "bad_params", "no job j1 on this host")
    down = TransportError("h3", "connection refused")
    hosts = {"h1": {"state": "running"}, "h2": told, "h3": down}
    starting = not_yet_told({"job_id": "j1", "state": "starting"}, hosts)
    assert starting == {"h1": {"state": "running"}, "h2": {"state": "starting"}, "h3": down}
    assert overall_state({h: s for h, s in starting.items() if h != "h3"}) == "starting"
    assert not_yet_told({"job_id": "j1", "state": "pending"}, hosts)["h2"] == {"state": "starting"}
    # once it runs (or for another job's id), a host without it is not explained away
    assert not_yet_told({"job_id": "j1", "state": "running"}, hosts) is hosts
    assert not_yet_told({"job_id": "j2", "state": "starting"}, hosts)["h2"] is told
