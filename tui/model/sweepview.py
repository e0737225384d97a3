"""What the faces see of sweeps: frozen dataclasses the controller builds and the app, the CLI
and the server's wire (tui.model.wire) share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# A trial's states: those of its job while it runs, then how the sweep counted it.
TRIAL_FINAL = ("completed", "pruned", "failed", "stopped")
SWEEP_FINAL = ("completed", "stopped", "failed")


@dataclass(frozen=True)
class TrialRow:
    """One trial of a sweep."""

    number: int  # from 1, as Vertex's trial id
    job_id: str  # its current job (a retry is a new job)
    state: str  # "queued", "starting", "running", ... while its job runs; then TRIAL_FINAL
    params: tuple[tuple[str, Any], ...]
    value: float | None = None  # the objective: the last value the trial reported
    best_step: int | None = None  # the step of its best reported value
    best_value: float | None = None
    last_step: int | None = None
    pruned_step: int | None = None
    started: float | None = None
    ended: float | None = None
    attempt: int = 1  # 2 and up: retried after its host failed
    error: str | None = None
    curve: tuple[tuple[int, float], ...] = ()  # the objective by step, as reported

    @property
    def duration(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended if self.ended is not None else self.started) - self.started

    def params_text(self) -> str:
        return " ".join(f"{k}={_short(v)}" for k, v in self.params)


@dataclass(frozen=True)
class SweepRow:
    """One sweep, as the sweeps list shows it."""

    sweep_id: str
    name: str
    state: str  # "running", "stopping", "completed", "stopped", "failed"
    strategy: str
    pruner: str
    metric: str
    goal: str
    max_trials: int
    created: float
    ended: float | None = None
    reason: str | None = None
    trials: int = 0  # asked so far
    running: int = 0
    queued: int = 0
    completed: int = 0
    pruned: int = 0
    failed: int = 0
    best_trial: int | None = None
    best_value: float | None = None
    user: str | None = None  # its owner (who started it)

    @property
    def done(self) -> int:
        return self.completed + self.pruned + self.failed


@dataclass(frozen=True)
class SweepDetail:
    """One sweep with its trials, best first (by objective; unfinished last)."""

    row: SweepRow
    parameters: tuple[dict[str, Any], ...]
    trials: tuple[TrialRow, ...]
    max_parallel: int | None = None
    seed: int | None = None

    def best(self) -> TrialRow | None:
        done = [t for t in self.trials if t.state == "completed" and t.value is not None]
        if not done:
            return None
        return sorted_trials(done, self.row.goal)[0]

    def best_so_far(self) -> tuple[tuple[int, float], ...]:
        """(trial number, best objective among completed trials up to it), by trial number."""
        out = []
        best: float | None = None
        for t in sorted(self.trials, key=lambda t: t.number):
            if t.state == "completed" and t.value is not None and math.isfinite(t.value):
                if best is None or (t.value < best if self.row.goal == "minimize" else t.value > best):
                    best = t.value
            if best is not None:
                out.append((t.number, best))
        return tuple(out)


def sorted_trials(trials: Any, goal: str) -> list[TrialRow]:
    """Best objective first; trials without one after them, newest first."""
    sign = 1.0 if goal == "minimize" else -1.0

    def key(t: TrialRow) -> tuple[int, float, int]:
        if t.value is None or not math.isfinite(t.value):
            return (1, 0.0, -t.number)
        return (0, sign * t.value, t.number)

    return sorted(trials, key=key)


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)
