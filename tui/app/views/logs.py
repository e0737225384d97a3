"""Logs (6): the open job's logs, all ranks or one, followed live, searched (the keys are the
log widget's own)."""

from __future__ import annotations

from collections.abc import Sequence

from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.markup import escape
from textual.widget import Widget
from textual.widgets import Input, Static

from tui.app.views.base import JOBS, OPEN_JOB, View, set_text
from tui.app.widgets.logview import LogView


class LogsView(View):
    ID, KEY, TITLE = "logs", "6", "Logs"
    HELP_GROUP = "Logs view"
    FOLLOWS = frozenset({JOBS, OPEN_JOB})
    FOCUS = "#log-view"

    @classmethod
    def help_bindings(cls) -> Sequence[BindingType]:
        return LogView.BINDINGS

    def compose(self) -> ComposeResult:
        yield Static("", id="logs-status", classes="status")
        yield Input(
            placeholder="search the logs (enter finds, esc closes)",
            id="log-search",
            compact=True,
        )
        yield LogView(id="log-view")

    def setup(self) -> None:
        self.query_one("#log-search", Input).display = False

    def update(self, now: float) -> None:
        shell = self.shell
        detail = shell.jobwatch.detail(shell.job_id) if shell.job_id else None
        self.query_one("#log-view", LogView).set_buffer(
            detail.logs if detail else None,
            empty_message="no job open: pick one in Jobs (3)" if detail is None else None,
        )
        self._update_status()

    def sample(self) -> None:
        self.query_one("#log-view", LogView).sync()

    def _update_status(self) -> None:
        view = self.query_one("#log-view", LogView)
        if view.buffer is None:
            set_text(self.query_one("#logs-status", Static), "no job open")
            return
        rank = "all ranks" if view.rank is None else f"rank {view.rank}"
        parts = [
            f"[b]{escape(self.shell.job_id or '')}[/b]",
            rank,
            f"follow {'on' if view.follow else 'off'}",
            f"{view.line_count} lines",
        ]
        if view.search:
            parts.append(escape(view.match_status))
        text = " · ".join(parts) + "  [$text-muted](r rank · f follow · / search · n next)[/]"
        set_text(self.query_one("#logs-status", Static), text)

    @on(LogView.Changed)
    def _log_changed(self) -> None:
        self._update_status()

    @on(LogView.SearchRequested)
    def _search_requested(self) -> None:
        box = self.query_one("#log-search", Input)
        box.display = True
        box.focus()

    @on(Input.Submitted, "#log-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        view = self.query_one("#log-view", LogView)
        view.set_search(event.value.strip())
        if not event.value.strip():
            event.input.display = False
        view.focus()

    def on_escape(self, focused: Widget | None) -> bool:
        if not isinstance(focused, Input) or focused.id != "log-search":
            return False
        focused.value = ""
        focused.display = False
        view = self.query_one("#log-view", LogView)
        view.set_search("")
        view.focus()
        return True


VIEW = LogsView
