"""The Job view's pools panel for a job made of worker pools: one row per pool (role, replicas,
hosts, state, what a failure of it does), the Reduction Server sizing line and the replicas that
failed while training went on (from ``PoolsView``, tui.model.poolview; the same as plain lines
for ``rigdeck status`` is ``tui.model.poolview.pool_lines``).
"""

from __future__ import annotations

from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual.markup import escape

from tui.app.widgets.difftable import Col, DiffTable
from tui.app.widgets.format import Palette, state_level
from tui.model.poolview import PoolsView

ON_FAILURE = {"stop": "stops the gang", "continue": "training continues"}


def pools_head_markup(view: PoolsView) -> str:
    """The panel's header: how many pools and replicas, then the sizing line and the replica
    failures that did not stop training, one a line."""
    replicas = sum(p.replicas for p in view.pools)
    lines = [f"[b]pools[/b] {len(view.pools)} pool{'' if len(view.pools) == 1 else 's'} · "
             f"{replicas} replica{'' if replicas == 1 else 's'}"]
    if view.sizing_text:
        ok = (view.sizing or {}).get("ok")
        lvl = "$success" if ok is True else ("$warning" if ok is False else "$text-muted")
        lines.append(f"[{lvl}]sizing: {escape(view.sizing_text)}[/]")
    for msg in view.failures:
        lines.append(f"[$warning]{escape(msg)}[/]")
    return "\n".join(lines)


def pool_rows(view: PoolsView) -> list[tuple[str, tuple[Any, ...]]]:
    return [(p.role, (p.role, p.replicas, ", ".join(p.hosts), (p.state_text, p.state),
                      ON_FAILURE.get(p.on_failure, p.on_failure)))
            for p in view.pools]


COLUMNS = (
    Col("role", "Pool", 17),
    Col("replicas", "Replicas", 8),
    Col("hosts", "Hosts"),
    Col("state", "State"),
    Col("on_failure", "On failure"),
)


class PoolsTable(DiffTable):
    """One row per pool: role, replicas, hosts, state (per replica when they differ), and what
    a failure of it does."""

    def columns_for(self, w: Any) -> list[Col]:
        return list(COLUMNS)

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        if column == "state":
            text, state = raw
            return Text(text, style=palette[state_level(state)])
        if column == "on_failure":
            return Text(str(raw), style=palette["muted"])
        return Text(str(raw))
