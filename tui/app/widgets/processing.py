"""The Job view's processing panel for a processing job (``kind = "processing"``): one row per
input (its distribution, how many files, each host's share, its source) under a header naming the
hosts and where each keeps the outputs (from ``ProcessingView``, tui.model.processingview; the
same as plain lines for ``rigdeck status`` is ``tui.model.processingview.processing_lines``).
"""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual.markup import escape

from tui.app.widgets.difftable import Col, DiffTable
from tui.app.widgets.format import Palette
from tui.model.processingview import ProcessingView, processing_summary
from tui.model.termsafe import terminal_safe


def processing_head_markup(view: ProcessingView) -> str:
    """The panel's header: hosts, inputs and outputs counted, then each output's place."""
    lines = [f"[b]processing[/b] {escape(processing_summary(view).removeprefix('processing '))}"]
    for name in view.outputs:
        lines.append(f"[$text-muted]output[/] {escape(terminal_safe(view.output_text(name)))}")
    return "\n".join(lines)


def processing_rows(view: ProcessingView) -> list[tuple[str, tuple[Any, ...]]]:
    rows = []
    for i in view.inputs:
        if i.distribution == "ShardedByKey":
            files = "-" if i.total is None else str(i.total)
            shares = ", ".join(f"{h} {n}" for h, n in i.per_host) or "split when it starts"
        else:
            files, shares = "all", "every host"
        rows.append((i.name, (terminal_safe(i.name), i.distribution, files, terminal_safe(shares),
                              terminal_safe(i.source))))
    return rows


COLUMNS = (
    Col("name", "Input", 14),
    Col("distribution", "Distribution", 15),
    Col("files", "Files", 6),
    Col("hosts", "Files per host"),
    Col("source", "Source"),
)


class ProcessingTable(DiffTable):
    """One row per processing input: name, distribution, files, each host's share, source."""

    def columns_for(self, w: Any) -> list[Col]:
        return list(COLUMNS)

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        if column == "source":
            return Text(str(raw), style=palette["muted"])
        return Text(str(raw))
