"""Modal dialogs: confirm a stop (a job, a sweep or one of its trials), trust a host key, and
the help screen."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.markup import escape
from textual.screen import ModalScreen
from textual.widgets import Button, Label, Static

from tui.app.widgets.format import SIM_MARK
from tui.model.hostviews import HostKey
from tui.model.jobview import StopPlan


class _ConfirmStopBase(ModalScreen[bool]):
    """A stop's confirmation: y stops, n or escape cancels, Cancel has the focus."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "confirm", "Stop the job", id="stop.confirm"),
        Binding("n,escape", "cancel", "Cancel", id="stop.cancel"),
    ]

    def on_mount(self) -> None:
        self.query_one("#stop-no", Button).focus()

    @on(Button.Pressed, "#stop-yes")
    def action_confirm(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#stop-no")
    def action_cancel(self) -> None:
        self.dismiss(False)


class ConfirmStop(_ConfirmStopBase):
    """What will be stopped (job, hosts, ranks); Stop or Cancel."""

    def __init__(self, plan: StopPlan, simulated: Iterable[str] = ()) -> None:
        """``simulated``: the hosts whose GPUs are simulated (the placement's), marked "sim"."""
        super().__init__()
        self.plan = plan
        self.simulated = frozenset(simulated)

    def compose(self) -> ComposeResult:
        p = self.plan
        hosts = "\n".join(
            f"  [b]{escape(h)}[/b]: ranks {', '.join(str(r) for r in ranks) or '-'}"
            + (f" on GPUs {', '.join(str(g) for g in gpus)}" if gpus else "")
            + (f"[$text-muted]{SIM_MARK}[/]" if gpus and h in self.simulated else "")
            for h, ranks, gpus in p.hosts
        )
        pools = "".join(
            f"\n  [b]{escape(role)}[/b]: {n} replica{'' if n == 1 else 's'} on {escape(', '.join(on))}"
            for role, n, on in p.pools
        )
        if pools:  # a job made of worker pools: every pool stops
            pools = f"\n\nIts {len(p.pools)} pool{'' if len(p.pools) == 1 else 's'} all stop:{pools}"
        with Vertical(id="dialog", classes="dialog -danger"):
            yield Label(f"Stop job [b]{escape(p.job_id)}[/b]?", id="stop-title")
            yield Static(
                f"State: {escape(p.state)}. {p.rank_count} rank(s) on {len(p.hosts)} host(s):\n"
                f"{hosts}{pools}\n\n"
                f"Each rank gets SIGTERM, then SIGKILL after {p.grace_s:g}s; "
                "every process tagged with the job id is swept.",
                id="stop-body",
            )
            with Horizontal(classes="buttons"):
                yield Button("Stop job (y)", variant="error", id="stop-yes")
                yield Button("Cancel (n)", id="stop-no")


class ConfirmSweepStop(_ConfirmStopBase):
    """Stop one trial of a sweep, or the whole sweep: what it stops; Stop or Cancel. The keys are
    the job stop dialog's (the same binding ids)."""

    def __init__(self, title: str, body: str, button: str) -> None:
        """``title`` and ``body``: markup (escaped by the caller); ``button``: "Stop trial"."""
        super().__init__()
        self.title_markup = title
        self.body_markup = body
        self.button = button

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog -danger"):
            yield Label(self.title_markup, id="stop-title")
            yield Static(self.body_markup, id="stop-body")
            with Horizontal(classes="buttons"):
                yield Button(f"{self.button} (y)", variant="error", id="stop-yes")
                yield Button("Cancel (n)", id="stop-no")


class TrustHostKey(ModalScreen[bool]):
    """A host presented a key known_hosts lacks: show it, and record it only on request."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "trust", "Trust the key", id="hostkey.trust"),
        Binding("n,escape", "cancel", "Cancel", id="hostkey.cancel"),
    ]

    def __init__(self, host: str, address: str, key: HostKey, known_hosts: str) -> None:
        super().__init__()
        self.host = host
        self.address = address
        self.key = key
        self.known_hosts = known_hosts

    @property
    def changed(self) -> bool:
        return self.key.changed

    def compose(self) -> ComposeResult:
        k = self.key
        with Vertical(id="dialog", classes="dialog" + (" -danger" if self.changed else "")):
            if self.changed:
                yield Label(
                    f"[b]Host key of {escape(self.host)} has CHANGED[/b]", id="hostkey-title"
                )
                yield Static(
                    f"{escape(self.address)} now presents\n"
                    f"  [b]{escape(k.fingerprint or '?')}[/b]\n"
                    f"but {escape(self.known_hosts)} records\n"
                    f"  {escape(k.expected or '?')}\n\n"
                    "This may be an attack, or a reinstalled host. rigdeck never replaces a "
                    "known key: "
                    "find out why it changed, then remove the old entry by hand.",
                    id="hostkey-body",
                )
                with Horizontal(classes="buttons"):
                    yield Button("Close (n)", id="hostkey-no")
                return
            yield Label(f"Unknown host key: [b]{escape(self.host)}[/b]", id="hostkey-title")
            yield Static(
                f"{escape(self.address)} presents a key that "
                f"{escape(self.known_hosts)} does not list:\n\n"
                f"  type         [b]{escape(k.type or '?')}[/b]\n"
                f"  fingerprint  [b]{escape(k.fingerprint or '?')}[/b]\n\n"
                "Compare it with the host's own (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub on the "
                "host, or your provisioning records) before you trust it. Trusting records it in "
                "known_hosts; nothing was sent to the host so far.",
                id="hostkey-body",
            )
            with Horizontal(classes="buttons"):
                yield Button("Trust and connect (y)", variant="warning", id="hostkey-yes")
                yield Button("Cancel (n)", id="hostkey-no")

    def on_mount(self) -> None:
        self.query_one("#hostkey-no", Button).focus()

    @on(Button.Pressed, "#hostkey-yes")
    def action_trust(self) -> None:
        if not self.changed:
            self.dismiss(True)

    @on(Button.Pressed, "#hostkey-no")
    def action_cancel(self) -> None:
        self.dismiss(False)


class HelpScreen(ModalScreen[None]):
    """Every key binding with its id (for keys.toml) and what it does."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "close", "Close", id="help.close"),
    ]

    def __init__(
        self,
        groups: Iterable[tuple[str, list[tuple[str, str, str]]]],
        keymap_file: str,
        problems: Iterable[str] = (),
    ) -> None:
        super().__init__()
        self.groups = list(groups)
        self.keymap_file = keymap_file
        self.problems = list(problems)

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="dialog -wide"):
            yield Label("[b]rigdeck keys[/b]")
            with VerticalScroll(id="help-body"):
                for title, rows in self.groups:
                    lines = [f"[b]{escape(title)}[/b]"]
                    for key, desc, binding_id in rows:
                        lines.append(
                            f"  [$accent]{escape(key):<14}[/] {escape(desc):<28} "
                            f"[$text-muted]{escape(binding_id)}[/]"
                        )
                    yield Static("\n".join(lines), classes="help-group")
                yield Static(
                    "Mouse: click tabs, rows and buttons; the wheel scrolls. Rare actions "
                    "(deploy to every host, reconnect all, trust a key, themes) are in the command "
                    "palette: ctrl+p.\n\n"
                    f"Rebind any key by its id in [b]{escape(self.keymap_file)}[/b], e.g.\n"
                    '  "job.launch" = "L"\n  [logs]\n  rank = "R"',
                    classes="help-group",
                )
                for p in self.problems:
                    yield Static(f"[$error]{escape(p)}[/]", classes="help-group")
            with Horizontal(classes="buttons"):
                yield Button("Close", id="help-close")

    @on(Button.Pressed, "#help-close")
    def action_close(self) -> None:
        self.dismiss(None)


def describe_error(e: BaseException) -> str:
    return str(e) or type(e).__name__


def field_of_message(message: str, fields: Iterable[str]) -> str | None:
    """The form field an error message names ("field 'nodes': ..."), if any."""
    for f in sorted(fields, key=len, reverse=True):
        if f"field '{f}'" in message or f'field "{f}"' in message:
            return f
    return None
