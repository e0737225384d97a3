"""GPUs (2): every GPU of the cluster, with a filter and sort keys."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.markup import escape
from textual.widget import Widget
from textual.widgets import Input, Static

from tui.app.views.base import HOSTS, View, set_text
from tui.app.widgets.tables import BUSY_FILTERS, SORT_LABELS, SORTS, GpuFilter, GpusTable


class GpusView(View):
    """The GPU table with its filter and sort keys (active while the view has focus)."""

    ID, KEY, TITLE = "gpus", "2", "GPUs"
    HELP_GROUP = "GPUs view"
    FOLLOWS = frozenset({HOSTS})
    TABLES = ("#gpus-table",)
    FOCUS = "#gpus-table"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", id="gpus.filter"),
        Binding("b", "busy", "Busy/idle", id="gpus.busy"),
        Binding("o", "sort", "Sort", id="gpus.sort"),
        Binding("escape", "clear_filter", "Clear filter", id="gpus.clear", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self.gpu_filter = GpuFilter()
        self.gpu_sort = "host"

    def compose(self) -> ComposeResult:
        with Vertical(id="gpus-pane"):
            yield Static("", id="gpus-status", classes="status")
            yield Input(
                placeholder="filter: host, job id, busy, idle, host:NAME, job:ID "
                "(enter applies, esc clears)",
                id="gpu-filter",
                compact=True,
            )
            yield GpusTable(id="gpus-table")

    def setup(self) -> None:
        self.query_one("#gpu-filter", Input).display = False

    def update(self, now: float) -> None:
        table = self.query_one("#gpus-table", GpusTable)
        shell = self.shell
        hosts = shell.hosts_snapshot
        table.apply_state(shell.client.state, hosts, shell.widths, self.gpu_filter, self.gpu_sort)
        total = sum(h.gpu_count for h in hosts)
        status = (
            f"{table.row_count}/{total} GPUs · filter: {escape(self.gpu_filter.describe())} · "
            f"sort: {SORT_LABELS[self.gpu_sort]}  [$text-muted](/ filter · b busy/idle · o sort)[/]"
        )
        set_text(self.query_one("#gpus-status", Static), status)

    def cursor_host(self) -> str | None:
        key = self.query_one("#gpus-table", GpusTable).cursor_key
        return key.split("/", 1)[0] if key else None

    def action_filter(self) -> None:
        box = self.query_one("#gpu-filter", Input)
        box.display = True
        box.focus()

    def action_busy(self) -> None:
        i = BUSY_FILTERS.index(self.gpu_filter.busy)
        self.gpu_filter = GpuFilter(BUSY_FILTERS[(i + 1) % len(BUSY_FILTERS)], self.gpu_filter.text)
        self.shell.refresh_views(force=True)

    def action_sort(self) -> None:
        self.gpu_sort = SORTS[(SORTS.index(self.gpu_sort) + 1) % len(SORTS)]
        self.shell.refresh_views(force=True)

    def action_clear_filter(self) -> None:
        self.gpu_filter = GpuFilter()
        box = self.query_one("#gpu-filter", Input)
        box.value = ""
        box.display = False
        self.shell.refresh_views(force=True)

    def on_escape(self, focused: Widget | None) -> bool:
        if focused is None or focused.id != "gpu-filter":
            return False
        self.action_clear_filter()
        self.query_one("#gpus-table").focus()
        return True

    @on(Input.Submitted, "#gpu-filter")
    @on(Input.Changed, "#gpu-filter")
    def _filter_changed(self, event: Input.Changed | Input.Submitted) -> None:
        self.gpu_filter = GpuFilter(self.gpu_filter.busy, event.value)
        self.shell.refresh_views(force=True)
        if isinstance(event, Input.Submitted):
            self.query_one("#gpus-table").focus()


VIEW = GpusView
