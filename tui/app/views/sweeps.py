"""Sweeps (7): sweeps, the selected one's trials, its charts; stop a trial or a sweep.

Fetched on a worker thread about once a second while the view shows (the group ``sweeps``): a
slow or dead controller leaves the last fetched on screen and never holds the UI."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.markup import escape
from textual.widgets import DataTable, Static

from tui.app.screens.dialogs import ConfirmSweepStop
from tui.app.views.base import FetchedView, set_text
from tui.app.widgets.chart import LINE_VARS, LossChart
from tui.app.widgets.sweeps import (
    NO_SWEEPS,
    SweepFetch,
    SweepsTable,
    TrialsTable,
    can_stop_sweep,
    can_stop_trial,
    curve_trials,
    fetch_sweeps,
    stop_sweep_text,
    stop_trial_text,
    sweep_head,
    sweep_rows,
    trial_line,
    trial_rows,
)
from tui.client import Client
from tui.model.sweepview import SweepDetail, SweepRow, TrialRow


class SweepsView(FetchedView[SweepRow, SweepDetail]):
    """The Sweeps view; its stop keys are active while a table of it has focus."""

    ID, KEY, TITLE = "sweeps", "7", "Sweeps"
    HELP_GROUP = "Sweeps view"
    TABLES = ("#sweeps-table", "#trials-table")
    FOCUS = "#sweeps-table"
    POLL_S = 1.0
    NOUN, DETAIL_TABLE = "sweep", "#trials-table"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "stop_trial", "Stop trial", id="sweeps.stop_trial"),
        Binding("S", "stop_sweep", "Stop sweep", id="sweeps.stop"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._wanted: str | None = None  # a pipeline's sweep step's sweep, to put the cursor on

    def compose(self) -> ComposeResult:
        with Vertical(id="sweeps-pane"):
            yield Static("loading sweeps…", id="sweeps-status", classes="status")
            yield SweepsTable(id="sweeps-table")
            yield Static("", id="sweep-head", classes="head")
            yield TrialsTable(id="trials-table")
            with Horizontal(id="sweep-charts"):
                yield LossChart(id="sweep-best")
                yield LossChart(id="sweep-curves")

    def setup(self) -> None:
        self.query_one("#sweep-best", LossChart).border_title = "best so far, by trial"
        self.query_one("#sweep-curves", LossChart).border_title = "objective by step"
        self.query_one("#trials-table").border_title = "trials, best first"

    def key_of(self, row: SweepRow) -> str:
        return row.sweep_id

    def fetch_items(self, client: Client, selected: str | None) -> SweepFetch:
        return fetch_sweeps(client, selected)

    def rows_fetched(self, ids: set[str]) -> None:
        if self._wanted not in ids:
            self._wanted = None  # a pipeline's sweep step's sweep, gone

    def open_sweep(self, sweep_id: str) -> None:
        """Show ``sweep_id`` with the cursor on it (a pipeline's sweep step was opened)."""
        if sweep_id != self.item_id:
            self.item_id = sweep_id
            self.item_detail = None
        self._wanted = sweep_id
        self.shell.tabs.active = self.ID

    # -- drawing ----------------------------------------------------------------------------

    def current_trial(self) -> TrialRow | None:
        d = self.item_detail
        if d is None:
            return None
        key = self.query_one("#trials-table", TrialsTable).cursor_key
        return next((t for t in d.trials if str(t.number) == key), None)

    def update(self, now: float) -> None:
        status = self.query_one("#sweeps-status", Static)
        sweeps = self.query_one("#sweeps-table", SweepsTable)
        trials = self.query_one("#trials-table", TrialsTable)
        hint = "enter: its trials · enter on a trial: its job"
        set_text(status, self.status_text(NO_SWEEPS, hint))
        sweeps.apply(sweep_rows(self.item_list))
        wanted = self._wanted  # a pipeline's sweep step was opened: the cursor on its sweep
        if wanted is not None and wanted in sweeps._order:
            self._wanted = None
            sweeps.move_cursor(row=sweeps._order.index(wanted))
        detail = self.shown_detail()
        set_text(self.query_one("#sweep-head", Static), self.head_text(detail, lambda: sweep_head(detail)))
        metric = detail.row.metric if detail is not None else "objective"
        if trials.metric != metric:
            trials.metric = metric
            trials.set_columns(trials.columns_for(self.shell.widths))
        trials.apply(trial_rows(detail, now) if detail is not None else [])
        self._update_charts(detail)

    def _update_charts(self, detail: SweepDetail | None) -> None:
        best = self.query_one("#sweep-best", LossChart)
        curves = self.query_one("#sweep-curves", LossChart)
        if detail is None:
            empty = "no sweep selected" if self.item_list else "no sweeps"
            best.set_series((), None, empty=empty)
            curves.set_series((), None, empty=empty)
            curves.border_subtitle = ""
            self.query_one("#trials-table", TrialsTable).border_subtitle = ""
            return
        r = detail.row
        so_far = detail.best_so_far()
        best.set_series(
            [so_far] if so_far else [],
            (r.sweep_id, so_far, r.max_trials),
            x_max=float(r.max_trials),
            x_min_step=1.0,
            steps=True,
            empty="no trial completed yet",
        )
        best.border_title = f"best {r.metric} so far, by trial"
        cursor = self.current_trial()
        self.query_one("#trials-table", TrialsTable).border_subtitle = trial_line(cursor)
        chosen = curve_trials(detail, extra=cursor.number if cursor is not None else None)
        curves.set_series(
            [t.curve for t in chosen],
            (r.sweep_id, tuple((t.number, len(t.curve), t.curve[-1]) for t in chosen)),
            empty=f"no {r.metric} reported yet",
        )
        curves.border_title = f"{r.metric} by step"
        curves.border_subtitle = " ".join(
            f"[{var}]━ #{t.number}[/]" for var, t in zip(LINE_VARS, chosen, strict=False)
        )

    @on(DataTable.RowHighlighted, "#sweeps-table")
    def _sweep_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.select_item(event.row_key.value)

    @on(DataTable.RowSelected, "#sweeps-table")
    def _sweep_chosen(self) -> None:
        self.query_one("#trials-table").focus()

    @on(DataTable.RowHighlighted, "#trials-table")
    def _trial_highlighted(self) -> None:
        self._update_charts(self.shown_detail())

    @on(DataTable.RowSelected, "#trials-table")
    def _trial_chosen(self) -> None:
        t = self.current_trial()
        if t is not None and t.state == "ready":
            self.notify(f"Trial {t.number} was asked ahead of its turn: it starts (and has a job) when a GPU frees.")
        elif t is not None:
            self.shell.select_job(t.job_id)
            self.shell.tabs.active = "job"

    # -- stopping ---------------------------------------------------------------------------

    def action_stop_trial(self) -> None:
        """Stop the trial the cursor is on, after a confirmation."""
        d = self.shown_detail()
        if d is None:
            self.notify("no sweep selected: pick one in Sweeps (7)", severity="warning")
            return
        t = self.current_trial()
        if t is None:
            self.notify("no trial selected: pick one in the trials table", severity="warning")
            return
        if not can_stop_trial(t):
            self.notify(f"trial {t.number} has already ended ({t.state})", severity="warning")
            return
        sweep_id, number = d.row.sweep_id, t.number
        shell = self.shell

        def stop() -> str:
            shell.client.sweep_stop_trial(sweep_id, number)
            return f"{sweep_id}: trial {number} stopping"

        title = f"Stop trial [b]{number}[/b] of sweep [b]{escape(sweep_id)}[/b]?"
        self.ask_then_act(ConfirmSweepStop(title, stop_trial_text(d.row, t), "Stop trial"),
                          f"stopping trial {number} of {sweep_id}…", "stop trial", stop)

    def action_stop_sweep(self) -> None:
        """Stop the selected sweep (its queued and running trials), after a confirmation."""
        row = self.selected_row()
        if row is None:
            self.notify("no sweep selected: pick one in Sweeps (7)", severity="warning")
            return
        if not can_stop_sweep(row):
            self.notify(f"{row.sweep_id} has already ended ({row.state})", severity="warning")
            return
        sweep_id = row.sweep_id
        shell = self.shell

        def stop() -> str:
            return f"sweep {sweep_id}: {shell.client.sweep_stop(sweep_id).row.state}"

        title = f"Stop sweep [b]{escape(sweep_id)}[/b]?"
        self.ask_then_act(ConfirmSweepStop(title, stop_sweep_text(row), "Stop sweep"),
                          f"stopping sweep {sweep_id}…", "stop sweep", stop)


VIEW = SweepsView
