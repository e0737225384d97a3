"""The Textual app. It draws from the controller's reports and acts only through its methods."""

from __future__ import annotations

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Footer, Header, Static
from textual.worker import Worker, WorkerState

from tui.controller import Controller, HostReport

HOST_COLUMNS = (
    ("host", "Host"),
    ("state", "State"),
    ("address", "Address"),
    ("hostname", "Hostname"),
    ("agent", "Agent"),
    ("python", "Python"),
    ("cpus", "CPUs"),
    ("mem", "Memory"),
    ("gpus", "GPUs"),
)


def host_row(r: HostReport) -> dict[str, str]:
    if r.reachable and not r.error:
        state = "up"
    elif r.reachable:
        state = "error"
    else:
        state = "down"
    gpus = "-"
    if r.gpus:
        sim = " (simulated)" if any(g.get("simulated") for g in r.gpus) else ""
        gpus = f"{len(r.gpus)}{sim}"
    elif r.gpu_source == "none":
        gpus = "none"
    return {
        "host": r.name,
        "state": state,
        "address": "local" if r.transport == "local" else f"{r.address}:{r.port}",
        "hostname": r.hostname or "-",
        "agent": r.agent_version or "-",
        "python": r.python or "-",
        "cpus": str(r.cpus) if r.cpus else "-",
        "mem": f"{r.memory_total_mb / 1024:.1f} GiB" if r.memory_total_mb else "-",
        "gpus": gpus,
    }


class RigdeckApp(App[None]):
    """rigdeck: hosts, GPUs and jobs of a bare-metal cluster."""

    TITLE = "rigdeck"
    CSS = """
    #summary { height: 1; padding: 0 1; color: $text-muted; }
    #hosts { height: 1fr; }
    #errors { height: auto; max-height: 8; padding: 0 1; color: $error; }
    """
    BINDINGS = [
        Binding("r", "refresh_hosts", "Refresh", id="refresh"),
        Binding("d", "deploy", "Deploy agent", id="deploy"),
        Binding("q", "quit", "Quit", id="quit"),
    ]

    def __init__(self, controller: Controller):
        super().__init__()
        self.controller = controller
        self.reports: dict[str, HostReport] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        with Vertical():
            yield Static("connecting…", id="summary")
            yield DataTable(id="hosts", cursor_type="row", zebra_stripes=True)
            yield Static("", id="errors")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#hosts", DataTable)
        for key, label in HOST_COLUMNS:
            table.add_column(label, key=key)
        inv = self.controller.inventory
        self.sub_title = str(inv.path) if inv.path else "this machine (no inventory)"
        for spec in inv.hosts:
            table.add_row(spec.name, "connecting", *["…"] * (len(HOST_COLUMNS) - 2), key=spec.name)
        self.action_deploy()

    def action_refresh_hosts(self) -> None:
        self._talk_to_hosts(deploy=False)

    def action_deploy(self) -> None:
        self._talk_to_hosts(deploy=True)

    @work(thread=True, exclusive=True, group="hosts")
    def _talk_to_hosts(self, deploy: bool) -> list[HostReport]:
        # Blocking network calls stay on this worker thread; the UI gets the result when done.
        return self.controller.deploy() if deploy else self.controller.probe()

    @on(Worker.StateChanged)
    def _worker_done(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "hosts":
            return
        if event.state == WorkerState.SUCCESS and event.worker.result is not None:
            self.show_reports(event.worker.result)
        elif event.state == WorkerState.ERROR:
            self.query_one("#errors", Static).update(f"error: {event.worker.error}")

    def show_reports(self, reports: list[HostReport]) -> None:
        table = self.query_one("#hosts", DataTable)
        with self.batch_update():
            for r in reports:
                self.reports[r.name] = r
                row = host_row(r)
                for key, _ in HOST_COLUMNS:
                    table.update_cell(r.name, key, row[key])
        up = sum(1 for r in self.reports.values() if r.reachable and not r.error)
        gpus = sum(len(r.gpus) for r in self.reports.values())
        self.query_one("#summary", Static).update(
            f"hosts {up}/{len(self.reports)} up · GPUs {gpus} · agent {self.controller.bundle.version}"
        )
        errors = [r.error for r in self.reports.values() if r.error]
        self.query_one("#errors", Static).update("\n".join(e for e in errors if e))

    def on_unmount(self) -> None:
        self.controller.close()
