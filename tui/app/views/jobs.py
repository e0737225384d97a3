"""Jobs (3): every job the controller knows, newest first; enter opens one in Job (4). R
launches an ended job again, + and - change a job's priority (with a server: one's own, or an
admin's anyone's)."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import DataTable, Static

from tui.app.views.base import JOBS, View, set_text
from tui.app.widgets.tables import JobsTable, job_rows, jobs_running
from tui.model.jobstate import TERMINAL


class JobsView(View):
    ID, KEY, TITLE = "jobs", "3", "Jobs"
    FOLLOWS = frozenset({JOBS})
    TABLES = ("#jobs-table",)
    FOCUS = "#jobs-table"
    HELP_GROUP = "Jobs view"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("R", "retry_job", "Retry", id="jobs.retry"),
        Binding("plus", "priority(1)", "Priority up", id="jobs.priority_up", key_display="+"),
        Binding("minus", "priority(-1)", "Priority down", id="jobs.priority_down", key_display="-"),
    ]

    def compose(self) -> ComposeResult:
        yield Static("", id="jobs-status", classes="status")
        yield JobsTable(id="jobs-table")

    def update(self, now: float) -> None:
        jobs = self.shell.jobs_snapshot
        self.query_one("#jobs-table", JobsTable).apply(job_rows(jobs.rows, now))
        n = len(jobs.rows)
        status = (
            f"{n} job(s) · {jobs_running(jobs.rows)} running"
            "  [$text-muted](enter opens · l launch · s stop · R retry · +/- priority)[/]"
        )
        if not n:
            status = "no jobs yet: press l to launch one"
        set_text(self.query_one("#jobs-status", Static), status)

    def cursor_job(self) -> str | None:
        return self.query_one("#jobs-table", JobsTable).cursor_key

    def _chosen(self, ended: bool) -> str | None:
        """The job under the cursor if it has (``ended``) or has not ended; else says why not."""
        job_id = self.cursor_job()
        row = self.shell.jobs_snapshot.row(job_id) if job_id else None
        if job_id is None or row is None:
            self.notify("no job selected", severity="warning")
            return None
        if ended and row.state not in TERMINAL:
            self.notify(f"{job_id} is {row.state}: only an ended job is retried (s stops it)", severity="warning")
            return None
        if not ended and row.state in TERMINAL:
            self.notify(f"{job_id} has ended ({row.state}): its priority no longer matters", severity="warning")
            return None
        return job_id

    def action_retry_job(self) -> None:
        """Launch the ended job under the cursor again, as a new job (same spec and code, same owner)."""
        job_id = self._chosen(ended=True)
        if job_id is None:
            return
        client = self.shell.client

        def retry() -> str:
            v = client.retry(job_id)
            return f"{job_id}: retried as {v.job_id} ({v.state})"

        self.notify(f"retrying {job_id}…", title="job")
        self.shell.act("retry", retry)

    def action_priority(self, delta: int) -> None:
        """Raise or lower by one the priority of the job under the cursor (not ended)."""
        job_id = self._chosen(ended=False)
        if job_id is None:
            return
        client = self.shell.client

        def change() -> str:
            now = int(client.view(job_id).spec.get("priority") or 0)
            v = client.reprioritise(job_id, now + delta)
            return f"{job_id}: priority {now} -> {now + delta} ({v.state})"

        self.shell.act("priority", change)

    @on(DataTable.RowSelected, "#jobs-table")
    def _job_chosen(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self.shell.select_job(event.row_key.value)
            self.shell.tabs.active = "job"


VIEW = JobsView
