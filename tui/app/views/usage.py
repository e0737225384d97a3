"""Usage (u): who used the GPUs, per person and per week, as bars; under them each person's GPU
hours, jobs, preemptions and goodput. The figures are the controller's ``usage`` (the jobs'
recorded GPU time, ``tui.model.usage``); with a server, everyone's. Read on a worker (the group
``usage``) when the tab opens and every minute while it shows; ``r`` reads again."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.markup import escape
from textual.widgets import Static

from tui.app.views.base import View, set_text
from tui.app.widgets.format import bar_text
from tui.model.usage import UsageReport, recent_weeks, report_lines, weekly_bars

WEEKS = 6  # the weeks the bars cover, this one the last
BAR_W = 40


def chart_markup(report: UsageReport | None, now: float, weeks: int = WEEKS, width: int = BAR_W) -> str:
    """Each person's GPU hours in each of the last ``weeks`` weeks, one bar a week, scaled to the
    largest."""
    if report is None:
        return "[$text-muted]reading usage…[/]"
    if not report.rows:
        return "[$text-muted]no GPU time recorded yet[/]"
    bars = weekly_bars(report, recent_weeks(now, weeks))
    top = max((h for _, _, h in bars), default=0.0) or 1.0
    keyw = max(len(r.key) for r in report.rows)
    lines = []
    last = None
    for key, week, hours in bars:
        who = escape(key) if key != last else ""
        last = key
        bar = bar_text(hours / top, width)
        figure = f"{hours:8.2f} GPU h" if hours > 0 else f"{'-':>8}      "
        lines.append(f"{who:<{keyw}}  {week} {figure}  [$accent]{bar}[/]")
    return "\n".join(lines)


class UsageView(View):
    """The Usage view."""

    ID, KEY, TITLE = "usage", "u", "Usage"
    HELP_GROUP = "Usage view"
    FOCUS = "#usage-pane"
    POLL_S = 60.0
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "read_usage", "Read usage again", id="usage.read"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.usage_report: UsageReport | None = None
        self.usage_error: str | None = None
        self.usage_reads = 0  # reads ended, with a report or an error (tests wait on it)
        self._reading = False

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="usage-pane"):
            yield Static("", id="usage-status", classes="status")
            yield Static("", id="usage-chart")
            yield Static("", id="usage-table")

    def setup(self) -> None:
        self.query_one("#usage-chart").border_title = f"GPU hours per person, last {WEEKS} weeks"
        self.query_one("#usage-table").border_title = "all time"

    def shown(self) -> None:
        self.action_read_usage()

    def poll(self) -> None:
        if not self.shell.closing and self.shell.tabs.active == self.ID:
            self.action_read_usage()

    def action_read_usage(self) -> None:
        if self._reading:
            return
        self._reading = True
        client = self.shell.client
        self.app.run_worker(lambda: client.usage(by="user"), thread=True, group=self.ID, name=self.ID,
                            exit_on_error=False)

    def worker_done(self, result: Any, error: str | None = None) -> None:
        self._reading = False
        self.usage_reads += 1
        if result is not None:
            self.usage_report, self.usage_error = result, None
        else:
            self.usage_error = error or "usage: the read failed"
        self.redraw()

    def update(self, now: float) -> None:
        report = self.usage_report
        status = "[$text-muted]the jobs' recorded GPU time (GPUs x time of each attempt); r reads again[/]"
        if report is not None and report.source:
            status = (f"[$text-muted]Slurm's accounting ({escape(report.source)}): every user's Slurm jobs, "
                      "GPUs x time of each; r reads again[/]")
        elif report is not None and report.note:
            status = f"[$warning]{escape(report.note[:300])}[/]"
        if self.usage_error:
            status = f"[$error]{escape(self.usage_error[:300])}[/]"
        set_text(self.query_one("#usage-status", Static), status)
        set_text(self.query_one("#usage-chart", Static), chart_markup(report, now))
        # (the table without the lines above it: whose figures, the span: the status and chart say them)
        bare = dataclasses.replace(report, source=None, note=None) if report is not None else None
        table = "\n".join(escape(line) for line in report_lines(bare)[1:]) if bare is not None else ""
        set_text(self.query_one("#usage-table", Static), table)


VIEW = UsageView
