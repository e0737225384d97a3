"""Worker pools: the controller's rules for a job made of pools (docs/contracts.md, "Worker pools:
controller rules and what the faces show").

A pool job's placement names each replica's pool (``"pool"``, ``"replica"``); its hosts report
their replicas in ``state.json`` (``"replicas"``), and the primary's host says when the primary
replica succeeded (``"primary_succeeded"``). The rules, applied by ``tui.control.jobs`` with the
gang rules every job follows:

- a host reporting ``primary_succeeded``: the job succeeded, whatever the others say from then on
  (the primary decides, as Vertex's does); the hosts still running replicas
  (workers, parameter servers, evaluators) are stopped with the job's grace, and the job is
  recorded ``succeeded``, not ``stopped``;
- before that, a host ``failed`` fails the gang, as for any job (the agent names the pool in the
  cause);
- a replica of a pool with ``on_failure = "continue"`` (an evaluator, by default) that failed:
  one ``replica failed`` event per replica per attempt; the job keeps running.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tui.model.jobstate import FAILED, TERMINAL
from tui.model.poolview import REPLICA_FAILED, failure_how, on_failure_of


def is_pool_job(rec: Mapping[str, Any]) -> bool:
    return any(n.get("pool") for n in rec.get("placement") or [])


def primary_succeeded(host_states: Mapping[str, Any]) -> str | None:
    """The host that says the primary replica succeeded (every rank of it exited 0), if any."""
    for host, st in host_states.items():
        if isinstance(st, dict) and st.get("primary_succeeded"):
            return host
    return None


def live_hosts(host_states: Mapping[str, Any]) -> list[str]:
    return [h for h, s in host_states.items() if isinstance(s, dict) and s.get("state") not in TERMINAL]


def stop_after_primary(jm: Any, rec: Mapping[str, Any], host_states: Mapping[str, Any]) -> dict[str, Any]:
    """The primary succeeded: stop the hosts still running the job's other replicas (the job's
    grace: an evaluator may be writing its last result), wait a while for them, and say what
    was done, for the ``succeeded`` event."""
    primary = primary_succeeded(host_states)
    live = [h for h in live_hosts(host_states) if h != primary]  # that host stops its own
    grace = float((rec.get("spec") or {}).get("grace_s", 30))
    if live:
        jm.ctl.agents(live).job_stop(job_id=rec["job_id"], grace_s=grace, timeout=20)
        jm._wait_terminal(rec, min(grace + 5.0, 15.0))
    return {"primary_succeeded": primary, "stopped_hosts": live}


def replica_events(rec: Mapping[str, Any], host_states: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``replica failed`` events the hosts' reports call for that the job's history does not
    have yet: one per failed replica of a pool that continues (``on_failure = "continue"``), per
    attempt (``restart_count``)."""
    spec = rec.get("spec") or {}
    have = {(e.get("pool"), e.get("replica"), e.get("restart_count"))
            for e in rec.get("events") or () if e.get("event") == REPLICA_FAILED}
    out: list[dict[str, Any]] = []
    for host, st in host_states.items():
        if not isinstance(st, dict):
            continue
        attempt = st.get("restart_count", rec.get("restarts") or 0)
        for r in st.get("replicas") or ():
            if not isinstance(r, dict) or r.get("state") != FAILED:
                continue
            pool, replica = r.get("pool"), r.get("replica")
            if (r.get("on_failure") or on_failure_of(spec, rec.get("placement") or [], pool)) != "continue":
                continue  # a gang-stopping failure: the host failed, the gang rules handle it
            key = (pool, replica, attempt)
            if key in have:
                continue
            have.add(key)
            how = failure_how(r.get("exit_code"), r.get("signal"), r.get("message"))
            out.append({
                "event": REPLICA_FAILED, "pool": pool, "replica": replica, "host": host,
                "restart_count": attempt, "exit_code": r.get("exit_code"), "signal": r.get("signal"),
                "continues": True,
                "message": f"{pool} {replica} on {host} {how}; training continues (on_failure = \"continue\")",
            })
    return out


def record_replica_events(jm: Any, job_id: str, rec: Mapping[str, Any], host_states: Mapping[str, Any]) -> None:
    """Add the missing ``replica failed`` events (by the lease holder, with the record as it is now)."""
    for event in replica_events(rec, host_states):
        jm.history.add_event(job_id, event)
