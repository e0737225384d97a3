"""The Sweeps view's parts: the sweeps and trials tables (rows from ``SweepRow`` and
``SweepDetail``, drawn by diff), the charts' series, and the text of its head and stop dialogs.

Plain functions from the controller's sweep views to raw cells and strings; the app fetches the
views off the UI thread and hands them here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual.markup import escape

from tui.app.widgets.difftable import Col, DiffTable
from tui.app.widgets.format import Palette, duration, state_cell, state_markup
from tui.app.widgets.listfetch import ListFetch, fetch_list
from tui.model.sweepview import SWEEP_FINAL, TRIAL_FINAL, SweepDetail, SweepRow, TrialRow

TOP_CURVES = 3  # the objective curves drawn: the best few trials'
NO_SWEEPS = "no sweeps: rigdeck sweep SPEC starts one"


def objective_text(v: float | None) -> str:
    """An objective value: five significant digits, ``-`` for none."""
    if v is None:
        return "-"
    if not math.isfinite(v):
        return str(v)
    return f"{v:.5g}" if abs(v) < 1e5 else f"{v:.3e}"


def goal_arrow(goal: str) -> str:
    return "↓" if goal == "minimize" else "↑"


def trial_duration(t: TrialRow, now: float) -> float | None:
    """How long the trial ran: to its end, or to ``now`` while it runs."""
    if t.started is None:
        return None
    end = t.ended if t.ended is not None else now
    return max(0.0, end - t.started)


def best_text(row: SweepRow) -> str:
    """``0.012345 (#4)``, or ``-`` before a trial completed."""
    if row.best_trial is None:
        return "-"
    return f"{objective_text(row.best_value)} (#{row.best_trial})"


def strategy_text(row: SweepRow) -> str:
    return row.strategy if row.pruner == "off" else f"{row.strategy}+{row.pruner}"


def sweep_rows(rows: Sequence[SweepRow]) -> list[tuple[str, tuple[Any, ...]]]:
    """One row per sweep, newest first (as the controller lists them)."""
    out = []
    for r in rows:
        live = r.running + r.queued
        out.append(
            (
                r.sweep_id,
                (
                    r.sweep_id,
                    r.state,
                    strategy_text(r),
                    f"{r.done}/{r.max_trials}",
                    (r.running, r.queued) if live else None,
                    r.pruned,
                    r.failed,
                    f"{r.metric} {goal_arrow(r.goal)}",
                    best_text(r),
                ),
            )
        )
    return out


def live_value(t: TrialRow) -> float | None:
    """A running trial's latest reported objective (its final value comes when it ends)."""
    return t.curve[-1][1] if t.curve and t.state not in TRIAL_FINAL else None


def trial_rows(detail: SweepDetail, now: float) -> list[tuple[str, tuple[Any, ...]]]:
    """One row per trial in the detail's order (best objective first, unfinished last)."""
    out = []
    for t in detail.trials:
        d = trial_duration(t, now)
        if t.value is not None:
            objective = (objective_text(t.value), False)
        else:
            live = live_value(t)
            objective = (objective_text(live) if live is not None else "-", live is not None)
        out.append(
            (
                str(t.number),
                (
                    (t.number, t.attempt),
                    t.state,
                    objective,
                    "-" if t.best_step is None else str(t.best_step),
                    "-" if t.pruned_step is None else str(t.pruned_step),
                    None if d is None else int(d),
                    t.params_text(),
                ),
            )
        )
    return out


def curve_trials(detail: SweepDetail, n: int = TOP_CURVES, extra: int | None = None) -> list[TrialRow]:
    """The trials whose objective curves are drawn: the first ``n`` with a curve in the detail's
    order (the best completed ones; running ones while fewer completed), and trial ``extra``
    (the one the cursor is on) when it has a curve and is not among them."""
    chosen = [t for t in detail.trials if t.curve][:n]
    if extra is not None and all(t.number != extra for t in chosen):
        chosen += [t for t in detail.trials if t.number == extra and t.curve]
    return chosen


def trial_line(t: TrialRow | None) -> str:
    """The trial the cursor is on, in one line of markup: its job (enter opens it), and why it
    ended when that was not a completion."""
    if t is None:
        return ""
    retry = f" (attempt {t.attempt})" if t.attempt > 1 else ""
    text = f"trial {t.number}{retry} · job {escape(t.job_id)}"
    if t.error:
        lvl = "$error" if t.state == "failed" else "$text-muted"
        text += f" · [{lvl}]{escape(t.error)}[/]"
    elif t.state == "pruned" and t.pruned_step is not None:
        text += f" · pruned at step {t.pruned_step}"
    return text + " · enter opens the job"


def sweep_head(detail: SweepDetail | None) -> str:
    """The selected sweep in three lines of markup."""
    if detail is None:
        return "no sweep selected"
    r = detail.row
    lvl = state_markup(r.state)
    pruning = "no pruning" if r.pruner == "off" else f"{r.pruner} pruning"
    parallel = f" · at most {detail.max_parallel} at once" if detail.max_parallel else ""
    line1 = (
        f"[b]{escape(r.sweep_id)}[/b]  [{lvl}]{escape(r.state)}[/]"
        + (f" ({escape(r.reason)})" if r.reason else "")
        + f"  [$text-muted]{escape(r.strategy)}, {pruning}{parallel} · objective[/] "
        f"[b]{escape(r.metric)}[/b] [$text-muted]{escape(r.goal)}[/]"
    )
    best = detail.best()
    if best is None:
        line2 = "best: [$text-muted]none yet (no trial completed)[/]"
    else:
        line2 = (
            f"best: trial [b]{best.number}[/b]  {escape(r.metric)} = "
            f"[b]{objective_text(best.value)}[/b]  {escape(best.params_text())}"
        )
    line3 = (
        f"[$text-muted]trials: {r.trials} of {r.max_trials} asked · {r.completed} completed, "
        f"{r.pruned} pruned, {r.failed} failed or stopped · {r.running} running, "
        f"{r.queued} queued[/]"
    )
    return "\n".join((line1, line2, line3))


def stop_trial_text(row: SweepRow, t: TrialRow) -> str:
    """The body of the confirmation before a trial is stopped."""
    so_far = live_value(t)
    reported = (
        f", {escape(row.metric)} {objective_text(so_far)} at step {t.curve[-1][0]}"
        if so_far is not None
        else ""
    )
    return (
        f"State: {escape(t.state)}{reported}.\n"
        f"  parameters  [b]{escape(t.params_text())}[/b]\n"
        f"  job         [b]{escape(t.job_id)}[/b]\n\n"
        "Its job is stopped like any job (SIGTERM to every rank, then SIGKILL after the grace "
        f"period). The sweep counts the trial as stopped and goes on: {row.done} of "
        f"{row.max_trials} trials are done."
    )


def stop_sweep_text(row: SweepRow) -> str:
    """The body of the confirmation before a whole sweep is stopped."""
    best = (
        f"trial {row.best_trial}, {escape(row.metric)} {objective_text(row.best_value)}"
        if row.best_trial is not None
        else "none yet"
    )
    return (
        f"State: {escape(row.state)}. {row.running} trial(s) running, {row.queued} queued; "
        f"{row.done} of {row.max_trials} done.\n\n"
        "Queued trials leave the queue and running ones are stopped (SIGTERM, then SIGKILL "
        "after the grace period); no new trial starts. Completed trials and the best result "
        f"are kept (best: {best})."
    )


def can_stop_trial(t: TrialRow) -> bool:
    return t.state not in TRIAL_FINAL


def can_stop_sweep(row: SweepRow) -> bool:
    return row.state not in SWEEP_FINAL


def _text(s: object, style: Any = None) -> Text:
    return Text("-" if s is None else str(s), style=style or "", no_wrap=True, overflow="ellipsis")


class SweepsTable(DiffTable):
    def columns_for(self, w: Any) -> list[Col]:
        return [
            Col("sweep", "Sweep"),
            Col("state", "State", 10),
            Col("strategy", "Strategy"),
            Col("trials", "Trials", 7),
            Col("live", "Running", 9),
            Col("pruned", "Pruned", 6),
            Col("failed", "Failed", 6),
            Col("objective", "Objective"),
            Col("best", "Best"),
        ]

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        if column == "state":
            return state_cell(raw, palette)
        if column == "live":
            if raw is None:
                return _text("-", palette["muted"])
            running, queued = raw
            t = Text(str(running), no_wrap=True)
            if queued:
                t.append(f" +{queued} q", style=palette["muted"])
            return t
        if column == "failed":
            return _text(raw, palette["crit"] if raw else palette["muted"])
        if column == "pruned":
            return _text(raw, None if raw else palette["muted"])
        if column == "best":
            return _text(raw, palette["strong"])
        return _text(raw)


class TrialsTable(DiffTable):
    """A sweep's trials; the objective column is named after the sweep's metric."""

    metric = "objective"

    def columns_for(self, w: Any) -> list[Col]:
        return [
            Col("trial", "#", 5),
            Col("state", "State", 10),
            Col("objective", self.metric[:14], max(9, min(14, len(self.metric)))),
            Col("best_step", "Best step", 9),
            Col("pruned", "Pruned at", 9),
            Col("time", "Time", 7),
            Col("params", "Parameters"),
        ]

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        if column == "trial":
            number, attempt = raw
            t = Text(str(number), no_wrap=True)
            if attempt > 1:
                t.append(f" ↻{attempt - 1}", style=palette["warn"])
            return t
        if column == "state":
            return state_cell(raw, palette)
        if column == "objective":
            text, live = raw
            return _text(text, palette["muted"] if live else palette["strong"])
        if column == "time":
            return _text(duration(raw) if raw is not None else "-")
        if column in ("best_step", "pruned"):
            return _text(raw, palette["muted"] if raw == "-" else None)
        return _text(raw)


# ---------------------------------------------------------------------------------------------
# Fetching (on a worker thread: the client's calls may wait on the network)


SweepFetch = ListFetch[SweepRow, SweepDetail]  # what one fetch brought (tui/app/widgets/listfetch.py)


def fetch_sweeps(client: Any, selected: str | None) -> SweepFetch:
    """The sweeps and the detail of ``selected`` (the newest when it is none or gone), from a
    ``tui.client.Client``; never raises: a failed call is the fetch's error."""
    return fetch_list(lambda: client.sweeps(), lambda ref: client.sweep_detail(ref), lambda r: r.sweep_id,
                      "sweep", selected)
