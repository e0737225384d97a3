"""A pipeline-parallel job's stages as plain text: the plan's two header lines, each stage's
cells, and the lines ``rigdeck status`` prints (from ``StagesView``, tui.model.stages).

The app's stage panel (``tui.app.widgets.stages``) draws the same cells with style. A stage's
expected busy time is the plan's forward + backward time per microbatch times the microbatches
of a step, which is what the rank measures as ``busy_s``; its step time is the wall time of a
whole step (busy plus waiting for the other stages); the bubble is the share it waits.
"""

from __future__ import annotations

from typing import Any

from tui.model.stages import StageRow, StagesView
from tui.model.textformat import size_bytes

SCHEDULE_NAMES = {"simple": "GPipe", "interleaved": "1F1B"}
BUBBLE_WARN = 0.5  # a stage that waits half its steps or more

# (key, heading, width) of each stage cell, in order: the panel's columns and the status lines'.
STAGE_COLUMNS: tuple[tuple[str, str, int | None], ...] = (
    ("stage", "Stage", 5),
    ("blocks", "Blocks", 6),
    ("rank", "Rank", None),
    ("exp_busy", "Exp busy", 8),
    ("busy", "Busy", 8),
    ("step", "Step", 8),
    ("bubble", "Bubble", 6),
    ("exp_mem", "Exp mem", 9),
    ("peak", "Peak", 9),
)


def secs(x: float | None) -> str:
    """Seconds as a cell shows them: 850 µs, 12.3 ms, 1.24 s."""
    if x is None:
        return "-"
    if x < 1e-3:
        return f"{x * 1e6:.0f} µs"
    if x < 1:
        return f"{x * 1e3:.3g} ms"
    return f"{x:.3g} s"


def pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def blocks_text(s: StageRow) -> str:
    """The stage's blocks, first to last: ``0-1``, ``2``."""
    last = s.end_block - 1
    return str(s.first_block) if last <= s.first_block else f"{s.first_block}-{last}"


def expected_busy(view: StagesView, s: StageRow) -> float | None:
    """The plan's forward + backward time of one step on this stage (per microbatch x microbatches)."""
    if s.expected_time_s is None or not view.microbatches:
        return None
    return s.expected_time_s * view.microbatches


def slowest(view: StagesView) -> int | None:
    """The stage that is busiest per step as measured (the one the others wait for)."""
    busy = [(s.busy_s, s.stage) for s in view.stages if s.busy_s is not None]
    return max(busy)[1] if len(busy) > 1 else None


def head_parts(view: StagesView) -> tuple[str, str]:
    """The two header lines, plain: the plan, then its bubble and balance."""
    sched = SCHEDULE_NAMES.get(view.schedule)
    ckpt = None if view.activation_checkpointing is None else ("on" if view.activation_checkpointing else "off")
    first = (f"{view.partitions} stages · optimize {view.optimize} · schedule {view.schedule}"
             + (f" ({sched})" if sched else "")
             + f" · {view.microbatches if view.microbatches is not None else '?'} microbatches"
             + (f" · activation checkpointing {ckpt}" if ckpt else "")
             + f" · plan {view.source}" + (f", cuts {', '.join(map(str, view.cuts))}" if view.cuts else ""))
    second = f"bubble expected {pct(view.expected_bubble)} · measured {pct(view.measured_bubble)}"
    if view.equal_max_time_s and view.expected_max_time_s:
        second += (f" · slowest stage {secs(view.expected_max_time_s)} a microbatch, "
                   f"equal-layer split {secs(view.equal_max_time_s)}")
    return first, second


def stage_raw(view: StagesView, s: StageRow, slow: int | None) -> tuple[Any, ...]:
    """A stage's cells in ``STAGE_COLUMNS`` order; busy and bubble as (text, worth a warning)."""
    who = "-" if s.rank is None else (f"r{s.rank} {s.host}" if s.host else f"r{s.rank}")
    return (
        s.stage,
        blocks_text(s),
        who,
        secs(expected_busy(view, s)),
        (secs(s.busy_s), s.stage == slow),
        secs(s.step_time_s),
        (pct(s.bubble), s.bubble is not None and s.bubble >= BUBBLE_WARN),
        size_bytes(s.expected_memory_bytes),
        size_bytes(s.peak_bytes),
    )


def stage_rows(view: StagesView) -> list[tuple[str, tuple[Any, ...]]]:
    """(row key, cells) per stage."""
    slow = slowest(view)
    return [(str(s.stage), stage_raw(view, s, slow)) for s in view.stages]


def stage_lines(view: StagesView) -> list[str]:
    """The stages as plain lines for ``rigdeck status`` (values made safe by tui.model.stages)."""
    first, second = head_parts(view)
    lines = [f"stages   {first}", f"         {second}"]
    heads = [label.lower() for _, label, _ in STAGE_COLUMNS]
    rows = []
    for _, raw in stage_rows(view):
        rows.append([str(v[0]) if isinstance(v, tuple) else str(v) for v in raw])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True)).rstrip())
    for r in rows:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
    return lines
