"""The Pipelines view's parts: the pipelines table, the selected pipeline's steps as a tree
(rows from ``PipelineRow`` and ``PipelineDetail``, drawn by diff), and the text of its head,
its step line and its stop dialog.

Plain functions from the controller's pipeline views to raw cells and strings; the app fetches
the views off the UI thread (``fetch_pipelines``) and hands them here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual.markup import escape

from tui.app.widgets.difftable import Col, DiffTable
from tui.app.widgets.format import Palette, duration, size_bytes, state_cell, state_markup
from tui.app.widgets.listfetch import ListFetch, fetch_list
from tui.model.pipelinetext import (  # noqa: F401  (the steps' plain text, re-exported for the view)
    age_text,
    attempt_text,
    needs_also,
    reason_text,
    step_time,
)
from tui.model.pipelineview import PIPELINE_FINAL, PipelineDetail, PipelineRow, StepRow

NO_PIPELINES = "no pipelines: rigdeck pipeline SPEC starts one"
RETRYABLE = ("failed", "stopped")  # the step states `r` runs again


def pipeline_rows(rows: Sequence[PipelineRow], now: float) -> list[tuple[str, tuple[Any, ...]]]:
    """One row per pipeline, in the controller's order (newest first)."""
    out = []
    for r in rows:
        out.append(
            (
                r.pipeline_id,
                (
                    r.pipeline_id,
                    r.name,
                    r.state,
                    f"{r.done}/{r.steps}",
                    r.running,
                    r.cached,
                    r.failed,
                    r.skipped,
                    age_text(r.created, now),
                ),
            )
        )
    return out


def step_rows(detail: PipelineDetail, now: float) -> list[tuple[str, tuple[Any, ...]]]:
    """The steps as a tree in dependency order: one row per step, keyed by its name."""
    out = []
    for prefix, s in detail.tree():
        t = step_time(s, now)
        cache = "hit" if s.cached else ""  # where from: the step's detail line below
        out.append(
            (
                s.name,
                (
                    (prefix, s.name, s.kind, needs_also(s, detail)),
                    s.state,
                    attempt_text(s),
                    None if t is None else int(t),
                    ",".join(s.hosts),
                    cache,
                    (reason_text(s, now), s.when, s.state),
                ),
            )
        )
    return out


def pipeline_head(detail: PipelineDetail | None, now: float) -> str:
    """The selected pipeline in two lines of markup."""
    if detail is None:
        return "no pipeline selected"
    r = detail.row
    lvl = state_markup(r.state)
    line1 = (
        f"[b]{escape(r.pipeline_id)}[/b]  [{lvl}]{escape(r.state)}[/]"
        + (f" ([$error]{escape(r.reason)}[/])" if r.reason and r.state == "failed" else
           f" ({escape(r.reason)})" if r.reason else "")
        + f"  [$text-muted]{escape(r.name)}"
        + (f" · {escape(r.path)}" if r.path else "")
        + f" · started {age_text(r.created, now)}"
        + (f", ran {duration(r.ended - r.created)}" if r.ended is not None else "")
        + "[/]"
    )
    line2 = (
        f"steps: {r.done} of {r.steps} done · {r.succeeded} succeeded, "
        f"[$accent]{r.cached} cached[/], {r.failed} failed, {r.skipped} skipped · "
        f"{r.running} running"
    )
    return f"{line1}\n{line2}"


def step_detail(s: StepRow | None, now: float) -> str:
    """The step the cursor is on, in up to three lines of markup: its job or sweep (enter opens
    it), what it needs and its condition; why it is where it is, its inputs; its metrics,
    artifacts and cache."""
    if s is None:
        return ""
    first = [f"[b]{escape(s.name)}[/b]"]
    if s.kind == "sweep":
        first.append(f"sweep [b]{escape(s.sweep_id)}[/b] (enter opens it)" if s.sweep_id
                     else "sweep, not started")
    elif s.job_id:
        first.append(f"job [b]{escape(s.job_id)}[/b] (enter opens it)")
    else:
        first.append("no job yet")
    first.append("needs " + ", ".join(escape(d) for d in s.depends_on) if s.depends_on else "needs no step")
    if s.when:
        first.append(f"when [b]{escape(s.when)}[/b]")
    second = []
    why = reason_text(s, now)
    if why:
        lvl = "$error" if s.state == "failed" else "$warning" if s.state == "waiting" else "$text-muted"
        second.append(f"[{lvl}]{escape(why)}[/]")
    if s.inputs:
        second.append("inputs " + ", ".join(f"{escape(c)} ← {escape(src)}" for c, src in s.inputs))
    if s.continue_from:
        second.append(f"continues from {escape(s.continue_from)}")
    third = []
    if s.cached:
        third.append("[$accent]cached[/]" + (f": reuses {escape(s.cached_from)}" if s.cached_from else ""))
    if s.metrics:
        third.append(" ".join(f"{escape(k)}={v:.5g}" for k, v in s.metrics))
    if s.artifacts:
        third.append(", ".join(f"{escape(k)} {n} files {size_bytes(b)}" for k, n, b in s.artifacts))
    lines = [" · ".join(first)]
    for part in (second, third):
        if part:
            lines.append("[$text-muted]" + " · ".join(part) + "[/]" if part is third else " · ".join(part))
    return "\n".join(lines)


def stop_pipeline_text(detail: PipelineDetail | None, row: PipelineRow) -> str:
    """The body of the confirmation before a pipeline is stopped."""
    live = []
    if detail is not None:
        live = [s for s in detail.steps if s.state not in ("pending", "succeeded", "cached",
                                                             "failed", "skipped", "stopped")]
    running = "".join(
        f"\n  [b]{escape(s.name)}[/b]  {escape(s.state)}"
        + (f", job {escape(s.job_id)}" if s.job_id else "")
        + (f", sweep {escape(s.sweep_id)}" if s.sweep_id else "")
        for s in live) or "\n  none"
    return (
        f"State: {escape(row.state)}. {row.done} of {row.steps} steps done. Under way:"
        f"{running}\n\n"
        "Their jobs are stopped like any job (SIGTERM to every rank, then SIGKILL after the grace "
        "period) and no further step starts. Finished steps and their artifacts are kept: "
        "`rigdeck pipeline retry` runs a stopped step again."
    )


def can_stop_pipeline(row: PipelineRow) -> bool:
    return row.state not in PIPELINE_FINAL


def can_retry_step(s: StepRow) -> bool:
    return s.state in RETRYABLE


def _text(s: object, style: Any = None) -> Text:
    return Text("-" if s is None or s == "" else str(s), style=style or "", no_wrap=True,
                overflow="ellipsis")


class PipelinesTable(DiffTable):
    def columns_for(self, w: Any) -> list[Col]:
        return [
            Col("pipeline", "Pipeline"),
            Col("name", "Name"),
            Col("state", "State", 10),
            Col("steps", "Steps", 6),
            Col("running", "Running", 7),
            Col("cached", "Cached", 6),
            Col("failed", "Failed", 6),
            Col("skipped", "Skipped", 7),
            Col("age", "Age", 10),
        ]

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        if column == "state":
            return state_cell(raw, palette)
        if column == "failed":
            return _text(raw, palette["crit"] if raw else palette["muted"])
        if column == "cached":
            return _text(raw, palette["accent"] if raw else palette["muted"])
        if column in ("running", "skipped"):
            return _text(raw, None if raw else palette["muted"])
        if column == "age":
            return _text(raw, palette["muted"])
        return _text(raw)


class StepsTable(DiffTable):
    """A pipeline's steps as a tree: each under the last step it needs, the others it needs
    named after it."""

    def columns_for(self, w: Any) -> list[Col]:
        return [
            Col("step", "Step"),
            Col("state", "State", 9),
            Col("attempt", "Attempt", 7),
            Col("time", "Time", 7),
            Col("hosts", "Hosts"),
            Col("cache", "Cache"),
            Col("why", "Reason / when", w.why if w.wide else w.why + 14),
        ]

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        if column == "step":
            prefix, name, kind, also = raw
            t = Text(prefix, style=palette["muted"], no_wrap=True, overflow="ellipsis")
            t.append(name, style=palette["strong"])
            if kind == "sweep":
                t.append(" (sweep)", style=palette["muted"])
            if also:
                t.append(" +" + ",".join(also), style=palette["muted"])
            return t
        if column == "state":
            return state_cell(raw, palette)
        if column == "time":
            return _text(duration(raw) if raw is not None else "-")
        if column == "cache":
            return _text(raw or "-", palette["accent"] if raw else palette["muted"])
        if column == "attempt":
            n = raw.split("/", 1)[0]
            return _text(raw, palette["warn"] if n.isdigit() and int(n) > 1 else None)
        if column == "why":
            reason, when, state = raw
            if reason:
                return _text(reason, palette["crit"] if state == "failed" else palette["muted"])
            if when:
                return _text(f"when {when}", palette["muted"])
            return _text("-", palette["muted"])
        return _text(raw, None if raw else palette["muted"])


# ---------------------------------------------------------------------------------------------
# Fetching (on a worker thread: the client's calls may wait on the network)


PipelineFetch = ListFetch[PipelineRow, PipelineDetail]  # what one fetch brought (tui/app/widgets/listfetch.py)


def fetch_pipelines(client: Any, selected: str | None) -> PipelineFetch:
    """The pipelines and the detail of ``selected`` (the newest when it is none or gone), from
    a ``tui.client.Client``; never raises: a failed call is the fetch's error."""
    return fetch_list(lambda: client.pipelines(), lambda ref: client.pipeline_detail(ref), lambda r: r.pipeline_id,
                      "pipeline", selected)
