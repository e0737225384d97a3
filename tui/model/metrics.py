"""How a job's metrics records are read: the newest attempt, then the lowest rank. One rule for
every reader (the job's metrics, a sweep trial's objective, a pipeline step's final metrics).

A metrics record is what a rank wrote (``runtime.report()``, the metric definitions applied to
its output, the hypertune file), as the job reader hands it out: ``step``, ``rank``, ``restart``
(the attempt: 0 for the first, one more for each gang restart), ``time``, ``host``, ``event``
for a record that holds no step's values (a checkpoint), and the metrics themselves.

- After a restart the gang starts over: the newest attempt's records replace the earlier
  attempts' (a loss at step 1 of attempt 2 is not a regression from step 900 of attempt 1).
- Of the ranks that report a value, the lowest stands for the job: rank 0's, as the user's
  script and SageMaker-style metric definitions read it. A record without a rank comes last.
- A metric's value is a number; hypertune writes strings, so a string that holds a number
  counts too. Booleans are no metric.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "NOT_METRICS",
    "ObjectiveValues",
    "attempt",
    "final_metrics",
    "merge_objective_values",
    "metric_value",
    "newest_attempts",
    "objective_values",
    "rank_of",
]

# Record fields that are not metrics.
NOT_METRICS = frozenset(("time", "rank", "step", "event", "restart", "host"))
# A record without a rank: after every rank a job can have.
_NO_RANK = 1 << 30

# step -> (attempt, rank, value) of one metric.
ObjectiveValues = dict[int, tuple[int, int, float]]


def attempt(r: Mapping[str, Any]) -> int:
    """The attempt a record is of (0: the job's first run)."""
    return int(r.get("restart") or 0)


def rank_of(r: Mapping[str, Any]) -> int:
    """The record's rank; one without a rank sorts after every rank."""
    rank = r.get("rank")
    return int(rank) if isinstance(rank, int) else _NO_RANK


def metric_value(v: Any) -> float | None:
    """A metric's value as a number, or None when it is none (a boolean, text that holds no
    number). Not checked for finiteness: a NaN loss is what the rank reported."""
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _step_key(r: Mapping[str, Any]) -> tuple[Any, Any] | None:
    return (r.get("rank"), r["step"]) if r.get("step") is not None and r.get("event") is None else None


def newest_attempts(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` without those a later attempt replaced: after a restart the new attempt's
    record of a (rank, step) stands for it, the earlier attempts' go (events, which carry no
    step, are all kept). Order is kept."""
    records = list(records)
    latest: dict[tuple[Any, Any], int] = {}
    for r in records:
        k = _step_key(r)
        if k is not None:
            latest[k] = max(latest.get(k, 0), attempt(r))
    return [r for r in records if (k := _step_key(r)) is None or attempt(r) == latest[k]]


def _newest_only(values: ObjectiveValues) -> ObjectiveValues:
    newest = max((a for a, _, _ in values.values()), default=0)
    return {s: x for s, x in values.items() if x[0] == newest}


def objective_values(records: Iterable[Mapping[str, Any]], metric: str) -> ObjectiveValues:
    """step -> (attempt, rank, value) of ``metric`` in metrics records: the lowest rank's that
    reports it, and of a restarted job its newest attempt only."""
    out: ObjectiveValues = {}
    for r in records:
        v, step = metric_value(r.get(metric)), r.get("step")
        if v is None or not isinstance(step, int):
            continue
        a, rank = attempt(r), rank_of(r)
        have = out.get(step)
        if have is None or (a, -rank) > (have[0], -have[1]):
            out[step] = (a, rank, v)
    return _newest_only(out)


def merge_objective_values(have: Mapping[int, tuple[int, int, float]], new: ObjectiveValues) -> ObjectiveValues:
    """``have`` with ``new`` (``objective_values`` of records read after it) merged in by the same
    rule; of two values of one step from the same attempt and rank, the later read stands."""
    merged = dict(have)
    for step, x in new.items():
        old = merged.get(step)
        if old is None or (x[0], -x[1]) >= (old[0], -old[1]):
            merged[step] = x
    return _newest_only(merged)


def final_metrics(records: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Each numeric metric's last value: of the newest attempt, the highest step, the lowest
    rank that reported it. A metric the newest attempt has not reported keeps its last value
    from an earlier one; a value that is not finite is left out."""
    best: dict[str, tuple[int, int, int, float]] = {}
    for r in records:
        step = int(r["step"]) if isinstance(r.get("step"), int) else -1
        key = (attempt(r), step, -rank_of(r))
        for k, raw in r.items():
            if k in NOT_METRICS:
                continue
            v = metric_value(raw)
            if v is None or not math.isfinite(v):
                continue
            have = best.get(k)
            if have is None or key >= have[:3]:
                best[k] = (*key, v)
    return {k: x[3] for k, x in sorted(best.items())}
