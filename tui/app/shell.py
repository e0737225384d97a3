"""The Textual app: the face of rigdeck. It draws from the controller's state and acts only
through controller methods.

Data flow: the Monitor's reader threads fold telemetry into ``ClusterState``; ``JobWatch`` polls
jobs on its own thread. The app never waits on the network: a timer samples both snapshots at
``sample_hz`` and applies them to the visible view by diff inside one ``batch_update``, and
every action (launch, stop, deploy, trust a key) runs on a thread worker whose outcome is handled
in one place (``_worker_done``).

Each view is one module under ``tui/app/views/``; ``VIEWS`` below lists them, and the tabs, the
view keys, the help screen's groups and the refresh are derived from that list. What is left
here is the app's own: the summary line, sampling, keys, the palette, dialogs and the actions
on hosts and jobs that work from any view.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.markup import escape
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Header, Static, TabbedContent
from textual.worker import Worker, WorkerState

from tui.app import cycles, stripcycle
from tui.app.collector import COLLECT_S, CollectorTuning
from tui.app.frametimer import ENV as FRAME_TIMER_ENV
from tui.app.frametimer import LOG_ENV as FRAME_LOG_ENV
from tui.app.frametimer import FrameTimer, default_screen
from tui.app.keys import keymap_path, load_keymap
from tui.app.notices import JobNotices, toast
from tui.app.screens.dialogs import ConfirmStop, HelpScreen, TrustHostKey, describe_error
from tui.app.screens.launch import LaunchScreen
from tui.app.screens.onboarding import OnboardingScreen, passphrase_prompt
from tui.app.summary import summarize, summary_markup  # noqa: F401 (tests/test_contracts imports summarize here)
from tui.app.terminal import HangupWatch, input_fd
from tui.app.textualpatch import Need, usable
from tui.app.views import load_views
from tui.app.views.base import HOSTS, JOBS, OPEN_JOB, View, ViewState, set_text
from tui.app.views.job import placement_markup  # noqa: F401 (tests/test_contracts imports it from here)
from tui.app.widgets.keybar import KeyBar
from tui.app.widgets.tables import Widths
from tui.client import Client, HostReport, Onboarding, set_passphrase_prompt
from tui.model.hostviews import HostKey, HostView
from tui.model.jobstate import TERMINAL
from tui.model.jobview import JobSource, JobsSnapshot

log = logging.getLogger(__name__)

# The views, in tab order: each a module of tui/app/views/ (a new view: its module, one line here).
VIEWS = load_views(
    "hosts",
    "gpus",
    "jobs",
    "job",
    "checkpoints",
    "logs",
    "sweeps",
    "map",
    "pipelines",
    "doctor",
    "usage",
)
TABS = tuple(v.ID for v in VIEWS)
EXIT_HANGUP = 128 + signal.SIGHUP  # the shell's status for a process ended by a hangup
V = TypeVar("V", bound=View)
# Textual's signs that a screen is going (MessagePump's and Widget's: nothing public says it
# before the screen stops). One that is gone reads as False: ``closing`` then sees only exit().
_SCREEN_GOING = ("_closing", "_closed", "_pruning")
SEES_CLOSING = "seeing the screen go at shutdown (RigdeckApp.closing)"


class RigdeckApp(App[None]):
    """rigdeck: hosts, GPUs and jobs of a bare-metal cluster."""

    TITLE = "rigdeck"
    CSS_PATH = "app.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        *(Binding(v.KEY, f"show_tab('{v.ID}')", v.TITLE, id=f"view.{v.ID}", show=False) for v in VIEWS),
        Binding("l", "launch", "Launch", id="job.launch"),
        Binding("s", "stop_job", "Stop", id="job.stop"),
        Binding("d", "deploy", "Deploy", id="host.deploy"),
        Binding("t", "trust", "Trust key", id="host.trust"),
        Binding("c", "reconnect", "Reconnect", id="host.reconnect"),
        Binding("question_mark", "help", "Help", id="app.help"),
        Binding("q", "quit", "Quit", id="app.quit"),
    ]

    # State a view owns, read as the app's own by tests and scripts (one line each, by view).
    gpu_filter = ViewState[Any]("gpus")
    gpu_sort = ViewState[str]("gpus")
    sweep_id = ViewState[Any]("sweeps", "item_id")
    sweep_list = ViewState[Any]("sweeps", "item_list")
    sweep_detail = ViewState[Any]("sweeps", "item_detail")
    sweeps_error = ViewState[Any]("sweeps", "fetch_error")
    sweeps_fetches = ViewState[int]("sweeps", "fetch_count")
    pipeline_id = ViewState[Any]("pipelines", "item_id")
    pipeline_list = ViewState[Any]("pipelines", "item_list")
    pipeline_detail = ViewState[Any]("pipelines", "item_detail")
    pipelines_error = ViewState[Any]("pipelines", "fetch_error")
    pipelines_fetches = ViewState[int]("pipelines", "fetch_count")
    _pipelines_inflight = ViewState[bool]("pipelines", "inflight")
    doctor_report = ViewState[Any]("doctor")
    doctor_error = ViewState[Any]("doctor")
    doctor_runs = ViewState[int]("doctor")
    doctor_running = ViewState[bool]("doctor")

    def __init__(
        self,
        client: Client,
        *,
        sample_hz: float = 2.0,
        clock: Callable[[], float] = time.time,
        keymap_file: Path | None = None,
        spec_path: str = "",
        onboarding: Onboarding | None = None,
    ):
        """``onboarding``: hosts to offer first (no inventory yet; screens/onboarding.py)."""
        super().__init__()
        self.client = client
        self.onboarding = onboarding
        self.jobwatch: JobSource = client.jobs
        self.sample_hz = sample_hz
        self.clock = clock
        self.keymap_file = keymap_file or keymap_path()
        self.keymap_problems: list[str] = []
        self.applied_keymap: dict[str, str] = {}  # binding id -> keys, as keys.toml set them
        self.spec_path = spec_path
        self.widths = Widths.for_width(120)
        self.job_id: str | None = None
        self.hosts_snapshot: Sequence[HostView] = []
        self.jobs_snapshot = JobsSnapshot((), -1)
        self._state_seen = self._jobs_seen = self._second = -1
        self.dirty: set[str] = set(TABS)  # views to redraw when next shown
        # The open job's detail has yet to be seen: a job source may get it after the selection
        # (a server's, on its poller), and the views that drew without it are drawn again then.
        self._detail_pending = False
        self._warned_keys: set[str] = set()
        self.collector = CollectorTuning()
        self.frame_timer = FrameTimer()  # the UI thread's stretches: sampling steps, frames
        self.show_frames = os.environ.get(FRAME_TIMER_ENV) == "1"  # in the summary line
        self.samples = 0
        self._hangup: HangupWatch | None = None
        self.notices = JobNotices()  # job state changes -> a toast and the bell ([notify])
        self.views: dict[str, View] = {v.ID: v() for v in VIEWS}

    # -- layout -----------------------------------------------------------------------------

    def get_default_screen(self) -> Screen[Any]:
        return default_screen()

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("connecting…", id="summary")
        with TabbedContent(initial=TABS[0], id="tabs"):
            yield from self.views.values()
        yield KeyBar()

    @property
    def tabs(self) -> TabbedContent:
        return self.query_one("#tabs", TabbedContent)

    @property
    def active_view(self) -> View | None:
        return self.views.get(self.tabs.active)

    def view(self, cls: type[V]) -> V:
        """The app's view of class ``cls`` (one view reaching another: pipelines -> sweeps)."""
        found = self.views[cls.ID]
        assert isinstance(found, cls)
        return found

    def _following(self, what: str) -> set[str]:
        return {v.ID for v in VIEWS if what in v.FOLLOWS}

    def on_mount(self) -> None:
        inv = self.client.inventory
        self.sub_title = str(inv.path) if inv.path else "this machine (no inventory)"
        for v in self.views.values():
            v.setup()
        self._apply_keymap()
        self._set_widths(self.size.width)
        set_passphrase_prompt(passphrase_prompt(self))  # an encrypted key's passphrase: asked here
        if self.onboarding is not None:
            self.push_screen(OnboardingScreen(self.onboarding), self._onboarded)
        else:
            self._start_client()
        self.refresh_views(force=True)
        self.set_interval(1.0 / self.sample_hz, self.refresh_views, name="sample")
        for v in self.views.values():
            if v.POLL_S:
                self.set_interval(v.POLL_S, v.poll, name=v.ID)
        stripcycle.install()  # lines drawn are freed when dropped, not by the collector
        cycles.install()  # so are layouts and replaced component styles
        usable(SEES_CLOSING, [Need(self.default_screen, name) for name in _SCREEN_GOING])
        self.collector.start()
        self.set_interval(COLLECT_S, self.collector.between_frames, name="collector")
        if self.show_frames:
            self.frame_timer.watch_collector()
        if os.environ.get(FRAME_LOG_ENV):
            self.frame_timer.log_to(os.environ[FRAME_LOG_ENV], self._where)
            self.frame_timer.watch_collector()
        self.query_one(VIEWS[0].FOCUS).focus()
        self._watch_for_hangup()

    def _where(self) -> str:
        """The view on screen, for the frame log: its tab and, in the GPU view, sort and filter."""
        tab = self.tabs.active
        return f"{tab} sort={self.gpu_sort} filter={self.gpu_filter}" if tab == "gpus" else tab

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """While the onboarding screen shows, the app's own keys (launch, stop, deploy, views)
        are off (and out of the footer): there is no cluster yet. Quit and help stay."""
        if isinstance(self.screen, OnboardingScreen):
            return action in ("quit", "help", "command_palette")
        return True

    def _start_client(self) -> None:
        self.client.start()
        self.client.on_code_progress(
            lambda job_id, host, done, total: self.call_from_thread(self._code_progress, host, done, total))

    def _onboarded(self, written: Path | None) -> None:
        """Onboarding ended: go on with the inventory it wrote, or (skipped) as we were."""
        from tui.client import connect, load_inventory

        try:
            new = connect(load_inventory(written)) if written is not None else None
        except Exception as e:  # checked when written; a file edited since: say so, go on
            self.notify(escape(describe_error(e)), title="inventory", severity="error")
            new = None
        if new is not None:
            old, self.client = self.client, new
            self.jobwatch = self.client.jobs
            self._state_seen = self._jobs_seen = -1
            self.sub_title = str(written)
            old.close()
            self.notify(f"inventory written: {escape(str(written))}", title="onboarding")
        self._start_client()
        self.refresh_views(force=True)

    def _watch_for_hangup(self) -> None:
        """Leave when the terminal goes away (SIGHUP, or the tty seen hung up: the app may
        never get the signal, see tui/terminal.py). Not for a headless app (tests)."""
        if not self.is_headless:
            self._hangup = HangupWatch(input_fd(), self._terminal_gone).start()

    def _terminal_gone(self, reason: str) -> None:
        """On the hangup watch's thread. Textual cannot shut down on a dead terminal (its
        writer thread dies on the first EIO and its next write blocks for good), and there
        is nothing left to restore: let go of the hosts and of the jobs this app supervises,
        then end the process. Jobs run on their hosts and go on."""
        try:
            self.client.close()
        except Exception:
            log.warning("leaving after %s: cleanup failed", reason, exc_info=True)
        logging.shutdown()
        os._exit(EXIT_HANGUP)

    def on_unmount(self) -> None:
        if self._hangup is not None:
            self._hangup.stop()
        self.client.close()
        self.collector.stop()
        self.frame_timer.stop()

    def on_resize(self) -> None:
        if self._set_widths(self.size.width):
            self.refresh_views(force=True)

    def _set_widths(self, width: int) -> bool:
        w = Widths.for_width(width)
        changed = w != self.widths
        self.widths = w
        for v in self.views.values():
            if v.set_widths(w):
                changed = True
        if changed:
            self.dirty = set(TABS)
        return changed

    # -- keys -------------------------------------------------------------------------------

    def binding_groups(self) -> list[tuple[str, list[tuple[str, str, str]]]]:
        from tui.app.screens.launch import LaunchScreen as _L

        def rows(bindings: Sequence[BindingType]) -> list[tuple[str, str, str]]:
            out = []
            for b in bindings:
                if isinstance(b, Binding) and b.id:
                    key = self.applied_keymap.get(b.id, b.key)
                    out.append((self._key_label(key), b.description or b.action, b.id))
            return out

        return [
            ("Everywhere", rows(self.BINDINGS)),
            *((v.HELP_GROUP, rows(v.help_bindings())) for v in VIEWS if v.HELP_GROUP),
            ("Launch dialog", rows(_L.BINDINGS)),
            ("Stop dialogs (job, trial, sweep, pipeline)", rows(ConfirmStop.BINDINGS)),
            ("Host key dialog", rows(TrustHostKey.BINDINGS)),
        ]

    @staticmethod
    def _key_label(keys: str) -> str:
        names = {"question_mark": "?", "slash": "/", "escape": "esc"}
        return ", ".join(names.get(k, k) for k in keys.split(","))

    def all_binding_ids(self) -> set[str]:
        return {i for _, rows in self.binding_groups() for *_, i in rows} | {"help.close"}

    def _apply_keymap(self) -> None:
        keymap, problems = load_keymap(self.keymap_file, self.all_binding_ids())
        self.keymap_problems = problems
        if keymap:
            self.set_keymap(keymap)
        self.applied_keymap = keymap  # Textual keeps it, but only in a private attribute
        for p in problems:
            self.notify(p, title="keys.toml", severity="warning", timeout=10)

    def get_system_commands(self, screen: Screen[Any]) -> Any:
        yield from super().get_system_commands(screen)
        yield SystemCommand("Deploy the agent to every host", "Install or upgrade the agent everywhere",
                            lambda: self.action_deploy(all_hosts=True))
        yield SystemCommand("Reconnect every host", "Drop every telemetry connection and connect again",
                            self.action_reconnect_all)
        yield SystemCommand("Launch a job…", "Pick a spec file or fill the form", self.action_launch)
        for v in self.views.values():
            yield from v.commands()
        for h in self.hosts_snapshot:
            if h.error_kind == "unknown-host-key":
                yield SystemCommand(f"Trust the host key of {h.name}", "Check the fingerprint, then record it",
                                    lambda name=h.name: self.action_trust(name))
            yield SystemCommand(f"Deploy the agent to {h.name}", "Install or upgrade it there",
                                lambda name=h.name: self.action_deploy(name))
        yield SystemCommand("Show key bindings", f"Rebind in {self.keymap_file}", self.action_help)

    # -- sampling ---------------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """Shutting down: a timer may fire, or a worker end, once more while the widgets go."""
        if self.return_code is not None:  # App.exit was called (or the app failed)
            return True
        screen = self.default_screen
        return any(getattr(screen, name, False) for name in _SCREEN_GOING)

    def refresh_views(self, force: bool = False) -> None:
        """Sample the controller's state and apply what changed to the visible panels (timed
        by the frame timer)."""
        if self.closing:
            return
        self.frame_timer.timed(lambda: self._refresh_views(force), "refresh")

    def _refresh_views(self, force: bool) -> None:
        self.samples += 1
        now = self.clock()
        second = int(now)
        state = self.client.state
        version = state.version
        jobs = self.jobwatch.snapshot()
        if force:
            self.dirty = set(TABS)
        if version != self._state_seen:
            # Hosts only: the GPU view reads the GPUs it shows from the state itself, so this
            # thread never holds (and so never has to free) a whole second of GPU samples.
            self.hosts_snapshot = state.snapshot(gpus=False)
            self._state_seen = version
            self.dirty |= self._following(HOSTS)
            self._notice_host_keys()
            self.collector.cluster(sum(h.gpu_count for h in self.hosts_snapshot))
        self.collector.tick()
        if jobs.version != self._jobs_seen or second != self._second:
            if jobs.version != self._jobs_seen:
                toast(self, self.notices.feed(jobs, now))
            self.jobs_snapshot = jobs
            self._jobs_seen = jobs.version
            self._second = second
            self.dirty |= self._following(JOBS)
            if self.job_id is None and jobs.rows:
                live = [r for r in jobs.rows if r.state not in TERMINAL]
                if live:
                    self.select_job(live[0].job_id)
        if self._detail_pending and (self.job_id is None or self.jobwatch.detail(self.job_id) is not None):
            self._detail_pending = False
            self.dirty |= self._following(OPEN_JOB)
        view = self.active_view
        with self.batch_update():
            self._update_summary()
            if view is None:
                return
            if view.ID in self.dirty:
                self.dirty.discard(view.ID)
                view.update(now)
            view.sample()

    def _update_summary(self) -> None:
        client = self.client
        text = summary_markup(self.hosts_snapshot, self.jobs_snapshot, self.sample_hz, client.telemetry_hz,
                              client.link(), self.clock, self.frame_timer.text() if self.show_frames else "")
        set_text(self.query_one("#summary", Static), text)

    def _notice_host_keys(self) -> None:
        for h in self.hosts_snapshot:
            if h.error_kind != "unknown-host-key":  # nearly every host: nothing to make
                continue
            key = h.host_key or HostKey()
            if key.fingerprint not in self._warned_keys:
                self._warned_keys.add(key.fingerprint or "")
                self.notify(
                    f"{h.name} presents an unknown host key ({key.type} "
                    f"{key.fingerprint}). Select it in Hosts and press t to check and "
                    "trust it.",
                    title="unknown host key",
                    severity="warning",
                    timeout=15,
                )

    # -- navigation -------------------------------------------------------------------------

    def action_show_tab(self, tab: str) -> None:
        self.tabs.active = tab

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        view = self.views.get(event.pane.id or "")
        self.refresh_views()
        if view is not None and view.FOCUS:
            self.query_one(view.FOCUS).focus()
        if view is not None:
            view.shown()

    def select_job(self, job_id: str | None) -> None:
        if job_id != self.job_id:
            self.job_id = job_id
            self.jobwatch.select(job_id)
            self.dirty |= self._following(OPEN_JOB)
            self._detail_pending = job_id is not None

    def on_key(self, event: Any) -> None:
        """Escape in a view's box (the GPU filter, the log search): the view closes it."""
        view = self.active_view
        focused: Widget | None = self.focused
        if event.key == "escape" and view is not None and view.on_escape(focused):
            event.stop()

    # -- the current host and job -----------------------------------------------------------

    def current_host(self) -> str | None:
        names = [h.name for h in self.hosts_snapshot] or list(self.client.inventory.names)
        view = self.active_view
        key = (view.cursor_host() if view is not None else None) or self.views[TABS[0]].cursor_host()
        if key:
            return key
        return names[0] if names else None

    def current_job(self) -> str | None:
        view = self.active_view
        return (view.cursor_job() if view is not None else None) or self.job_id

    def host_entry(self, name: str) -> HostView | None:
        return next((h for h in self.hosts_snapshot if h.name == name), None)

    # -- actions ----------------------------------------------------------------------------


    def dialog(self, screen: Screen[Any], then: Callable[[Any], None] | None = None) -> None:
        """Open a dialog; when it closes, the view it was opened from is showing again (focus
        coming back from it must not land on a table in another tab, which would switch to
        that tab), and then ``then`` gets its result."""
        tab = self.tabs.active

        def closed(result: Any) -> None:
            if self.tabs.active != tab:
                self.tabs.active = tab
            if then is not None:
                then(result)

        self.push_screen(screen, closed)

    def action_launch(self) -> None:
        def done(job_id: str | None) -> None:
            if job_id:
                self.select_job(job_id)
                self.notify(f"launched {job_id}", title="job")
                self.tabs.active = "job"
                self.refresh_views(force=True)

        self.dialog(
            LaunchScreen(
                self.jobwatch.launch,
                hosts=self.jobwatch.inventory_hosts(),
                spec_path=self.spec_path,
            ),
            done,
        )

    def _code_progress(self, host: str, done: int, total: int) -> None:
        """[code] sync while a launch waits for it: each host's part, in the launch dialog."""
        screen = self.screen
        if isinstance(screen, LaunchScreen):
            screen.code_progress(host, done, total)

    def action_stop_job(self) -> None:
        job_id = self.current_job()
        if job_id is None:
            self.notify("no job selected: pick one in Jobs (3)", severity="warning")
            return
        row = self.jobs_snapshot.row(job_id)
        if row is not None and row.state in TERMINAL:
            self.notify(f"{job_id} has already ended ({row.state})", severity="warning")
            return
        try:
            plan = self.jobwatch.stop_plan(job_id)
        except Exception as e:  # JobError: not in the history
            self.notify(describe_error(e), severity="error")
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.notify(f"stopping {job_id}…", title="job")
                self._stop_job(job_id)

        simulated = {n["host"] for n in (row.placement if row else ())
                     if n.get("simulated") and isinstance(n.get("host"), str)}
        self.dialog(ConfirmStop(plan, simulated), confirmed)

    def act(self, name: str, fn: Callable[[], str]) -> None:
        """Run an action of a view on a thread worker; its outcome is told in ``_worker_done``."""
        self.run_worker(fn, thread=True, group="action", name=name, exit_on_error=False)

    @work(thread=True, group="action", name="stop", exit_on_error=False)
    def _stop_job(self, job_id: str) -> str:
        state = self.jobwatch.stop_job(job_id)
        return f"{job_id}: {state}"

    def action_deploy(self, host: str | None = None, all_hosts: bool = False) -> None:
        names = None if all_hosts else [host or self.current_host()]
        if names == [None]:
            return
        what = "every host" if names is None else names[0]
        self.notify(f"deploying the agent to {what}…", title="deploy")
        self._deploy(names)

    @work(thread=True, group="action", name="deploy", exit_on_error=False)
    def _deploy(self, names: list[str] | None) -> str:
        reports: list[HostReport] = self.client.deploy(names)
        lines = []
        for r in reports:
            if r.error:
                lines.append(f"{r.name}: {r.error}")
            else:
                lines.append(
                    f"{r.name}: agent {r.agent_version} "
                    + ("copied" if r.copied else "already current")
                )
                self.client.reconnect(r.name)
        return "\n".join(lines)

    def action_reconnect(self) -> None:
        host = self.current_host()
        if host:
            self.client.reconnect(host)
            self.notify(f"reconnecting {host}", title="hosts")

    def action_reconnect_all(self) -> None:
        for name in self.client.inventory.names:
            self.client.reconnect(name)
        self.notify("reconnecting every host", title="hosts")

    def action_trust(self, host: str | None = None) -> None:
        host = host or self.current_host()
        entry = self.host_entry(host) if host else None
        if entry is None or entry.host_key is None:
            self.notify(f"{host}: no host key waits for a decision", severity="warning")
            return
        name = entry.name
        spec = self.client.inventory.get(name)
        known = str(self.client.inventory.known_hosts)
        key = entry.host_key

        def decided(yes: bool | None) -> None:
            if yes and key.fingerprint:
                self._trust(name, key.fingerprint)

        self.dialog(TrustHostKey(name, f"{spec.address}:{spec.port}", key, known), decided)

    @work(thread=True, group="action", name="trust", exit_on_error=False)
    def _trust(self, host: str, fingerprint: str) -> str:
        name = self.client.trust_host_key(host, fingerprint)
        self.client.reconnect(host)
        return f"{host}: recorded {fingerprint} for {name}; connecting"

    def action_help(self) -> None:
        self.dialog(HelpScreen(self.binding_groups(), str(self.keymap_file), self.keymap_problems))

    @on(Worker.StateChanged)
    def _worker_done(self, event: Worker.StateChanged) -> None:
        """Every action's outcome, success or error, is reported here and nowhere else."""
        w = event.worker
        if self.closing:
            return
        view = self.views.get(w.group or "")
        if view is not None:  # a view's own worker (a fetch, a doctor run)
            if event.state == WorkerState.SUCCESS:
                view.worker_done(w.result)
            elif event.state in (WorkerState.ERROR, WorkerState.CANCELLED):
                view.worker_done(None, f"{w.group}: {describe_error(w.error or Exception('cancelled'))}")
            return
        if w.group != "action":
            return
        if event.state == WorkerState.SUCCESS and w.result:
            self.notify(escape(str(w.result)), title=w.name)
            self.refresh_views(force=True)
            for v in self.views.values():
                v.acted()
        elif event.state == WorkerState.ERROR:
            self.notify(
                escape(describe_error(w.error or Exception("failed"))),
                title=f"{w.name} failed",
                severity="error",
                timeout=12,
            )
