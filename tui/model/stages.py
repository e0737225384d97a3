"""What the faces see of a pipeline-parallel job's stages: its plan and each stage's measurements.

A ``[model_parallel]`` job's ranks report two events on their metrics stream (docs/contracts.md,
"Model parallelism"): rank 0's ``mp_plan`` once the plan is known (cut points, expected time and
memory per stage, the expected pipeline bubble), and every rank's ``mp_stage`` every few steps
(its stage's wall time per step, the time busy in its own forward and backward, its peak memory).
``StagesFold`` folds them as they arrive; ``StagesView`` is the plain, immutable result the Job
view's stage panel and ``rigdeck status`` show. The measured bubble of a stage is the share of a
step it waits: ``1 - busy_s / step_time_s``.

Records come from the ranks' files: anything that is not shaped as the contract says is left out,
and the plan is copied with only its known keys (bounded), so it can be kept in the job history.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tui.model.termsafe import terminal_safe

__all__ = [
    "MAX_STAGES",
    "StageRow",
    "StagesFold",
    "StagesView",
    "clean_plan",
    "plan_from_events",
    "stages_from_records",
    "stages_view",
]

MAX_STAGES = 1024  # more is not a plan a rank should send; left out whole
_MAX_TEXT = 32


def _int(v: Any, lo: int = 0) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool) and v >= lo:
        return int(v)
    return None


def _num(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and 0 <= v < float("inf"):
        return float(v)
    return None


def _text(v: Any) -> str:
    return terminal_safe(v[:_MAX_TEXT]) if isinstance(v, str) else "?"


def _cuts(v: Any) -> list[int] | None:
    if not isinstance(v, list) or len(v) >= MAX_STAGES:
        return None
    out = [_int(c) for c in v]
    return None if any(c is None for c in out) else [c for c in out if c is not None]


def clean_plan(raw: Any) -> dict[str, Any] | None:
    """The plan of an ``mp_plan`` record, with only the contract's keys and each of its type
    (a value that is not is None), or None when it is no plan: not an object, or its stages not
    a list of ``{"stage": i, "blocks": [first, end]}`` in order."""
    if not isinstance(raw, Mapping):
        return None
    stages_in = raw.get("stages")
    if not isinstance(stages_in, list) or not stages_in or len(stages_in) > MAX_STAGES:
        return None
    stages: list[dict[str, Any]] = []
    for i, s in enumerate(stages_in):
        if not isinstance(s, Mapping) or _int(s.get("stage")) != i:
            return None
        blocks = s.get("blocks")
        if (not isinstance(blocks, list) or len(blocks) != 2 or _int(blocks[0]) is None
                or _int(blocks[1]) is None):
            return None
        stages.append({"stage": i, "blocks": [int(blocks[0]), int(blocks[1])],
                       "time_s": _num(s.get("time_s")), "memory_bytes": _int(s.get("memory_bytes")),
                       "send_bytes": _int(s.get("send_bytes"))})
    eq = raw.get("equal_split")
    equal = None
    if isinstance(eq, Mapping):
        equal = {"cuts": _cuts(eq.get("cuts")), "max_time_s": _num(eq.get("max_time_s")),
                 "max_memory_bytes": _int(eq.get("max_memory_bytes"))}
    cuts = _cuts(raw.get("cuts"))
    return {
        "version": _int(raw.get("version")),
        "optimize": _text(raw.get("optimize")),
        "schedule": _text(raw.get("schedule")),
        "microbatches": _int(raw.get("microbatches"), 1),
        "partitions": len(stages),
        "blocks": _int(raw.get("blocks")),
        "cuts": cuts if cuts is not None else [s["blocks"][0] for s in stages[1:]],
        "source": _text(raw.get("source")),
        "stages": stages,
        "bubble": _num(raw.get("bubble")),
        "equal_split": equal,
    }


def plan_from_events(events: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The newest plan kept in a job's history events (``{"event": "mp_plan", "plan": ...}``)."""
    for e in reversed(events):
        if isinstance(e, Mapping) and e.get("event") == "mp_plan":
            plan = clean_plan(e.get("plan"))
            if plan is not None:
                return plan
    return None


@dataclass(frozen=True)
class StageRow:
    """One stage: its blocks ``[first_block, end_block)``, what the plan expects of it, and its
    latest measurement (None until its rank reports one)."""

    stage: int
    first_block: int
    end_block: int
    expected_time_s: float | None = None  # forward + backward per microbatch
    expected_memory_bytes: int | None = None  # parameters + gradients + activations
    send_bytes: int | None = None  # activations sent to the next stage per microbatch
    step: int | None = None
    step_time_s: float | None = None  # wall time per step
    busy_s: float | None = None  # time in its own forward and backward per step
    peak_bytes: int | None = None
    rank: int | None = None
    host: str | None = None

    @property
    def bubble(self) -> float | None:
        """The share of a step this stage waits: ``1 - busy / step``, within 0..1."""
        if self.step_time_s is None or self.busy_s is None or self.step_time_s <= 0:
            return None
        return min(1.0, max(0.0, 1.0 - self.busy_s / self.step_time_s))

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "blocks": [self.first_block, self.end_block],
                "expected_time_s": self.expected_time_s,
                "expected_memory_bytes": self.expected_memory_bytes, "send_bytes": self.send_bytes,
                "step": self.step, "step_time_s": self.step_time_s, "busy_s": self.busy_s,
                "peak_bytes": self.peak_bytes, "bubble": self.bubble, "rank": self.rank,
                "host": self.host}


@dataclass(frozen=True)
class StagesView:
    """A pipeline-parallel job's plan and its stages as measured."""

    optimize: str
    schedule: str
    microbatches: int | None
    blocks: int | None
    cuts: tuple[int, ...]
    source: str  # "profiled" | "file"
    expected_bubble: float | None
    stages: tuple[StageRow, ...]
    activation_checkpointing: bool | None = None  # the spec's, when known
    equal_cuts: tuple[int, ...] | None = None  # the equal-layer split, for comparison
    equal_max_time_s: float | None = None
    equal_max_memory_bytes: int | None = None

    @property
    def partitions(self) -> int:
        return len(self.stages)

    @property
    def measured_bubble(self) -> float | None:
        """The mean of the stages' measured bubbles (None before any stage reported)."""
        found = [b for b in (s.bubble for s in self.stages) if b is not None]
        return sum(found) / len(found) if found else None

    @property
    def expected_max_time_s(self) -> float | None:
        times = [s.expected_time_s for s in self.stages if s.expected_time_s is not None]
        return max(times) if times else None

    def to_json(self) -> dict[str, Any]:
        """``rigdeck status --json``'s ``stages`` (docs/contracts.md)."""
        return {"optimize": self.optimize, "schedule": self.schedule,
                "microbatches": self.microbatches, "partitions": self.partitions,
                "blocks": self.blocks, "cuts": list(self.cuts), "source": self.source,
                "activation_checkpointing": self.activation_checkpointing,
                "expected_bubble": self.expected_bubble, "measured_bubble": self.measured_bubble,
                "equal_split": None if self.equal_cuts is None else {
                    "cuts": list(self.equal_cuts), "max_time_s": self.equal_max_time_s,
                    "max_memory_bytes": self.equal_max_memory_bytes},
                "stages": [s.to_json() for s in self.stages]}


def stages_view(plan: Mapping[str, Any] | None, measured: Mapping[int, Mapping[str, Any]],
                activation_checkpointing: bool | None = None) -> StagesView | None:
    """The view of a plan (``clean_plan``'s form) with each stage's latest measurement
    (``StagesFold.measured``); None without a plan."""
    if plan is None:
        return None
    rows = []
    for s in plan["stages"]:
        m = measured.get(s["stage"]) or {}
        rows.append(StageRow(
            stage=s["stage"], first_block=s["blocks"][0], end_block=s["blocks"][1],
            expected_time_s=s.get("time_s"), expected_memory_bytes=s.get("memory_bytes"),
            send_bytes=s.get("send_bytes"), step=m.get("step"), step_time_s=m.get("step_time_s"),
            busy_s=m.get("busy_s"), peak_bytes=m.get("peak_bytes"), rank=m.get("rank"),
            host=m.get("host")))
    eq = plan.get("equal_split") or {}
    return StagesView(
        optimize=plan["optimize"], schedule=plan["schedule"], microbatches=plan.get("microbatches"),
        blocks=plan.get("blocks"), cuts=tuple(plan.get("cuts") or ()), source=plan["source"],
        expected_bubble=plan.get("bubble"), stages=tuple(rows),
        activation_checkpointing=activation_checkpointing,
        equal_cuts=tuple(eq["cuts"]) if eq.get("cuts") is not None else None,
        equal_max_time_s=eq.get("max_time_s"), equal_max_memory_bytes=eq.get("max_memory_bytes"))


class StagesFold:
    """A job's newest plan and each stage's latest measurement, from metrics records as they
    arrive (``add``)."""

    def __init__(self) -> None:
        self.plan: dict[str, Any] | None = None
        self.measured: dict[int, dict[str, Any]] = {}

    def add(self, records: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
        """Fold ``records``; returns the plan if one arrived among them (the newest)."""
        new = None
        for r in records:
            event = r.get("event")
            if event == "mp_plan":
                plan = clean_plan(r.get("plan"))
                if plan is not None:
                    self.plan = new = plan
            elif event == "mp_stage":
                stage = _int(r.get("stage"))
                if stage is None or stage >= MAX_STAGES:
                    continue
                host = r.get("host")
                self.measured[stage] = {
                    "step": _int(r.get("step")), "step_time_s": _num(r.get("step_time_s")),
                    "busy_s": _num(r.get("busy_s")), "peak_bytes": _int(r.get("peak_bytes")),
                    "rank": _int(r.get("rank")),
                    "host": terminal_safe(host[:255]) if isinstance(host, str) else None,
                }
        return new

    def view(self, fallback: Mapping[str, Any] | None = None,
             activation_checkpointing: bool | None = None) -> StagesView | None:
        """The view of the newest plan seen here, else of ``fallback`` (the one the job history
        kept); None when neither."""
        return stages_view(self.plan if self.plan is not None else fallback, self.measured,
                           activation_checkpointing)


def stages_from_records(records: Iterable[Mapping[str, Any]], events: Sequence[Mapping[str, Any]] = (),
                        spec: Mapping[str, Any] | None = None) -> StagesView | None:
    """A job's stages from its metrics records (``rigdeck status``), the plan from its history
    ``events`` when the records have none; ``spec``: the job's (its ``model_parallel`` says
    whether activations are checkpointed)."""
    fold = StagesFold()
    fold.add(records)
    return fold.view(plan_from_events(events), checkpointing_of(spec))


def checkpointing_of(spec: Mapping[str, Any] | None) -> bool | None:
    mp = (spec or {}).get("model_parallel")
    if isinstance(mp, Mapping) and isinstance(mp.get("activation_checkpointing"), bool):
        return bool(mp["activation_checkpointing"])
    return None
