"""Launch a job: pick a spec file, or fill the form (or both: the form overrides the file).

The spec is checked here (``jobspec_from_toml``) and placed and started by the controller on a
thread worker. A JobSpecError is shown under the field it names; a PlacementError (no room)
under the placement fields; anything else under the buttons.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Static
from textual.worker import Worker, WorkerState

from tui.app.screens.dialogs import describe_error, field_of_message
from tui.model.jobspec import LAUNCHERS, JobSpec, JobSpecError
from tui.model.scheduler import PlacementError
from tui.model.specform import FORM_FIELDS, field_id, form_values, read_spec_data, spec_from_form

PLACEMENT_FIELDS = ("nodes", "hosts", "gpus_per_node", "processes_per_node")


class LaunchScreen(ModalScreen[str | None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+s", "launch", "Launch", id="launch.go", priority=True),
        Binding("escape", "cancel", "Cancel", id="launch.cancel"),
    ]

    def __init__(
        self, launch: Callable[[JobSpec], str], *, hosts: Sequence[str] = (), spec_path: str = ""
    ) -> None:
        super().__init__()
        self._launch = launch
        self.hosts = list(hosts)
        self.initial_path = spec_path
        self.base: dict[str, Any] = {}
        self.path: Path | None = None
        self.busy = False
        self._code: dict[str, str] = {}  # [code] sync: host -> how far
        self._status_head = ""

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog -wide"):
            yield Label("[b]Launch a job[/b]  [$text-muted]a spec file, the form, or both[/]")
            with Horizontal(classes="form-row"):
                yield Label("Spec file", classes="form-label")
                yield Input(
                    self.initial_path,
                    placeholder="path/to/job.toml (enter loads it)",
                    id="spec-path",
                    compact=True,
                )
                yield Button("Load", id="spec-load", compact=True)
            yield Static("", id="err-spec", classes="field-error")
            with VerticalScroll(id="form"):
                for name, label in FORM_FIELDS:
                    fid = field_id(name)
                    with Horizontal(classes="form-row"):
                        yield Label(label, classes="form-label")
                        if name == "launcher":
                            yield Select(
                                [(x, x) for x in LAUNCHERS],
                                prompt="direct (default)",
                                id=fid,
                                compact=True,
                            )
                        else:
                            yield Input(
                                placeholder=_placeholder(name, self.hosts), id=fid, compact=True
                            )
                    yield Static("", id=f"err-{fid}", classes="field-error")
            yield Static("", id="launch-status")
            with Horizontal(classes="buttons"):
                yield Button("Launch (ctrl+s)", variant="primary", id="launch-go")
                yield Button("Cancel (esc)", id="launch-cancel")

    def on_mount(self) -> None:
        self.query_one("#spec-path", Input).focus()
        if self.initial_path:
            self.load_file(self.initial_path)

    # -- the form ---------------------------------------------------------------------------

    def values(self) -> dict[str, str]:
        out = {}
        for name, _ in FORM_FIELDS:
            w = self.query_one(f"#{field_id(name)}")
            if isinstance(w, Select):
                out[name] = "" if w.value is Select.NULL else str(w.value)
            else:
                assert isinstance(w, Input)
                out[name] = w.value
        return out

    def fill(self, values: dict[str, str]) -> None:
        for name, _ in FORM_FIELDS:
            w = self.query_one(f"#{field_id(name)}")
            v = values.get(name, "")
            if isinstance(w, Select):
                w.value = v if v in LAUNCHERS else Select.NULL
            else:
                assert isinstance(w, Input)
                w.value = v

    def clear_errors(self) -> None:
        for w in self.query(".field-error").results(Static):
            w.update("")
            w.remove_class("-shown")
        self.query_one("#launch-status", Static).update("")
        for invalid in self.query(".-invalid"):
            invalid.remove_class("-invalid")

    def show_error(self, name: str | None, message: str) -> None:
        """Under the field ``name`` (a spec field), or under the file path when None."""
        target = f"#err-{field_id(name)}" if name in dict(FORM_FIELDS) else "#err-spec"
        err = self.query_one(target, Static)
        err.update(f"[$error]{escape(message)}[/]")
        err.add_class("-shown")
        if name in dict(FORM_FIELDS):
            w = self.query_one(f"#{field_id(name)}")
            w.add_class("-invalid")
            self.query_one("#form", VerticalScroll).scroll_to_widget(err, animate=False)
        else:
            self.query_one("#spec-path").add_class("-invalid")

    def load_file(self, text: str) -> None:
        self.clear_errors()
        path = Path(text).expanduser()
        try:
            data = read_spec_data(path)
        except JobSpecError as e:
            self.show_error(None, str(e))
            return
        self.base, self.path = data, path.resolve()
        self.fill(form_values(data))
        self.query_one("#launch-status", Static).update(
            f"[$text-muted]loaded {escape(str(self.path))}[/]"
        )

    @on(Input.Submitted, "#spec-path")
    @on(Button.Pressed, "#spec-load")
    def _load_pressed(self) -> None:
        self.load_file(self.query_one("#spec-path", Input).value)

    @on(Input.Submitted, ".form-row Input")
    def _submitted(self, event: Input.Submitted) -> None:
        if event.input.id != "spec-path":
            self.action_launch()

    # -- launching --------------------------------------------------------------------------

    @on(Button.Pressed, "#launch-go")
    def action_launch(self) -> None:
        if self.busy:
            return
        self.clear_errors()
        path_text = self.query_one("#spec-path", Input).value.strip()
        if path_text and (self.path is None or Path(path_text).expanduser().resolve() != self.path):
            self.load_file(path_text)  # typed a path but did not load it
            if self.path is None:
                return
        try:
            spec = spec_from_form(self.base, self.values(), self.path)
        except JobSpecError as e:
            self.show_error(e.field, str(e))
            return
        self.busy = True
        self.query_one("#launch-go", Button).disabled = True
        self._code = {}
        self._status_head = (
            f"placing and starting [b]{escape(spec.name)}[/b] "
            f"({spec.node_count} node(s) × {spec.slots_per_node})…"
        )
        self.query_one("#launch-status", Static).update(self._status_head)
        self.run_worker(
            lambda: self._launch(spec), thread=True, group="launch", exit_on_error=False
        )

    def code_progress(self, host: str, done: int, total: int) -> None:
        """[code] sync: how far each host is, under the launch's status line."""
        from tui.app.widgets.format import size_bytes

        self._code[host] = "has it" if total == 0 else f"{size_bytes(done)} of {size_bytes(total)}"
        self.query_one("#launch-status", Static).update(
            self._status_head + "\ncode → " + ", ".join(f"{escape(h)} {v}" for h, v in sorted(self._code.items())))

    @on(Worker.StateChanged)
    def _worker(self, event: Worker.StateChanged) -> None:
        if event.worker.group != "launch" or event.state not in (
            WorkerState.SUCCESS,
            WorkerState.ERROR,
        ):
            return
        self.busy = False
        self.query_one("#launch-go", Button).disabled = False
        if event.state == WorkerState.SUCCESS:
            self.dismiss(str(event.worker.result))
            return
        e = event.worker.error
        assert e is not None
        message = describe_error(e)
        if isinstance(e, JobSpecError):
            self.show_error(e.field, message)
        elif isinstance(e, PlacementError):
            self.show_error("nodes", message)
        else:
            named = field_of_message(message, dict(FORM_FIELDS))
            if named:
                self.show_error(named, message)
            else:
                self.query_one("#launch-status", Static).update(f"[$error]{escape(message)}[/]")

    @on(Button.Pressed, "#launch-cancel")
    def action_cancel(self) -> None:
        if not self.busy:
            self.dismiss(None)


def _placeholder(name: str, hosts: Sequence[str]) -> str:
    return {
        "name": "ddp (letters, digits . _ -)",
        "command": "{python} train.py --steps 300",
        "workdir": ". (relative to the spec file)",
        "nodes": "how many hosts",
        "hosts": ", ".join(hosts[:4]) + (" …" if len(hosts) > 4 else "") if hosts else "h1, h2",
        "gpus_per_node": "ranks per host = GPUs",
        "processes_per_node": "ranks per host without GPUs",
        "total_steps": "for an ETA",
        "max_runtime": "24h",
        "checkpoint.dir": "/shared/ckpt/ddp",
        "checkpoint.owner": "rank0 | per-node | all | host:NAME/gpu:I",
    }.get(name, "")
