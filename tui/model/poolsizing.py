"""Reduction Server sizing: do a job's reducers have the bandwidth its workers send?

Vertex AI's rule for Reduction Server (the seed's): the reducers' total network bandwidth should
be at least the workers' total, so with reducers of ``per_reducer`` Gbps a job of workers
totalling ``W`` Gbps wants ``ceil(W / per_reducer)`` of them (8 workers at 100 Gbps with reducers
of 32 Gbps: 25). A replica's bandwidth is its host's NIC speed as the agent reports it (facts
``nics``); the primary counts as a worker. Pure: the controller reads the facts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["host_gbps", "sizing"]


def host_gbps(nics: Any, address: str | None = None) -> float | None:
    """A host's bandwidth in Gbps from its facts' ``nics`` (``[{"name", "speed_mbps",
    "addresses"}]``): the NIC carrying ``address`` when one does and its speed is known, else
    the fastest known; None when no speed is known (or the agent reports no NICs)."""
    if not isinstance(nics, list):
        return None
    known = []
    for nic in nics:
        if not isinstance(nic, dict):
            continue
        speed = nic.get("speed_mbps")
        if not isinstance(speed, (int, float)) or isinstance(speed, bool) or speed <= 0:
            continue
        if address is not None and address in (nic.get("addresses") or ()):
            return speed / 1000.0
        known.append(speed / 1000.0)
    return max(known) if known else None


def _num(x: float) -> str:
    return f"{x:g}"


def _side(what: str, speeds: Sequence[float]) -> str:
    total = sum(speeds)
    if len(set(speeds)) == 1:
        return f"{what} {len(speeds)} x {_num(speeds[0])} Gbps = {_num(total)} Gbps"
    return f"{what} {len(speeds)} ({' + '.join(_num(s) for s in speeds)} Gbps) = {_num(total)} Gbps"


def sizing(replicas: Iterable[tuple[str, str]], gbps: Mapping[str, float | None]) -> dict[str, Any] | None:
    """The sizing check of a job with a ``reduction_server`` pool, or None without one.

    ``replicas``: ``(role, host)`` of every replica; ``gbps``: each host's bandwidth (None or
    absent: unknown). Returns ``{"workers_gbps", "reducers_gbps", "per_reducer_gbps",
    "reducers", "match", "ok", "text"}``; with a speed unknown the numbers are None and
    ``text`` says which hosts lack one."""
    reps = list(replicas)
    reducers = [h for role, h in reps if role == "reduction_server"]
    if not reducers:
        return None
    workers = [h for role, h in reps if role in ("primary", "worker")]
    unknown = sorted({h for h in [*workers, *reducers] if gbps.get(h) is None})
    if unknown:
        return {"workers_gbps": None, "reducers_gbps": None, "per_reducer_gbps": None,
                "reducers": len(reducers), "match": None, "ok": None,
                "text": (f"reduction servers {len(reducers)}, workers {len(workers)}: NIC speed unknown "
                         f"on {', '.join(unknown)} (the agent reports none), so the sizing cannot be "
                         "checked")}
    w = [float(gbps[h] or 0) for h in workers]
    r = [float(gbps[h] or 0) for h in reducers]
    workers_gbps, reducers_gbps = sum(w), sum(r)
    per = reducers_gbps / len(r)
    match = math.ceil(round(workers_gbps / per, 9)) if per > 0 else None
    ok = reducers_gbps >= workers_gbps
    rel = ">=" if ok else "<"
    text = f"{_side('reduction servers', r)} {rel} {_side('workers', w)}"
    if not ok and match is not None:
        text += f": {match} would match"
    elif ok:
        text += f": enough ({match} would match)" if match != len(r) else ": enough"
    return {"workers_gbps": workers_gbps, "reducers_gbps": reducers_gbps, "per_reducer_gbps": per,
            "reducers": len(r), "match": match, "ok": ok, "text": text}
