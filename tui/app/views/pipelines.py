"""Pipelines (9): pipelines, the selected one's steps as a tree; stop a pipeline, retry a step.

Fetched the way Sweeps fetches (the group ``pipelines``, ``FetchedView``), while the view shows."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.markup import escape
from textual.widgets import DataTable, Static

from tui.app.screens.dialogs import ConfirmSweepStop
from tui.app.views.base import FetchedView, set_text
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
from tui.client import Client
from tui.model.pipelineview import PipelineDetail, PipelineRow, StepRow


class PipelinesView(FetchedView[PipelineRow, PipelineDetail]):
    """The Pipelines view; its stop and retry keys are active while a table of it has focus."""

    ID, KEY, TITLE = "pipelines", "9", "Pipelines"
    HELP_GROUP = "Pipelines view"
    TABLES = ("#pipelines-table", "#steps-table")
    FOCUS = "#pipelines-table"
    POLL_S = 1.0
    NOUN, DETAIL_TABLE = "pipeline", "#steps-table"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("S", "stop_pipeline", "Stop pipeline", id="pipelines.stop"),
        Binding("r", "retry_step", "Retry step", id="pipelines.retry"),
    ]

    def compose(self) -> ComposeResult:
        with Vertical(id="pipelines-pane"):
            yield Static("loading pipelines…", id="pipelines-status", classes="status")
            yield PipelinesTable(id="pipelines-table")
            yield Static("", id="pipeline-head", classes="head")
            yield StepsTable(id="steps-table")
            yield Static("", id="step-detail", classes="detail")

    def setup(self) -> None:
        self.query_one("#steps-table").border_title = "steps, in dependency order"

    def key_of(self, row: PipelineRow) -> str:
        return row.pipeline_id

    def fetch_items(self, client: Client, selected: str | None) -> PipelineFetch:
        return fetch_pipelines(client, selected)

    # -- drawing ----------------------------------------------------------------------------

    def current_step(self) -> StepRow | None:
        d = self.shown_detail()
        if d is None:
            return None
        key = self.query_one("#steps-table", StepsTable).cursor_key
        return d.step(key) if key else None

    def update(self, now: float) -> None:
        hint = "enter: its steps · enter on a step: its job · S stop · r retry step"
        set_text(self.query_one("#pipelines-status", Static), self.status_text(NO_PIPELINES, hint))
        detail = self.shown_detail()
        self.query_one("#pipelines-table", PipelinesTable).apply(pipeline_rows(self.item_list, now))
        head = self.head_text(detail, lambda: pipeline_head(detail, now))
        set_text(self.query_one("#pipeline-head", Static), head)
        steps = self.query_one("#steps-table", StepsTable)
        steps.apply(step_rows(detail, now) if detail is not None else [])
        set_text(self.query_one("#step-detail", Static), step_detail(self.current_step(), now))

    @on(DataTable.RowHighlighted, "#pipelines-table")
    def _pipeline_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.select_item(event.row_key.value)

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
        d = self.shown_detail()
        row = self.selected_row()
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

        title = f"Stop pipeline [b]{escape(pipeline_id)}[/b]?"
        self.ask_then_act(ConfirmSweepStop(title, stop_pipeline_text(d, row), "Stop pipeline"),
                          f"stopping pipeline {pipeline_id}…", "stop pipeline", stop)

    def action_retry_step(self) -> None:
        """Run the failed or stopped step under the cursor again (and what was skipped for it)."""
        d = self.shown_detail()
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
