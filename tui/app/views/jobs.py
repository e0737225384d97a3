"""Jobs (3): every job the controller knows, newest first; enter opens one in Job (4)."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.widgets import DataTable, Static

from tui.app.views.base import JOBS, View, set_text
from tui.app.widgets.tables import JobsTable, job_rows, jobs_running


class JobsView(View):
    ID, KEY, TITLE = "jobs", "3", "Jobs"
    FOLLOWS = frozenset({JOBS})
    TABLES = ("#jobs-table",)
    FOCUS = "#jobs-table"

    def compose(self) -> ComposeResult:
        yield Static("", id="jobs-status", classes="status")
        yield JobsTable(id="jobs-table")

    def update(self, now: float) -> None:
        jobs = self.shell.jobs_snapshot
        self.query_one("#jobs-table", JobsTable).apply(job_rows(jobs.rows, now))
        n = len(jobs.rows)
        status = (
            f"{n} job(s) · {jobs_running(jobs.rows)} running"
            "  [$text-muted](enter opens · l launch · s stop)[/]"
        )
        if not n:
            status = "no jobs yet: press l to launch one"
        set_text(self.query_one("#jobs-status", Static), status)

    def cursor_job(self) -> str | None:
        return self.query_one("#jobs-table", JobsTable).cursor_key

    @on(DataTable.RowSelected, "#jobs-table")
    def _job_chosen(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self.shell.select_job(event.row_key.value)
            self.shell.tabs.active = "job"


VIEW = JobsView
