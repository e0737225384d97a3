"""A pipeline's steps as plain text: how long a step ran, its attempt, why it is where it is,
and what else it needs. ``rigdeck pipeline status`` prints these; the app's Pipelines view
(``tui.app.widgets.pipelines``) shows them in its cells and markup.
"""

from __future__ import annotations

from tui.model.pipelineview import PipelineDetail, StepRow
from tui.model.textformat import duration


def age_text(created: float, now: float) -> str:
    return duration(max(0.0, now - created)) + " ago"


def step_time(s: StepRow, now: float) -> float | None:
    """How long the step ran: to its end, or to ``now`` while it runs."""
    if s.started is None:
        return None
    end = s.ended if s.ended is not None else now
    return max(0.0, end - s.started)


def attempt_text(s: StepRow) -> str:
    """``2/3``; ``-`` before its first attempt (and of a cached step, which ran none)."""
    if s.attempt <= 0:
        return f"-/{s.max_attempts}" if s.max_attempts > 1 else "-"
    return f"{s.attempt}/{s.max_attempts}"


def reason_text(s: StepRow, now: float) -> str:
    """Why a step is where it is: its reason, with a retry's countdown while it waits."""
    text = s.reason or ""
    if s.retry_at is not None and s.state == "waiting":
        left = max(0.0, s.retry_at - now)
        text = (text + "; " if text else "") + f"retry in {duration(left)}"
    return text


def needs_also(s: StepRow, detail: PipelineDetail) -> tuple[str, ...]:
    """The steps ``s`` needs besides the one it is drawn under in the tree (the last of them in
    the detail's order)."""
    order = {x.name: i for i, x in enumerate(detail.steps)}
    known = [d for d in s.depends_on if d in order]
    if not known:
        return tuple(s.depends_on)
    parent = max(known, key=lambda d: order[d])
    return tuple(d for d in s.depends_on if d != parent)
