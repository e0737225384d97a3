"""Hosts (1): every host of the inventory, and the selected one in full; with ``[slurm]`` in the
inventory, each host's Slurm node too (its state and why it is drained or down), read on the
login host through its agent on a worker thread every ``POLL_S`` seconds (docs/slurm.md)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from textual import on
from textual.app import ComposeResult
from textual.markup import escape
from textual.widgets import DataTable, Static

from tui.app.views.base import HOSTS, SlurmRead, View, set_text
from tui.app.widgets.format import state_markup
from tui.app.widgets.tables import HostsTable, SlurmNodes, host_rows, host_why, slurm_why
from tui.model.health import OK, UNHEALTHY
from tui.model.hostviews import GpuView, HostView
from tui.model.slurm import NODES_ARGS, SlurmNode, node_index, read_nodes


class HostsView(View):
    ID, KEY, TITLE = "hosts", "1", "Hosts"
    FOLLOWS = frozenset({HOSTS})
    TABLES = ("#hosts-table",)
    FOCUS = "#hosts-table"
    POLL_S = 10.0  # Slurm's nodes read again (inventories with [slurm] only)

    def __init__(self) -> None:
        super().__init__()
        self.slurm: SlurmNodes | None = None  # None: the inventory has no [slurm]
        self.reader = SlurmRead(read_nodes, "slurm nodes")

    @property
    def slurm_reads(self) -> int:
        """Reads of Slurm's nodes ended, answered or not (tests wait on it)."""
        return self.reader.reads

    def setup(self) -> None:
        if getattr(self.shell.client.inventory, "slurm", None) is not None:
            self.slurm = SlurmNodes()
            self.query_one("#hosts-table", HostsTable).slurm = True
            self.poll()

    def poll(self) -> None:
        """Slurm's nodes, read again on a worker thread (never on the UI's)."""
        if self.slurm is not None:
            self.reader.start(self)

    def worker_done(self, result: Any, error: str | None = None) -> None:
        nodes, error = self.reader.ended(result, error)
        if nodes is not None:
            self.slurm = SlurmNodes(node_index(nodes))
        else:  # the last answer stays, said to be old
            last = self.slurm.find if self.slurm is not None else None
            self.slurm = SlurmNodes(last, error or "Slurm's nodes: the read failed")
        self.redraw()

    def compose(self) -> ComposeResult:
        yield HostsTable(id="hosts-table")
        yield Static("", id="host-detail", classes="detail")

    def update(self, now: float) -> None:
        self.query_one("#hosts-table", HostsTable).apply(
            host_rows(self.shell.hosts_snapshot, self.shell.widths, self.slurm))
        self._update_detail()

    def cursor_host(self) -> str | None:
        return self.query_one("#hosts-table", HostsTable).cursor_key

    def _update_detail(self) -> None:
        key = self.cursor_host()
        h = self.shell.host_entry(key) if key else None
        text = host_detail(h, self.shell.client.inventory, self._unwell_gpus(h), self.slurm) if h else ""
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


def host_detail(h: HostView, inventory: Any, unwell: Sequence[GpuView] = (), slurm: SlurmNodes | None = None) -> str:
    """The selected host in full: where it is, what runs there, why it is not up, each of its
    ``unwell`` GPUs (health not ok) with the reason, and its Slurm node: with ``slurm`` (the
    inventory's [slurm]) its state, why it is drained or down, and what kept Slurm from being
    read; without, what the host's agent read of its node when Slurm keeps jobs off it."""
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
    why = host_why(h, unwell, slurm=slurm is None)
    if why:
        bad = status == "down" or h.error_kind or any(g.health == UNHEALTHY for g in unwell)
        text += f"\n[{'$error' if bad else '$warning'}]{escape(why)}[/]"
    if slurm is not None:
        text += "\n" + slurm_detail(slurm, slurm.node(h))
    return text


def slurm_detail(slurm: SlurmNodes, node: SlurmNode | None) -> str:
    """The host's line about Slurm (one paragraph): its node and state, why Slurm keeps it from
    jobs, and what went wrong with the last read."""
    if slurm.find is None and not slurm.error:
        line = f"[$text-muted]Slurm: reading ({' '.join(NODES_ARGS)} on the login host)[/]"
    elif slurm.find is None:
        line = "[$text-muted]Slurm: not read[/]"
    elif node is None:
        line = "[$text-muted]Slurm: no node of this host (by name, hostname or address)[/]"
    else:
        word, lvl = slurm.cell(node)
        look = {"crit": "$error", "warn": "$warning"}.get(lvl, "$success")
        cpus = f" · CPUs {node.cpus_alloc}/{node.cpus}" if node.cpus is not None and node.cpus_alloc is not None else ""
        parts = ", ".join(node.partitions)
        full = "+".join((node.state, *(f.lower() for f in node.flags)))  # Slurm's own words
        line = f"Slurm node [b]{escape(node.name)}[/b] [{look}]{escape(word)}[/] ({escape(full)})"
        if slurm_why(node):  # why, who and when: what the line has room for (the detail has three)
            who = " ".join(p for p in (f"by {node.reason_user}" if node.reason_user else "",
                                       f"at {node.reason_time}" if node.reason_time else "") if p)
            line += f": [{look}]{escape(node.reason or 'no reason given')}[/]" + (f" ({escape(who)})" if who else "")
        else:
            line += (f" · partition {escape(parts)}" if parts else "") + cpus
    if slurm.error:  # on the same line: the detail has four lines and the host takes two
        old = " (the last answer shown)" if slurm.find is not None else ""
        line += f": [$error]{escape(slurm.error[:300])}{old}[/]"
    return line


VIEW = HostsView
