"""Onboarding: with no inventory yet, the app offers the ``Host`` entries of the ssh config.

The user picks hosts (space toggles, ``a`` all), checks them (enter): each is reached in the
background through the controller API (``Onboarding.check``: host key, login, Python). An
unknown host key opens the host key dialog, and only a key the user accepts is recorded; a
passphrase-protected key is asked for in a password dialog, once. Each row shows its result
(ok, unreachable and why, key refused...). ``w`` writes the hosts that checked ok to the
inventory file and the app goes on with it; ``escape`` skips (the app goes on with this
machine alone, as without onboarding).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.markup import escape
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, DataTable, Input, Label, Static
from textual.worker import Worker, WorkerState

from tui.app.screens.dialogs import TrustHostKey, describe_error
from tui.app.widgets.keybar import KeyBar
from tui.client import HostReport, Onboarding
from tui.model.hostviews import HostKey

# What a row shows, by state.
PENDING, CHECKING = "not checked", "checking…"


def result_text(report: HostReport | None, refused: bool = False) -> str:
    """One row's result: ok (what answered), or what went wrong, in a few words."""
    if refused:
        return "key refused: not recorded, not checked"
    if report is None:
        return PENDING
    if not report.error:
        gpus = f", {len(report.gpus)} GPU(s)" if report.gpus else ""
        return f"ok: {report.hostname or '?'}, Python {report.python}{gpus}"
    kind = report.error_kind or "error"
    if kind == "unknown-host-key" and report.host_key:
        return f"unknown host key {report.host_key.get('fingerprint')}: trust it or not in the dialog"
    detail = report.error.split(": ", 1)[-1]  # the host's name is in the row already
    label = {
        "unreachable": "unreachable", "auth": "login refused", "passphrase": "no passphrase",
        "unknown-host-key": "unknown host key", "host-key-changed": "HOST KEY CHANGED",
        "python": "no usable Python", "timeout": "timed out",
    }.get(kind, "failed")
    return f"{label}: {detail}"


class PassphraseDialog(ModalScreen["str | None"]):
    """A key's passphrase, typed into a password field (never shown, never stored)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel", id="passphrase.cancel"),
    ]

    def __init__(self, key_file: str) -> None:
        super().__init__()
        self.key_file = key_file

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog"):
            yield Label(f"Passphrase for [b]{escape(self.key_file)}[/b]", id="passphrase-title")
            yield Static("The key is encrypted. Its passphrase is kept in memory while rigdeck "
                         "runs, never written to disk. (Or cancel, and add the key to ssh-agent.)")
            yield Input(password=True, id="passphrase-input", placeholder="passphrase")
            with Horizontal(classes="buttons"):
                yield Button("Unlock (enter)", variant="primary", id="passphrase-ok")
                yield Button("Cancel (esc)", id="passphrase-no")

    def on_mount(self) -> None:
        self.query_one("#passphrase-input", Input).focus()

    @on(Input.Submitted, "#passphrase-input")
    @on(Button.Pressed, "#passphrase-ok")
    def action_unlock(self) -> None:
        box = self.query_one("#passphrase-input", Input)
        value, box.value = box.value, ""
        self.dismiss(value or None)

    @on(Button.Pressed, "#passphrase-no")
    def action_cancel(self) -> None:
        self.dismiss(None)


def passphrase_prompt(app: App[Any]) -> Callable[[str], str | None]:
    """The app's answer to ``set_passphrase_prompt``: called on a connecting thread, it opens
    the passphrase dialog on the app's thread and waits for the user."""

    def ask(key_file: str) -> str | None:
        if threading.current_thread() is threading.main_thread() or not app.is_running:
            return None  # never block the app's own thread
        box: list[str | None] = []
        done = threading.Event()

        def answered(value: str | None) -> None:
            box.append(value)
            done.set()

        def show() -> None:
            app.push_screen(PassphraseDialog(key_file), answered)

        app.call_from_thread(show)
        while not done.wait(0.5):
            if not app.is_running:
                return None
        return box[0] if box else None

    return ask


class OnboardingScreen(Screen["Path | None"]):
    """Pick, check and write the first inventory. Dismissed with the file written, or None."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("space", "toggle_host", "Select", id="onboard.toggle"),
        Binding("a", "toggle_all", "All", id="onboard.all"),
        Binding("enter", "check", "Check selected", id="onboard.check", priority=True),
        Binding("w", "write", "Write inventory", id="onboard.write"),
        Binding("escape", "skip", "Skip", id="onboard.skip"),
    ]
    DEFAULT_CSS = """
    OnboardingScreen { padding: 1 2; }
    OnboardingScreen #onboard-title { margin-bottom: 1; }
    OnboardingScreen #onboard-table { height: 1fr; }
    OnboardingScreen #onboard-status { height: auto; margin-top: 1; }
    """

    def __init__(self, onboarding: Onboarding) -> None:
        super().__init__()
        self.ob = onboarding
        self.names = [c.name for c in onboarding.candidates]
        self.selected: set[str] = set()
        self.reports: dict[str, HostReport] = {}
        self.refused: set[str] = set()
        self.checking: set[str] = set()
        self.accepted: dict[str, list[str]] = {}
        self.written: Path | None = None

    def compose(self) -> ComposeResult:
        source = self.ob.ssh_config or "the ssh config"
        yield Static(f"[b]No inventory yet.[/b] Hosts of [b]{escape(str(source))}[/b]: pick the "
                    f"ones rigdeck should manage; they are written to "
                    f"[b]{escape(str(self.ob.target))}[/b].", id="onboard-title")
        yield Static("[$text-muted]space selects · a selects all · enter checks the selected hosts (host key, "
                     "login, Python) · w writes those that checked ok · esc skips (this machine "
                     "only)[/]", id="onboard-help")
        for why in self.ob.skipped:
            yield Static(f"[$warning]left out: {escape(why)}[/]", classes="onboard-skipped")
        table: DataTable[Any] = DataTable(id="onboard-table", cursor_type="row", zebra_stripes=True)
        yield table
        yield Static("", id="onboard-status")
        yield KeyBar()

    def on_mount(self) -> None:
        table = self.query_one("#onboard-table", DataTable)
        for key, width in (("sel", 3), ("host", 18), ("where", 34), ("result", None)):
            table.add_column(key if key != "sel" else "", key=key, width=width)
        for c in self.ob.candidates:
            table.add_row(*self._cells(c.name), key=c.name)
        table.focus()
        self._status()

    # -- rows ---------------------------------------------------------------------------------

    def result(self, name: str) -> str:
        if name in self.checking:
            return CHECKING
        return result_text(self.reports.get(name), name in self.refused)

    def _cells(self, name: str) -> tuple[Any, ...]:
        res = self.result(name)
        style = "green" if res.startswith("ok") else ("yellow" if res == CHECKING else
                                                      ("dim" if res == PENDING else "red"))
        # Text, not str: a str cell is markup, and "[x]" would be read as a tag.
        return (Text("[x]" if name in self.selected else "[ ]"), Text(name),
                Text(self.ob.candidate(name).where), Text(res, style=style))

    def _redraw(self, name: str) -> None:
        table = self.query_one("#onboard-table", DataTable)
        for col, value in zip(("sel", "host", "where", "result"), self._cells(name), strict=True):
            table.update_cell(name, col, value, update_width=col == "result")
        self._status()

    def ok_names(self) -> list[str]:
        """Selected hosts whose last check passed, in the ssh config's order."""
        return [n for n in self.names if n in self.selected and n not in self.checking
                and (r := self.reports.get(n)) is not None and not r.error]

    def _status(self) -> None:
        ok = self.ok_names()
        text = (f"{len(self.selected)} selected, {len(ok)} checked ok"
                + (f": w writes {', '.join(ok)}" if ok else ""))
        self.query_one("#onboard-status", Static).update(escape(text))

    def _cursor_name(self) -> str | None:
        table = self.query_one("#onboard-table", DataTable)
        if not self.names:
            return None
        return self.names[min(table.cursor_row, len(self.names) - 1)]

    # -- actions ------------------------------------------------------------------------------

    def action_toggle_host(self) -> None:
        name = self._cursor_name()
        if name is None:
            return
        self.selected ^= {name}
        self._redraw(name)

    def action_toggle_all(self) -> None:
        self.selected = set() if self.selected == set(self.names) else set(self.names)
        for n in self.names:
            self._redraw(n)

    def action_check(self) -> None:
        if not self.selected:
            self.notify("select hosts first (space)", severity="warning")
            return
        for name in self.names:
            if name in self.selected and name not in self.checking:
                self.refused.discard(name)
                self._check(name)

    def _check(self, name: str) -> None:
        self.checking.add(name)
        self._redraw(name)
        self._run_check(name, tuple(self.accepted.get(name, ())))

    @work(thread=True, group="onboard", exit_on_error=False)
    def _run_check(self, name: str, accepted: tuple[str, ...]) -> tuple[str, HostReport]:
        return name, self.ob.check(name, accept_fingerprints=accepted)

    @on(Worker.StateChanged)
    def _checked(self, event: Worker.StateChanged) -> None:
        w = event.worker
        if w.group != "onboard" or event.state not in (WorkerState.SUCCESS, WorkerState.ERROR):
            return
        if event.state == WorkerState.ERROR:  # a bug, not a host's answer: say so, keep going
            self.notify(escape(describe_error(w.error or Exception("failed"))), severity="error")
            for n in list(self.checking):
                self.checking.discard(n)
                self._redraw(n)
            return
        result = w.result
        assert result is not None
        name, report = result
        self.checking.discard(name)
        self.reports[name] = report
        self._redraw(name)
        key = report.host_key
        if report.error_kind in ("unknown-host-key", "host-key-changed") and key:
            self._ask_trust(name, report, key)

    def _ask_trust(self, name: str, report: HostReport, key: dict[str, str]) -> None:
        """The host key dialog for a key the check ran into; a yes checks again with it."""
        hk = HostKey(fingerprint=key.get("fingerprint"), type=key.get("type"),
                     expected=key.get("expected"), name=key.get("name"))
        where = f"{report.address}:{report.port}"

        def decided(yes: bool | None) -> None:
            if yes and hk.fingerprint and not hk.changed:
                self.accepted.setdefault(name, []).append(hk.fingerprint)
                self._check(name)
            elif not hk.changed:
                self.refused.add(name)
                self._redraw(name)

        self.app.push_screen(TrustHostKey(name, where, hk, str(self.ob.known_hosts)), decided)

    def action_write(self) -> None:
        names = self.ok_names()
        if not names:
            self.notify("no selected host has checked ok yet (enter checks)", severity="warning")
            return
        try:
            self.written = self.ob.write(names)
        except Exception as e:  # InventoryError, OSError: say why; nothing was written
            self.notify(escape(describe_error(e)), title="not written", severity="error",
                        timeout=12)
            return
        self.dismiss(self.written)

    def action_skip(self) -> None:
        self.dismiss(None)
