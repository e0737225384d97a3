"""Hosts (1): every host of the inventory, and the selected one in full."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.markup import escape
from textual.widgets import DataTable, Static

from tui.app.views.base import HOSTS, View, set_text
from tui.app.widgets.format import state_markup
from tui.app.widgets.tables import HostsTable, host_rows, host_why
from tui.model.health import OK, UNHEALTHY
from tui.model.views import GpuView, HostView


class HostsView(View):
    ID, KEY, TITLE = "hosts", "1", "Hosts"
    FOLLOWS = frozenset({HOSTS})
    TABLES = ("#hosts-table",)
    FOCUS = "#hosts-table"

    def compose(self) -> ComposeResult:
        yield HostsTable(id="hosts-table")
        yield Static("", id="host-detail", classes="detail")

    def update(self, now: float) -> None:
        self.query_one("#hosts-table", HostsTable).apply(host_rows(self.shell.hosts_snapshot, self.shell.widths))
        self._update_detail()

    def cursor_host(self) -> str | None:
        return self.query_one("#hosts-table", HostsTable).cursor_key

    def _update_detail(self) -> None:
        key = self.cursor_host()
        h = self.shell.host_entry(key) if key else None
        text = host_detail(h, self.shell.client.inventory, self._unwell_gpus(h)) if h else ""
        set_text(self.query_one("#host-detail", Static), text)

    def _unwell_gpus(self, h: HostView | None) -> list[GpuView]:
        """The host's GPUs whose health is not ok, read from the state (the hosts snapshot
        only counts them)."""
        if h is None:
            return []
        state = self.shell.client.state
        gpus = (state.gpu(h.name, pos) for pos in range(h.gpu_count))
        return [g for g in gpus if g is not None and g.health != OK]

    @on(DataTable.RowHighlighted, "#hosts-table")
    def _host_highlighted(self) -> None:
        self._update_detail()


def host_detail(h: HostView, inventory: Any, unwell: Sequence[GpuView] = ()) -> str:
    """The selected host in full: where it is, what runs there, why it is not up, and each of
    its ``unwell`` GPUs (health not ok) with the reason."""
    try:
        spec = inventory.get(h.name)
        where = "local" if spec.is_local else f"{spec.user}@{spec.address}:{spec.port}"
    except Exception:  # UnknownHostError: a recorded snapshot without inventory entry
        where = str(h.address or "")
    status = str(h.status or "connecting")
    lvl = state_markup(status)
    parts = [f"[b]{escape(h.name)}[/b] {escape(where)}", f"[{lvl}]{status}[/]"]
    if h.hostname:
        parts.append(escape(str(h.hostname)))
    if h.agent_version:
        parts.append(f"agent {escape(str(h.agent_version))} (pid {h.agent_pid})")
    s = h.host_sample
    if s is not None and s.cpu_per_core:
        parts.append(
            f"{len(s.cpu_per_core)} cores, load " + " ".join(f"{x:.1f}" for x in s.load)
        )
    count = h.gpu_count
    if count:
        sim = " simulated" if h.gpus_simulated else ""
        parts.append(f"{count}{sim} GPU(s): {escape(str(h.gpu_model or '?'))}")
    text = " · ".join(parts)
    why = host_why(h, unwell)
    if why:
        bad = status == "down" or h.error_kind or any(g.health == UNHEALTHY for g in unwell)
        text += f"\n[{'$error' if bad else '$warning'}]{escape(why)}[/]"
    return text


VIEW = HostsView
