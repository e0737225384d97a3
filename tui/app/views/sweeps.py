"""Sweeps (7): sweeps, the selected one's trials, its charts; stop a trial or a sweep.

Fetched on a worker thread about once a second while the view shows (the group ``sweeps``): a
slow or dead controller leaves the last fetched on screen and never holds the UI."""

from __future__ import annotations

from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.markup import escape
from textual.widgets import DataTable, Static

from tui.app.screens.dialogs import ConfirmSweepStop
from tui.app.views.base import View, set_text
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
from tui.model.sweepview import SweepDetail, SweepRow, TrialRow


class SweepsView(View):
    """The Sweeps view; its stop keys are active while a table of it has focus."""

    ID, KEY, TITLE = "sweeps", "7", "Sweeps"
    HELP_GROUP = "Sweeps view"
    TABLES = ("#sweeps-table", "#trials-table")
    FOCUS = "#sweeps-table"
    POLL_S = 1.0
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "stop_trial", "Stop trial", id="sweeps.stop_trial"),
        Binding("S", "stop_sweep", "Stop sweep", id="sweeps.stop"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.sweep_id: str | None = None
        self.sweep_list: tuple[SweepRow, ...] = ()
        self.sweep_detail: SweepDetail | None = None
        self.sweeps_error: str | None = None
        self.sweeps_fetches = 0  # fetches done (tests wait on it)
        self._inflight = False
        self._again = False
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

    def shown(self) -> None:
        self.poll(soon=True)

    def acted(self) -> None:
        self.poll(soon=True)

    def open_sweep(self, sweep_id: str) -> None:
        """Show ``sweep_id`` with the cursor on it (a pipeline's sweep step was opened)."""
        if sweep_id != self.sweep_id:
            self.sweep_id = sweep_id
            self.sweep_detail = None
        self._wanted = sweep_id
        self.shell.tabs.active = self.ID

    # -- fetching ---------------------------------------------------------------------------

    def poll(self, soon: bool = False) -> None:
        """Fetch the sweeps (and the selected one's detail) on a worker thread, while the view
        shows and no fetch is under way; ``soon``: one more right after the current one (the
        selection changed, a stop was sent)."""
        shell = self.shell
        if shell.closing or shell.tabs.active != self.ID:
            return
        if self._inflight:
            self._again = self._again or soon
            return
        self._inflight = True
        self.app.run_worker(
            lambda sel=self.sweep_id: fetch_sweeps(shell.client, sel),
            thread=True,
            group=self.ID,
            name=self.ID,
            exit_on_error=False,
        )

    def worker_done(self, result: Any, error: str | None = None) -> None:
        fetch: SweepFetch | None = result
        self._inflight = False
        self.sweeps_fetches += 1
        if self.shell.closing:
            return
        if fetch is None:
            self.sweeps_error = error or "sweeps: the fetch failed"
        else:
            self.sweeps_error = fetch.error
            if fetch.rows is not None:
                self.sweep_list = fetch.rows
                ids = {r.sweep_id for r in fetch.rows}
                if self._wanted not in ids:
                    self._wanted = None  # a pipeline's sweep step's sweep, gone
                if self.sweep_id not in ids:
                    self.sweep_id = fetch.selected
                    self.sweep_detail = None
            if fetch.selected == self.sweep_id:
                if fetch.detail is not None:
                    self.sweep_detail = fetch.detail
                elif fetch.error is None:
                    self.sweep_detail = None
            else:
                self._again = True  # the selection moved while this one was fetched
        if self.shell.tabs.active == self.ID:
            self.update(self.shell.clock())
            self.shell.dirty.discard(self.ID)
        if self._again:
            self._again = False
            self.poll()

    # -- drawing ----------------------------------------------------------------------------

    def current_trial(self) -> TrialRow | None:
        d = self.sweep_detail
        if d is None:
            return None
        key = self.query_one("#trials-table", TrialsTable).cursor_key
        return next((t for t in d.trials if str(t.number) == key), None)

    def update(self, now: float) -> None:
        status = self.query_one("#sweeps-status", Static)
        sweeps = self.query_one("#sweeps-table", SweepsTable)
        trials = self.query_one("#trials-table", TrialsTable)
        rows = self.sweep_list
        detail = self.sweep_detail
        if not self.sweeps_fetches:
            text = "loading sweeps…"
        elif not rows:
            text = NO_SWEEPS
        else:
            running = sum(1 for r in rows if r.state in ("running", "stopping"))
            text = (
                f"{len(rows)} sweep(s) · {running} running  "
                "[$text-muted](enter: its trials · enter on a trial: its job)[/]"
            )
        if self.sweeps_error:
            text = f"[$error]{escape(self.sweeps_error[:300])}[/]" + (
                "  [$text-muted](showing the last fetched)[/]" if rows else ""
            )
        set_text(status, text)
        sweeps.apply(sweep_rows(rows))
        wanted = self._wanted  # a pipeline's sweep step was opened: the cursor on its sweep
        if wanted is not None and wanted in sweeps._order:
            self._wanted = None
            sweeps.move_cursor(row=sweeps._order.index(wanted))
        if detail is not None and detail.row.sweep_id != self.sweep_id:
            detail = None
        head = self.query_one("#sweep-head", Static)
        if not rows:
            set_text(head, "no sweep selected" if self.sweeps_fetches else "")
        elif detail is None and self.sweep_id is not None:
            set_text(head, f"[b]{escape(self.sweep_id)}[/b]  [$text-muted]loading…[/]")
        else:
            set_text(head, sweep_head(detail))
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
            empty = "no sweep selected" if self.sweep_list else "no sweeps"
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
        key = event.row_key.value
        if key and key != self.sweep_id:
            self.sweep_id = key
            self.sweep_detail = None
            self.update(self.shell.clock())
            self.query_one("#trials-table", TrialsTable).move_cursor(row=0)
            self.poll(soon=True)

    @on(DataTable.RowSelected, "#sweeps-table")
    def _sweep_chosen(self) -> None:
        self.query_one("#trials-table").focus()

    @on(DataTable.RowHighlighted, "#trials-table")
    def _trial_highlighted(self) -> None:
        self._update_charts(
            self.sweep_detail
            if self.sweep_detail is not None and self.sweep_detail.row.sweep_id == self.sweep_id
            else None
        )

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
        d = self.sweep_detail
        if d is None or d.row.sweep_id != self.sweep_id:
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

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.notify(f"stopping trial {number} of {sweep_id}…", title="sweep")
                shell.act("stop trial", stop)

        title = f"Stop trial [b]{number}[/b] of sweep [b]{escape(sweep_id)}[/b]?"
        self.shell.dialog(ConfirmSweepStop(title, stop_trial_text(d.row, t), "Stop trial"), confirmed)

    def action_stop_sweep(self) -> None:
        """Stop the selected sweep (its queued and running trials), after a confirmation."""
        d = self.sweep_detail
        row = d.row if d is not None and d.row.sweep_id == self.sweep_id else None
        if row is None:
            row = next((r for r in self.sweep_list if r.sweep_id == self.sweep_id), None)
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

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.notify(f"stopping sweep {sweep_id}…", title="sweep")
                shell.act("stop sweep", stop)

        title = f"Stop sweep [b]{escape(sweep_id)}[/b]?"
        self.shell.dialog(ConfirmSweepStop(title, stop_sweep_text(row), "Stop sweep"), confirmed)


VIEW = SweepsView
