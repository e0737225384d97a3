"""Doctor (0): the last report's findings, by check, bad first; the selected one in full; the
p2p bandwidth matrix. A run is one worker (the group ``doctor``): measurement jobs on every host,
so it takes a while, and the last report stays shown until the new one arrives."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.markup import escape
from textual.widgets import DataTable, Static

from tui.app.views.base import View, set_text
from tui.app.widgets.doctor import (
    NO_REPORT,
    DoctorRun,
    FindingsTable,
    finding_detail,
    finding_rows,
    keyed_findings,
    matrix_markup,
    p2p_matrix,
    run_doctor,
    skipped_markup,
    summary_markup,
)
from tui.model.doctor import DoctorReport


class DoctorView(View):
    """The Doctor view; its run key is active while its table has focus."""

    ID, KEY, TITLE = "doctor", "0", "Doctor"
    HELP_GROUP = "Doctor view"
    TABLES = ("#doctor-table",)
    FOCUS = "#doctor-table"
    POLL_S = 0.5  # the run's elapsed time, the report's age
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("D", "run_doctor", "Run doctor", id="doctor.run"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.doctor_report: DoctorReport | None = None
        self.doctor_error: str | None = None
        self.doctor_runs = 0  # runs ended, with a report or an error (tests wait on it)
        self._since: float | None = None  # time.monotonic() when the run under way began

    def compose(self) -> ComposeResult:
        with Vertical(id="doctor-pane"):
            yield Static(NO_REPORT, id="doctor-status", classes="status")
            yield FindingsTable(id="doctor-table")
            yield Static("", id="doctor-detail", classes="detail")
            yield Static("", id="doctor-matrix")

    def setup(self) -> None:
        self.query_one("#doctor-table").border_title = "findings by check, bad first"
        matrix = self.query_one("#doctor-matrix")
        matrix.border_title = "p2p bandwidth, host x host"
        matrix.display = False

    def commands(self) -> Iterable[SystemCommand]:
        yield SystemCommand(
            "Run the doctor over every host",
            f"Bandwidth, slow links, disks, version drift (measurement jobs; {self.KEY} shows it)",
            self.from_palette,
        )

    @property
    def doctor_running(self) -> bool:
        return self._since is not None

    def action_run_doctor(self) -> None:
        """Run the doctor over every host on a worker thread; one run at a time."""
        if self.doctor_running:
            self.notify("the doctor is already running", title="doctor", severity="warning")
            return
        self._since = time.monotonic()
        self.doctor_error = None
        shell = self.shell
        self.app.run_worker(
            lambda: run_doctor(shell.client),
            thread=True,
            group=self.ID,
            name=self.ID,
            exit_on_error=False,
        )
        self.update(shell.clock())

    def from_palette(self) -> None:
        self.shell.tabs.active = self.ID
        self.action_run_doctor()

    def worker_done(self, result: Any, error: str | None = None) -> None:
        run: DoctorRun | None = result
        self._since = None
        self.doctor_runs += 1
        if run is None:
            self.doctor_error = error or "doctor: the run failed"
        elif run.report is not None:
            self.doctor_report = run.report
            self.doctor_error = None
        else:
            self.doctor_error = run.error
        if self.shell.tabs.active == self.ID:
            self.update(self.shell.clock())
        else:
            self.shell.dirty.add(self.ID)
            report = self.doctor_report
            if self.doctor_error:
                self.notify(escape(self.doctor_error), title="doctor failed", severity="error")
            elif report is not None:
                self.notify(f"doctor: {report.worst} ({self.KEY} shows it)", title="doctor")

    def poll(self) -> None:
        if not self.shell.closing and self.shell.tabs.active == self.ID:
            self.update(self.shell.clock())

    def update(self, now: float) -> None:
        report = self.doctor_report
        lines = []
        if self._since is not None:
            took = int(time.monotonic() - self._since)
            lines.append(f"[$warning]running… ({took}s)[/] [$text-muted]measurement jobs on every host"
                         + ("; the last report below" if report is not None else "") + "[/]")
        if self.doctor_error:
            lines.append(f"[$error]{escape(self.doctor_error[:300])}[/]"
                         + (" [$text-muted](showing the last report)[/]" if report is not None else ""))
        if report is not None:
            lines.append(summary_markup(report, now) + "  [$text-muted](D runs again)[/]")
            skipped = skipped_markup(report)
            if skipped:
                lines.append(skipped)
        elif self._since is None:
            lines.append("[$text-muted]D runs it again[/]" if self.doctor_error else NO_REPORT)
        set_text(self.query_one("#doctor-status", Static), "\n".join(lines))
        self.query_one("#doctor-table", FindingsTable).apply(finding_rows(report))
        self._update_detail()
        matrix = p2p_matrix(report)
        box = self.query_one("#doctor-matrix", Static)
        box.display = matrix is not None
        if matrix is not None:
            set_text(box, matrix_markup(matrix))

    @on(DataTable.RowHighlighted, "#doctor-table")
    def _update_detail(self) -> None:
        key = self.query_one("#doctor-table", FindingsTable).cursor_key
        f = dict(keyed_findings(self.doctor_report)).get(key) if key else None
        box = self.query_one("#doctor-detail", Static)
        text = finding_detail(f)
        box.display = bool(text)
        set_text(box, text)


VIEW = DoctorView
