"""The Job view's stage panel for a pipeline-parallel job: its plan's header and one row per stage
(from ``StagesView``, tui.model.stages), styled. The cells' text, and the same as plain lines for
``rigdeck status``, come from ``tui.model.stagetext``.
"""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual.markup import escape

from tui.app.widgets.difftable import Col, DiffTable
from tui.app.widgets.format import Palette
from tui.model.stages import StagesView
from tui.model.stagetext import (  # noqa: F401  (the panel's cells and the status lines: re-exported)
    STAGE_COLUMNS,
    head_parts,
    secs,
    stage_lines,
    stage_raw,
    stage_rows,
)


def stages_head_markup(view: StagesView) -> str:
    first, second = head_parts(view)
    return f"[b]pipeline[/b] {escape(first)}\n[$text-muted]{escape(second)}[/]"


COLUMNS = tuple(Col(key, label, width) for key, label, width in STAGE_COLUMNS)


class StagesTable(DiffTable):
    """One row per stage: blocks, expected vs measured busy time, step time, bubble, memory."""

    def columns_for(self, w: Any) -> list[Col]:
        return list(COLUMNS)

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        if column == "busy":
            text, slow = raw
            return Text(text, style=palette["warn"] if slow else "")
        if column == "bubble":
            text, high = raw
            return Text(text, style=palette["warn"] if high else "")
        if column in ("exp_busy", "exp_mem"):
            return Text(str(raw), style=palette["muted"])
        return Text(str(raw))
