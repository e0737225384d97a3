"""What the faces show of a job made of worker pools: one row per pool (role, replicas, hosts,
state), the Reduction Server sizing line, and the replicas that failed while training went on.

Plain data built from the job's record (its placement's nodes carry ``"pool"`` and
``"replica"``; ``pool_sizing`` and the ``replica failed`` events) and what its hosts last said
(each host's ``"replicas"``). No I/O. The rules are in docs/contracts.md ("Worker pools:
controller rules and what the faces show").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tui.model.jobstate import TERMINAL
from tui.model.termsafe import terminal_safe

# Pool order (the placement's, Vertex's workerpool0..3).
ROLES: tuple[str, ...] = ("primary", "worker", "parameter_server", "reduction_server", "evaluator")
REPLICA_FAILED = "replica failed"

# A pool's state from its replicas': the first of these any replica is in.
_PRECEDENCE: tuple[str, ...] = ("failed", "running", "starting", "stopping", "unknown", "stopped", "succeeded")


def on_failure_of(spec: Mapping[str, Any], placement: Sequence[Mapping[str, Any]], pool: Any) -> str:
    """``"stop"`` or ``"continue"``: what a failure of a replica of ``pool`` does to the job (the
    plan node's, else the spec's pool's, else the default: evaluators continue, others stop)."""
    for n in placement:
        if n.get("pool") == pool and n.get("on_failure") in ("stop", "continue"):
            return str(n["on_failure"])
    for p in spec.get("pools") or ():
        if isinstance(p, Mapping) and p.get("role") == pool and p.get("on_failure") in ("stop", "continue"):
            return str(p["on_failure"])
    return "continue" if pool == "evaluator" else "stop"


def failure_how(exit_code: Any, signal: Any, message: Any = None) -> str:
    """``was killed by signal 9`` / ``exited 1`` / the host's message."""
    if signal:
        return f"was killed by signal {signal}"
    if exit_code is not None:
        return f"exited {exit_code}"
    return str(message or "failed")


def gpu_of_rank(placement: Sequence[Mapping[str, Any]], rank: Any) -> int | None:
    """A pool job's rank's GPU: ranks are contiguous in node order (one node per replica, several
    on a host), so the rank's node and its index there say which of the node's GPUs it has."""
    if not isinstance(rank, int):
        return None
    start = 0
    for n in placement:
        slots = int(n.get("slots") or 0)
        if start <= rank < start + slots:
            gpus = list(n.get("gpus") or ())
            return gpus[rank - start] if rank - start < len(gpus) else None
        start += slots
    return None


@dataclass(frozen=True)
class PoolRow:
    """One pool of a job: ``states`` per replica (by replica index), ``state`` the pool's."""

    role: str
    replicas: int
    hosts: tuple[str, ...]  # the hosts its replicas run on, unique, in replica order
    state: str
    states: tuple[str, ...] = ()
    on_failure: str = "stop"

    @property
    def state_text(self) -> str:
        """``running``, or ``1 failed · 1 running`` when the replicas differ."""
        if len(set(self.states)) <= 1:
            return self.state
        counts = {s: self.states.count(s) for s in _PRECEDENCE if s in self.states}
        return " · ".join(f"{n} {s}" for s, n in counts.items())

    def to_json(self) -> dict[str, Any]:
        return {"role": self.role, "replicas": self.replicas, "hosts": list(self.hosts), "state": self.state,
                "replica_states": list(self.states), "on_failure": self.on_failure}


@dataclass(frozen=True)
class PoolsView:
    """A pool job's pools, its sizing (``rec["pool_sizing"]`` as the controller computed it, or
    None) and the ``replica failed`` events' messages, oldest first."""

    pools: tuple[PoolRow, ...]
    sizing: dict[str, Any] | None = None
    failures: tuple[str, ...] = ()

    @property
    def sizing_text(self) -> str | None:
        if not self.sizing or not self.sizing.get("text"):
            return None
        return terminal_safe(str(self.sizing["text"]))

    def pool(self, role: str) -> PoolRow | None:
        return next((p for p in self.pools if p.role == role), None)

    @classmethod
    def from_json(cls, pools: Sequence[Mapping[str, Any]] | None, sizing: Mapping[str, Any] | None,
                  events: Sequence[Mapping[str, Any]] = ()) -> PoolsView | None:
        """The inverse of ``pools_json`` plus the record's ``pool_sizing`` and events (a
        server's ``view`` answer); None without pools."""
        if not pools:
            return None
        rows = tuple(PoolRow(role=str(p["role"]), replicas=int(p.get("replicas") or 0),
                             hosts=tuple(p.get("hosts") or ()), state=str(p.get("state") or "unknown"),
                             states=tuple(p.get("replica_states") or ()),
                             on_failure=str(p.get("on_failure") or "stop")) for p in pools)
        failures = tuple(terminal_safe(str(e.get("message") or "")) for e in events
                         if isinstance(e, Mapping) and e.get("event") == REPLICA_FAILED)
        return cls(pools=rows, sizing=dict(sizing) if sizing else None, failures=failures)


def pools_view(rec: Mapping[str, Any], host_states: Mapping[str, Any] | None = None) -> PoolsView | None:
    """The pools of the job ``rec`` (a history record, or a view with ``spec``, ``placement``,
    ``state``, ``restarts``, ``events``, ``pool_sizing``) as its hosts last reported them (host
    -> state dict, or anything else for a host that did not answer); None for a job without pools."""
    placement = [n for n in rec.get("placement") or () if isinstance(n, Mapping)]
    if not any(n.get("pool") for n in placement):
        return None
    spec = rec.get("spec") or {}
    job_state = str(rec.get("state") or "unknown")
    attempt = rec.get("restarts") or 0
    host_states = host_states or {}
    reported: dict[tuple[Any, Any], str] = {}  # (pool, replica) -> its state, as its host says
    for st in host_states.values():
        if not isinstance(st, Mapping):
            continue
        for r in st.get("replicas") or ():
            if isinstance(r, Mapping) and r.get("state"):
                reported[(r.get("pool"), r.get("replica"))] = str(r["state"])
    failures: list[str] = []
    for e in rec.get("events") or ():
        if isinstance(e, Mapping) and e.get("event") == REPLICA_FAILED:
            failures.append(terminal_safe(str(e.get("message") or "")))
            if e.get("restart_count", attempt) == attempt:
                reported.setdefault((e.get("pool"), e.get("replica")), "failed")

    def replica_state(node: Mapping[str, Any]) -> str:
        got = reported.get((node.get("pool"), node.get("replica")))
        if got is None:
            st = host_states.get(str(node.get("host")))
            if isinstance(st, Mapping) and st.get("state"):
                got = str(st["state"])
        if got is None:
            return job_state if job_state in TERMINAL or job_state in ("queued", "pending", "starting") else "unknown"
        if job_state in TERMINAL and got not in TERMINAL:
            return "stopped"  # the job ended while this replica ran: it was stopped with it
        return got

    roles = [r for r in ROLES if any(n.get("pool") == r for n in placement)]
    roles += sorted({str(n["pool"]) for n in placement if n.get("pool") and n["pool"] not in ROLES})
    rows = []
    for role in roles:
        nodes = sorted((n for n in placement if n.get("pool") == role), key=lambda n: n.get("replica") or 0)
        states = tuple(replica_state(n) for n in nodes)
        hosts = tuple(dict.fromkeys(str(n.get("host")) for n in nodes))
        state = next((s for s in _PRECEDENCE if s in states), states[0] if states else job_state)
        rows.append(PoolRow(role=role, replicas=len(nodes), hosts=hosts, state=state, states=states,
                            on_failure=on_failure_of(spec, placement, role)))
    sizing = rec.get("pool_sizing")
    return PoolsView(pools=tuple(rows), sizing=dict(sizing) if isinstance(sizing, Mapping) else None,
                     failures=tuple(failures))


def pools_json(view: PoolsView | None) -> list[dict[str, Any]]:
    """``rigdeck status --json``'s ``pools``: one object per pool ([] for a job without pools)."""
    return [p.to_json() for p in view.pools] if view is not None else []


def pool_lines(view: PoolsView) -> list[str]:
    """The pools as plain lines for ``rigdeck status`` (and the stop confirmation's list)."""
    lines = ["pool              replicas  hosts                 state"]
    for p in view.pools:
        lines.append(f"{terminal_safe(p.role):<17} {p.replicas:<9} {terminal_safe(', '.join(p.hosts)):<21} "
                     f"{terminal_safe(p.state_text)}")
    if view.sizing_text:
        lines.append(f"sizing   {view.sizing_text}")
    for msg in view.failures:
        lines.append(f"replica  {msg}")
    return lines
