"""Jobs (3): every job the controller knows, newest first; enter opens one in Job (4). R
launches an ended job again, + and - change a job's priority (with a server: one's own, or an
admin's anyone's). With ``[slurm]`` in the inventory, Slurm's queue below them: every user's
pending and running jobs with Slurm's pending reasons, read on the login host through its agent
on a worker thread every ``POLL_S`` seconds (docs/slurm.md)."""

from __future__ import annotations

from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.markup import escape
from textual.widgets import DataTable, Static

from tui.app.views.base import JOBS, SlurmRead, View, set_text
from tui.app.widgets.tables import JobsTable, SlurmQueueTable, job_rows, jobs_running, slurm_queue_rows
from tui.model.jobstate import TERMINAL
from tui.model.slurm import SQUEUE_ARGS, SlurmJob, read_jobs


class JobsView(View):
    ID, KEY, TITLE = "jobs", "3", "Jobs"
    FOLLOWS = frozenset({JOBS})
    TABLES = ("#jobs-table", "#slurm-queue")
    FOCUS = "#jobs-table"
    HELP_GROUP = "Jobs view"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("R", "retry_job", "Retry", id="jobs.retry"),
        Binding("plus", "priority(1)", "Priority up", id="jobs.priority_up", key_display="+"),
        Binding("minus", "priority(-1)", "Priority down", id="jobs.priority_down", key_display="-"),
    ]

    POLL_S = 10.0  # Slurm's queue read again (inventories with [slurm] only)

    def __init__(self) -> None:
        super().__init__()
        self.slurm = False  # the inventory has [slurm]: Slurm's queue is shown
        self.slurm_jobs: list[SlurmJob] | None = None  # its last answer (None: none yet)
        self.slurm_error: str | None = None  # what kept the last read from answering
        self.reader = SlurmRead(read_jobs, "slurm queue")

    @property
    def slurm_reads(self) -> int:
        """Reads of Slurm's queue ended, answered or not (tests wait on it)."""
        return self.reader.reads

    def compose(self) -> ComposeResult:
        yield Static("", id="jobs-status", classes="status")
        yield JobsTable(id="jobs-table")
        head = Static("", id="slurm-queue-head", classes="head")
        head.display = False
        yield head
        table = SlurmQueueTable(id="slurm-queue")
        table.display = False
        yield table

    def setup(self) -> None:
        if getattr(self.shell.client.inventory, "slurm", None) is None:
            return
        self.slurm = True
        self.query_one("#slurm-queue-head").display = True
        table = self.query_one("#slurm-queue", SlurmQueueTable)
        table.display = True
        table.border_title = "Slurm's queue: every user's jobs, pending first"
        self.poll()

    def poll(self) -> None:
        """Slurm's queue, read again on a worker thread (never on the UI's)."""
        if self.slurm:
            self.reader.start(self)

    def worker_done(self, result: Any, error: str | None = None) -> None:
        jobs, error = self.reader.ended(result, error)
        if jobs is not None:
            self.slurm_jobs, self.slurm_error = jobs, None
        else:  # the last answer stays, said to be old
            self.slurm_error = error or "Slurm's queue: the read failed"
        self.redraw()

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
        if self.slurm:
            self.query_one("#slurm-queue", SlurmQueueTable).apply(slurm_queue_rows(self.slurm_jobs or []))
            set_text(self.query_one("#slurm-queue-head", Static), slurm_queue_head(
                self.slurm_jobs, self.slurm_error, self.shell.client.inventory))

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


def slurm_queue_head(jobs: list[SlurmJob] | None, error: str | None, inventory: Any) -> str:
    """The line over Slurm's queue: whose it is and how many wait, that Slurm schedules the
    cluster (not rigdeck's queue), and what kept the last read from answering."""
    login = inventory.slurm.login_host(inventory.hosts) or "?"
    if jobs is None and error is None:
        counts = f"reading ({' '.join(SQUEUE_ARGS[:2])} on {login})"
    elif jobs is None:
        counts = "not read"
    else:
        pending = sum(1 for j in jobs if j.pending)
        counts = f"{len(jobs)} job(s) · {pending} pending · on {login}"
    line = (f"Slurm: {counts}  [$text-muted]Slurm schedules this cluster: rigdeck's launches wait in its "
            f"queue, not in rigdeck's[/]")
    if error:
        old = " (the last answer shown)" if jobs is not None else ""
        line += f"\n[$warning]{escape(error)}{old}[/]"
    return line


VIEW = JobsView
