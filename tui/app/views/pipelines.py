"""Pipelines (9): pipelines, the selected one's steps as a tree; stop a pipeline, retry a step.

Fetched the way Sweeps fetches (the group ``pipelines``), while the view shows."""

from __future__ import annotations

from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.markup import escape
from textual.widgets import DataTable, Static

from tui.app.screens.dialogs import ConfirmSweepStop
from tui.app.views.base import View, set_text
from tui.app.views.sweeps import SweepsView
from tui.app.widgets.pipelines import (
    NO_PIPELINES,
    PipelineFetch,
    PipelinesTable,
    StepsTable,
    can_retry_step,
    can_stop_pipeline,
    fetch_pipelines,
    pipeline_head,
    pipeline_rows,
    step_detail,
    step_rows,
    stop_pipeline_text,
)
from tui.model.pipelineview import PipelineDetail, PipelineRow, StepRow


class PipelinesView(View):
    """The Pipelines view; its stop and retry keys are active while a table of it has focus."""

    ID, KEY, TITLE = "pipelines", "9", "Pipelines"
    HELP_GROUP = "Pipelines view"
    TABLES = ("#pipelines-table", "#steps-table")
    FOCUS = "#pipelines-table"
    POLL_S = 1.0
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("S", "stop_pipeline", "Stop pipeline", id="pipelines.stop"),
        Binding("r", "retry_step", "Retry step", id="pipelines.retry"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.pipeline_id: str | None = None
        self.pipeline_list: tuple[PipelineRow, ...] = ()
        self.pipeline_detail: PipelineDetail | None = None
        self.pipelines_error: str | None = None
        self.pipelines_fetches = 0  # fetches done (tests wait on it)
        self.inflight = False
        self._again = False

    def compose(self) -> ComposeResult:
        with Vertical(id="pipelines-pane"):
            yield Static("loading pipelines…", id="pipelines-status", classes="status")
            yield PipelinesTable(id="pipelines-table")
            yield Static("", id="pipeline-head", classes="head")
            yield StepsTable(id="steps-table")
            yield Static("", id="step-detail", classes="detail")

    def setup(self) -> None:
        self.query_one("#steps-table").border_title = "steps, in dependency order"

    def shown(self) -> None:
        self.poll(soon=True)

    def acted(self) -> None:
        self.poll(soon=True)

    # -- fetching ---------------------------------------------------------------------------

    def poll(self, soon: bool = False) -> None:
        """Fetch the pipelines (and the selected one's detail) on a worker thread, while the
        view shows and no fetch is under way (as Sweeps does)."""
        shell = self.shell
        if shell.closing or shell.tabs.active != self.ID:
            return
        if self.inflight:
            self._again = self._again or soon
            return
        self.inflight = True
        self.app.run_worker(
            lambda sel=self.pipeline_id: fetch_pipelines(shell.client, sel),
            thread=True,
            group=self.ID,
            name=self.ID,
            exit_on_error=False,
        )

    def worker_done(self, result: Any, error: str | None = None) -> None:
        fetch: PipelineFetch | None = result
        self.inflight = False
        self.pipelines_fetches += 1
        if self.shell.closing:
            return
        if fetch is None:
            self.pipelines_error = error or "pipelines: the fetch failed"
        else:
            self.pipelines_error = fetch.error
            if fetch.rows is not None:
                self.pipeline_list = fetch.rows
                if self.pipeline_id not in {r.pipeline_id for r in fetch.rows}:
                    self.pipeline_id = fetch.selected
                    self.pipeline_detail = None
            if fetch.selected == self.pipeline_id:
                if fetch.detail is not None:
                    self.pipeline_detail = fetch.detail
                elif fetch.error is None:
                    self.pipeline_detail = None
            else:
                self._again = True  # the selection moved while this one was fetched
        if self.shell.tabs.active == self.ID:
            self.update(self.shell.clock())
            self.shell.dirty.discard(self.ID)
        if self._again:
            self._again = False
            self.poll()

    # -- drawing ----------------------------------------------------------------------------

    def _shown_pipeline(self) -> PipelineDetail | None:
        d = self.pipeline_detail
        return d if d is not None and d.row.pipeline_id == self.pipeline_id else None

    def current_step(self) -> StepRow | None:
        d = self._shown_pipeline()
        if d is None:
            return None
        key = self.query_one("#steps-table", StepsTable).cursor_key
        return d.step(key) if key else None

    def update(self, now: float) -> None:
        status = self.query_one("#pipelines-status", Static)
        rows = self.pipeline_list
        detail = self._shown_pipeline()
        if not self.pipelines_fetches:
            text = "loading pipelines…"
        elif not rows:
            text = NO_PIPELINES
        else:
            running = sum(1 for r in rows if r.state in ("running", "stopping"))
            text = (
                f"{len(rows)} pipeline(s) · {running} running  "
                "[$text-muted](enter: its steps · enter on a step: its job · S stop · r retry step)[/]"
            )
        if self.pipelines_error:
            text = f"[$error]{escape(self.pipelines_error[:300])}[/]" + (
                "  [$text-muted](showing the last fetched)[/]" if rows else ""
            )
        set_text(status, text)
        self.query_one("#pipelines-table", PipelinesTable).apply(pipeline_rows(rows, now))
        head = self.query_one("#pipeline-head", Static)
        if not rows:
            set_text(head, "no pipeline selected" if self.pipelines_fetches else "")
        elif detail is None and self.pipeline_id is not None:
            set_text(head, f"[b]{escape(self.pipeline_id)}[/b]  [$text-muted]loading…[/]")
        else:
            set_text(head, pipeline_head(detail, now))
        steps = self.query_one("#steps-table", StepsTable)
        steps.apply(step_rows(detail, now) if detail is not None else [])
        set_text(self.query_one("#step-detail", Static), step_detail(self.current_step(), now))

    @on(DataTable.RowHighlighted, "#pipelines-table")
    def _pipeline_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value
        if key and key != self.pipeline_id:
            self.pipeline_id = key
            self.pipeline_detail = None
            self.update(self.shell.clock())
            self.query_one("#steps-table", StepsTable).move_cursor(row=0)
            self.poll(soon=True)

    @on(DataTable.RowSelected, "#pipelines-table")
    def _pipeline_chosen(self) -> None:
        self.query_one("#steps-table").focus()

    @on(DataTable.RowHighlighted, "#steps-table")
    def _step_highlighted(self) -> None:
        # A highlight queued while the app shuts down (a late fetch's rows) finds no panel: nothing
        # to show then, and no reason to crash the app.
        found = self.query("#step-detail").results(Static)
        detail = next(found, None)
        if detail is None:
            return
        set_text(detail, step_detail(self.current_step(), self.shell.clock()))

    @on(DataTable.RowSelected, "#steps-table")
    def _step_chosen(self) -> None:
        """A job step: its job in the Job view; a sweep step: its sweep in the Sweeps view."""
        s = self.current_step()
        if s is None:
            return
        if s.kind == "sweep" and s.sweep_id:
            self.shell.view(SweepsView).open_sweep(s.sweep_id)
        elif s.job_id:
            self.shell.select_job(s.job_id)
            self.shell.tabs.active = "job"
        else:
            self.notify(f"step {s.name} has no job yet ({s.state})", title="pipeline")

    # -- stopping and retrying --------------------------------------------------------------

    def action_stop_pipeline(self) -> None:
        """Stop the selected pipeline (its running steps; no further step starts), after a
        confirmation."""
        d = self._shown_pipeline()
        row = d.row if d is not None else None
        if row is None:
            row = next((r for r in self.pipeline_list if r.pipeline_id == self.pipeline_id), None)
        if row is None:
            self.notify("no pipeline selected: pick one in Pipelines (9)", severity="warning")
            return
        if not can_stop_pipeline(row):
            self.notify(f"{row.pipeline_id} has already ended ({row.state})", severity="warning")
            return
        pipeline_id = row.pipeline_id
        shell = self.shell

        def stop() -> str:
            return f"pipeline {pipeline_id}: {shell.client.pipeline_stop(pipeline_id).row.state}"

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.notify(f"stopping pipeline {pipeline_id}…", title="pipeline")
                shell.act("stop pipeline", stop)

        title = f"Stop pipeline [b]{escape(pipeline_id)}[/b]?"
        shell.dialog(ConfirmSweepStop(title, stop_pipeline_text(d, row), "Stop pipeline"), confirmed)

    def action_retry_step(self) -> None:
        """Run the failed or stopped step under the cursor again (and what was skipped for it)."""
        d = self._shown_pipeline()
        if d is None:
            self.notify("no pipeline selected: pick one in Pipelines (9)", severity="warning")
            return
        s = self.current_step()
        if s is None:
            self.notify("no step selected: pick one in the steps table", severity="warning")
            return
        if not can_retry_step(s):
            self.notify(f"step {s.name} is {s.state}: only a failed or stopped step is retried",
                        severity="warning")
            return
        pipeline_id, step = d.row.pipeline_id, s.name
        shell = self.shell

        def retry() -> str:
            after = shell.client.pipeline_retry(pipeline_id, step).step(step)
            return f"pipeline {pipeline_id}: step {step} {after.state if after else 'retried'}"

        self.notify(f"retrying step {step} of {pipeline_id}…", title="pipeline")
        shell.act("retry step", retry)


VIEW = PipelinesView
