"""The Textual app: the face of rigdeck. It draws from the controller's state and acts only
through controller methods.

Data flow: the Monitor's reader threads fold telemetry into ``ClusterState``; ``JobWatch`` polls
jobs on its own thread. The app never waits on the network: a timer samples both snapshots at
``sample_hz`` and applies them to the visible panels by diff inside one ``batch_update``, and
every action (launch, stop, deploy, trust a key) runs on a thread worker whose outcome is handled
in one place (``_worker_done``).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.markup import escape
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Input, Static, TabbedContent, TabPane
from textual.worker import Worker, WorkerState

from tui.app.keys import keymap_path, load_keymap
from tui.app.notices import JobNotices, toast
from tui.app.screens.dialogs import (
    ConfirmStop,
    ConfirmSweepStop,
    HelpScreen,
    TrustHostKey,
    describe_error,
)
from tui.app.screens.launch import LaunchScreen
from tui.app.screens.onboarding import OnboardingScreen, passphrase_prompt
from tui.app.terminal import HangupWatch, input_fd
from tui.app.widgets.chart import LINE_VARS, LossChart
from tui.app.widgets.clustermap import ClusterMap, MapPane
from tui.app.widgets.doctor import (
    NO_REPORT,
    DoctorRun,
    FindingsTable,
    finding_detail,
    finding_rows,
    keyed_findings,
    matrix_markup,
    p2p_matrix,
    run_doctor,
    skipped_markup,
    summary_markup,
)
from tui.app.widgets.format import (
    SIM_MARK,
    duration,
    loss_text,
    placement_parts,
    size_bytes,
    step_rate_text,
)
from tui.app.widgets.logview import LogView
from tui.app.widgets.pipelines import (
    NO_PIPELINES,
    PipelineFetch,
    PipelinesTable,
    StepsTable,
    can_retry_step,
    can_stop_pipeline,
    fetch_pipelines,
    pipeline_head,
    pipeline_rows,
    step_detail,
    step_rows,
    stop_pipeline_text,
)
from tui.app.widgets.pools import PoolsTable, pool_rows, pools_head_markup
from tui.app.widgets.processing import ProcessingTable, processing_head_markup, processing_rows
from tui.app.widgets.stages import StagesTable, stage_rows, stages_head_markup
from tui.app.widgets.sweeps import (
    NO_SWEEPS,
    SweepFetch,
    SweepsTable,
    TrialsTable,
    can_stop_sweep,
    can_stop_trial,
    curve_trials,
    fetch_sweeps,
    stop_sweep_text,
    stop_trial_text,
    sweep_head,
    sweep_rows,
    trial_line,
    trial_rows,
)
from tui.app.widgets.tables import (
    BUSY_FILTERS,
    SORT_LABELS,
    SORTS,
    GpuFilter,
    GpusTable,
    HostsTable,
    JobsTable,
    RanksTable,
    SavesTable,
    Widths,
    host_rows,
    host_why,
    job_rows,
    jobs_running,
    rank_rows,
)
from tui.client import Client, HostReport, Onboarding, describe_cause, set_passphrase_prompt
from tui.model.doctor import DoctorReport
from tui.model.jobstate import TERMINAL
from tui.model.jobview import JobDetail, JobSource, JobsSnapshot
from tui.model.pipelineview import PipelineDetail, PipelineRow, StepRow
from tui.model.sweepview import SweepDetail, SweepRow, TrialRow
from tui.model.termsafe import terminal_safe
from tui.model.views import HostKey, HostView

log = logging.getLogger(__name__)

TABS = ("hosts", "gpus", "jobs", "job", "checkpoints", "logs", "sweeps", "map", "pipelines", "doctor")
EXIT_HANGUP = 128 + signal.SIGHUP  # the shell's status for a process ended by a hangup
JOB_TABS = ("job", "checkpoints", "logs")


def set_text(widget: Static, text: str) -> None:
    """Update a Static only when its text changes: an update costs a layout pass."""
    if getattr(widget, "_rd_text", None) != text:
        widget.update(text)
        widget._rd_text = text  # type: ignore[attr-defined]


def summarize(snapshot: Sequence[HostView]) -> dict[str, int]:
    """Counts for the summary line (``simulated``: how many of the GPUs are)."""
    status = [h.status for h in snapshot]
    gpus = sum(h.gpu_count for h in snapshot)
    busy = sum(h.gpus_busy for h in snapshot)
    return {
        "hosts": len(snapshot),
        "up": status.count("up"),
        "stale": status.count("stale"),
        "down": status.count("down"),
        "connecting": status.count("connecting"),
        "gpus": gpus,
        "busy": busy,
        "free": gpus - busy,
        "simulated": sum(h.gpu_count for h in snapshot if h.gpus_simulated),
    }


def placement_markup(placement: Sequence[Mapping[str, Any]]) -> str:
    """The job head's placement, each node whose GPUs are simulated marked as the tables mark
    them (``placement_parts``; markup, since the head is one Static of markup lines)."""
    parts = [escape(label) + (f"[$text-muted]{SIM_MARK}[/]" if sim else "")
             for label, sim in placement_parts(placement)]
    return " ".join(parts) or "-"


class GpusPane(Vertical):
    """The GPU table with its filter and sort keys (active while the table has focus)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter", id="gpus.filter"),
        Binding("b", "busy", "Busy/idle", id="gpus.busy"),
        Binding("o", "sort", "Sort", id="gpus.sort"),
        Binding("escape", "clear_filter", "Clear filter", id="gpus.clear", show=False),
    ]

    def action_filter(self) -> None:
        box = self.query_one("#gpu-filter", Input)
        box.display = True
        box.focus()

    def action_busy(self) -> None:
        app = self.app
        assert isinstance(app, RigdeckApp)
        i = BUSY_FILTERS.index(app.gpu_filter.busy)
        app.gpu_filter = GpuFilter(BUSY_FILTERS[(i + 1) % len(BUSY_FILTERS)], app.gpu_filter.text)
        app.refresh_views(force=True)

    def action_sort(self) -> None:
        app = self.app
        assert isinstance(app, RigdeckApp)
        app.gpu_sort = SORTS[(SORTS.index(app.gpu_sort) + 1) % len(SORTS)]
        app.refresh_views(force=True)

    def action_clear_filter(self) -> None:
        app = self.app
        assert isinstance(app, RigdeckApp)
        app.gpu_filter = GpuFilter()
        box = self.query_one("#gpu-filter", Input)
        box.value = ""
        box.display = False
        app.refresh_views(force=True)


class SweepsPane(Vertical):
    """The Sweeps view: sweeps, the selected one's trials, its charts; its stop keys (active
    while a table of it has focus)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "stop_trial", "Stop trial", id="sweeps.stop_trial"),
        Binding("S", "stop_sweep", "Stop sweep", id="sweeps.stop"),
    ]

    def action_stop_trial(self) -> None:
        app = self.app
        assert isinstance(app, RigdeckApp)
        app.stop_trial()

    def action_stop_sweep(self) -> None:
        app = self.app
        assert isinstance(app, RigdeckApp)
        app.stop_sweep()


class PipelinesPane(Vertical):
    """The Pipelines view: pipelines, the selected one's steps as a tree; its stop and retry
    keys (active while a table of it has focus)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("S", "stop_pipeline", "Stop pipeline", id="pipelines.stop"),
        Binding("r", "retry_step", "Retry step", id="pipelines.retry"),
    ]

    def action_stop_pipeline(self) -> None:
        app = self.app
        assert isinstance(app, RigdeckApp)
        app.stop_pipeline()

    def action_retry_step(self) -> None:
        app = self.app
        assert isinstance(app, RigdeckApp)
        app.retry_step()


class DoctorPane(Vertical):
    """The Doctor view: the last report's findings, its p2p matrix; its run key (active while
    its table has focus)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("D", "run_doctor", "Run doctor", id="doctor.run"),
    ]

    def action_run_doctor(self) -> None:
        app = self.app
        assert isinstance(app, RigdeckApp)
        app.run_doctor()


class RigdeckApp(App[None]):
    """rigdeck: hosts, GPUs and jobs of a bare-metal cluster."""

    TITLE = "rigdeck"
    CSS_PATH = "app.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("1", "show_tab('hosts')", "Hosts", id="view.hosts", show=False),
        Binding("2", "show_tab('gpus')", "GPUs", id="view.gpus", show=False),
        Binding("3", "show_tab('jobs')", "Jobs", id="view.jobs", show=False),
        Binding("4", "show_tab('job')", "Job", id="view.job", show=False),
        Binding("5", "show_tab('checkpoints')", "Checkpoints", id="view.checkpoints", show=False),
        Binding("6", "show_tab('logs')", "Logs", id="view.logs", show=False),
        Binding("7", "show_tab('sweeps')", "Sweeps", id="view.sweeps", show=False),
        Binding("8", "show_tab('map')", "Map", id="view.map", show=False),
        Binding("9", "show_tab('pipelines')", "Pipelines", id="view.pipelines", show=False),
        Binding("0", "show_tab('doctor')", "Doctor", id="view.doctor", show=False),
        Binding("l", "launch", "Launch", id="job.launch"),
        Binding("s", "stop_job", "Stop", id="job.stop"),
        Binding("d", "deploy", "Deploy", id="host.deploy"),
        Binding("t", "trust", "Trust key", id="host.trust"),
        Binding("c", "reconnect", "Reconnect", id="host.reconnect"),
        Binding("question_mark", "help", "Help", id="app.help"),
        Binding("q", "quit", "Quit", id="app.quit"),
    ]

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
        self.spec_path = spec_path
        self.widths = Widths.for_width(120)
        self.gpu_filter = GpuFilter()
        self.gpu_sort = "host"
        self.job_id: str | None = None
        self.hosts_snapshot: Sequence[HostView] = []
        self.jobs_snapshot = JobsSnapshot((), -1)
        self._state_seen = -1
        self._jobs_seen = -1
        self._second = -1
        self._dirty: set[str] = set(TABS)
        self._warned_keys: set[str] = set()
        self._frozen_for_gpus = 0
        self._freeze_at = float("inf")
        self._gc_thresholds = gc.get_threshold()
        self.samples = 0
        self._hangup: HangupWatch | None = None
        # The Sweeps view: fetched on a worker thread about once a second while it shows.
        self.sweep_id: str | None = None
        self.sweep_list: tuple[SweepRow, ...] = ()
        self.sweep_detail: SweepDetail | None = None
        self.sweeps_error: str | None = None
        self.sweeps_fetches = 0  # fetches done (tests wait on it)
        self._sweeps_inflight = False
        self._sweeps_again = False
        # The Pipelines view: fetched the same way, while it shows.
        self.pipeline_id: str | None = None
        self.pipeline_list: tuple[PipelineRow, ...] = ()
        self.pipeline_detail: PipelineDetail | None = None
        self.pipelines_error: str | None = None
        self.pipelines_fetches = 0  # fetches done (tests wait on it)
        self._pipelines_inflight = False
        self._pipelines_again = False
        self._sweep_wanted: str | None = None  # a sweep step's sweep, to put the cursor on
        # The Doctor view: the last report stays until a new one arrives; a run is one worker.
        self.doctor_report: DoctorReport | None = None
        self.doctor_error: str | None = None
        self.doctor_runs = 0  # runs ended, with a report or an error (tests wait on it)
        self._doctor_since: float | None = None  # time.monotonic() when the run under way began
        self.notices = JobNotices()  # job state changes -> a toast and the bell ([notify])

    # -- layout -----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("connecting…", id="summary")
        with TabbedContent(initial="hosts", id="tabs"):
            with TabPane("Hosts 1", id="hosts"):
                yield HostsTable(id="hosts-table")
                yield Static("", id="host-detail", classes="detail")
            with TabPane("GPUs 2", id="gpus"):
                with GpusPane(id="gpus-pane"):
                    yield Static("", id="gpus-status", classes="status")
                    yield Input(
                        placeholder="filter: host, job id, busy, idle, host:NAME, job:ID "
                        "(enter applies, esc clears)",
                        id="gpu-filter",
                        compact=True,
                    )
                    yield GpusTable(id="gpus-table")
            with TabPane("Jobs 3", id="jobs"):
                yield Static("", id="jobs-status", classes="status")
                yield JobsTable(id="jobs-table")
            with TabPane("Job 4", id="job"):
                yield Static(
                    "no job open: launch one (l), or pick one in Jobs (3) and press enter",
                    id="job-head",
                    classes="head",
                )
                # Live bottleneck signals (stragglers, input-bound, ...): shown only when any.
                signals = Static("", id="job-signals", classes="head")
                signals.display = False
                yield signals
                with Vertical(id="job-body"):
                    yield LossChart(id="loss")
                    # A [model_parallel] job's plan and stages: shown only when it has a plan.
                    stages_head = Static("", id="stages-head", classes="head")
                    stages_head.display = False
                    yield stages_head
                    stages = StagesTable(id="stages-table")
                    stages.display = False
                    yield stages
                    # A job made of worker pools: its pools; shown only when it has them.
                    pools_head = Static("", id="pools-head", classes="head")
                    pools_head.display = False
                    yield pools_head
                    pools = PoolsTable(id="pools-table")
                    pools.display = False
                    yield pools
                    # A processing job: its inputs and where its outputs are.
                    processing_head = Static("", id="processing-head", classes="head")
                    processing_head.display = False
                    yield processing_head
                    processing = ProcessingTable(id="processing-table")
                    processing.display = False
                    yield processing
                    yield RanksTable(id="ranks-table")
            with TabPane("Checkpoints 5", id="checkpoints"):
                yield Static("no job open", id="ckpt-head", classes="head")
                yield SavesTable(id="saves-table")
            with TabPane("Logs 6", id="logs"):
                yield Static("", id="logs-status", classes="status")
                yield Input(
                    placeholder="search the logs (enter finds, esc closes)",
                    id="log-search",
                    compact=True,
                )
                yield LogView(id="log-view")
            with TabPane("Sweeps 7", id="sweeps"):
                with SweepsPane(id="sweeps-pane"):
                    yield Static("loading sweeps…", id="sweeps-status", classes="status")
                    yield SweepsTable(id="sweeps-table")
                    yield Static("", id="sweep-head", classes="head")
                    yield TrialsTable(id="trials-table")
                    with Horizontal(id="sweep-charts"):
                        yield LossChart(id="sweep-best")
                        yield LossChart(id="sweep-curves")
            with TabPane("Map 8", id="map"):
                yield MapPane(id="map-pane")
            with TabPane("Pipelines 9", id="pipelines"):
                with PipelinesPane(id="pipelines-pane"):
                    yield Static("loading pipelines…", id="pipelines-status", classes="status")
                    yield PipelinesTable(id="pipelines-table")
                    yield Static("", id="pipeline-head", classes="head")
                    yield StepsTable(id="steps-table")
                    yield Static("", id="step-detail", classes="detail")
            with TabPane("Doctor 0", id="doctor"):
                with DoctorPane(id="doctor-pane"):
                    yield Static(NO_REPORT, id="doctor-status", classes="status")
                    yield FindingsTable(id="doctor-table")
                    yield Static("", id="doctor-detail", classes="detail")
                    yield Static("", id="doctor-matrix")
        yield Footer(compact=True)

    @property
    def tabs(self) -> TabbedContent:
        return self.query_one("#tabs", TabbedContent)

    def on_mount(self) -> None:
        inv = self.client.inventory
        self.sub_title = str(inv.path) if inv.path else "this machine (no inventory)"
        self.query_one("#gpu-filter", Input).display = False
        self.query_one("#log-search", Input).display = False
        self.query_one("#loss", LossChart).border_title = "loss by step"
        self.query_one("#ranks-table").border_title = "ranks"
        self.query_one("#stages-table").border_title = "stages: expected vs measured, per step"
        self.query_one("#pools-table").border_title = "pools"
        self.query_one("#processing-table").border_title = "processing inputs"
        self.query_one("#sweep-best", LossChart).border_title = "best so far, by trial"
        self.query_one("#sweep-curves", LossChart).border_title = "objective by step"
        self.query_one("#trials-table").border_title = "trials, best first"
        self.query_one("#steps-table").border_title = "steps, in dependency order"
        self.query_one("#doctor-table").border_title = "findings by check, bad first"
        self.query_one("#doctor-matrix").border_title = "p2p bandwidth, host x host"
        self.query_one("#doctor-matrix").display = False
        self._apply_keymap()
        self._set_widths(self.size.width)
        set_passphrase_prompt(passphrase_prompt(self))  # an encrypted key's passphrase: asked here
        if self.onboarding is not None:
            self.push_screen(OnboardingScreen(self.onboarding), self._onboarded)
        else:
            self._start_client()
        self.refresh_views(force=True)
        self.set_interval(1.0 / self.sample_hz, self.refresh_views, name="sample")
        self.set_interval(1.0, self.poll_sweeps, name="sweeps")
        self.set_interval(1.0, self.poll_pipelines, name="pipelines")
        self.set_interval(0.5, self._doctor_tick, name="doctor")
        # Everything built so far lives as long as the app: keep it out of the collector's way,
        # so a full collection while thousands of GPU rows change costs what changed, not all.
        # Samples churn (every GPU, every second), and most of a second's objects die within
        # about a second: collecting young objects every 50,000 allocations rather than 700 lets
        # them die by reference count first, instead of being walked (and promoted, and walked
        # again) while still alive. Old ones are collected far less often (a full pass is the
        # stall a user would see). bench/ui.py: at 512 x 8 GPUs the collector's time per second
        # fell from ~20 ms (10,000) to ~4 ms.
        self._gc_thresholds = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        self.query_one("#hosts-table").focus()
        self._watch_for_hangup()

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
        # The process may go on (tests, an embedding program): leave the collector as it was.
        gc.unfreeze()
        gc.set_threshold(*self._gc_thresholds)

    def on_resize(self) -> None:
        if self._set_widths(self.size.width):
            self.refresh_views(force=True)

    def _set_widths(self, width: int) -> bool:
        w = Widths.for_width(width)
        changed = w != self.widths
        self.widths = w
        for sel, cls in (
            ("#hosts-table", HostsTable),
            ("#gpus-table", GpusTable),
            ("#jobs-table", JobsTable),
            ("#ranks-table", RanksTable),
            ("#stages-table", StagesTable),
            ("#pools-table", PoolsTable),
            ("#processing-table", ProcessingTable),
            ("#saves-table", SavesTable),
            ("#sweeps-table", SweepsTable),
            ("#trials-table", TrialsTable),
            ("#pipelines-table", PipelinesTable),
            ("#steps-table", StepsTable),
            ("#doctor-table", FindingsTable),
        ):
            table = self.query_one(sel, cls)
            if table.set_columns(table.columns_for(w)):
                changed = True
        if changed:
            self._dirty = set(TABS)
        return changed

    # -- keys -------------------------------------------------------------------------------

    def binding_groups(self) -> list[tuple[str, list[tuple[str, str, str]]]]:
        from tui.app.screens.launch import LaunchScreen as _L

        def rows(bindings: Sequence[BindingType]) -> list[tuple[str, str, str]]:
            out = []
            for b in bindings:
                if isinstance(b, Binding) and b.id:
                    key = self._keymap.get(b.id, b.key)
                    out.append((self._key_label(key), b.description or b.action, b.id))
            return out

        return [
            ("Everywhere", rows(self.BINDINGS)),
            ("GPUs view", rows(GpusPane.BINDINGS)),
            ("Logs view", rows(LogView.BINDINGS)),
            ("Sweeps view", rows(SweepsPane.BINDINGS)),
            ("Map view", rows(ClusterMap.BINDINGS)),
            ("Pipelines view", rows(PipelinesPane.BINDINGS)),
            ("Doctor view", rows(DoctorPane.BINDINGS)),
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
        for p in problems:
            self.notify(p, title="keys.toml", severity="warning", timeout=10)

    def get_system_commands(self, screen: Screen[Any]) -> Any:
        yield from super().get_system_commands(screen)
        yield SystemCommand(
            "Deploy the agent to every host",
            "Install or upgrade the agent everywhere",
            lambda: self.action_deploy(all_hosts=True),
        )
        yield SystemCommand(
            "Reconnect every host",
            "Drop every telemetry connection and connect again",
            self.action_reconnect_all,
        )
        yield SystemCommand(
            "Launch a job…", "Pick a spec file or fill the form", self.action_launch
        )
        yield SystemCommand(
            "Run the doctor over every host",
            "Bandwidth, slow links, disks, version drift (measurement jobs; 0 shows it)",
            self.doctor_from_palette,
        )
        for h in self.hosts_snapshot:
            if h.error_kind == "unknown-host-key":
                name = h.name
                yield SystemCommand(
                    f"Trust the host key of {name}",
                    "Check the fingerprint, then record it",
                    lambda name=name: self.action_trust(name),
                )
            yield SystemCommand(
                f"Deploy the agent to {h.name}",
                "Install or upgrade it there",
                lambda name=h.name: self.action_deploy(name),
            )
        yield SystemCommand("Show key bindings", f"Rebind in {self.keymap_file}", self.action_help)

    # -- sampling ---------------------------------------------------------------------------

    @property
    def closing(self) -> bool:
        """Shutting down: a timer may fire, or a worker end, once more while the widgets go."""
        screen = self.default_screen
        return bool(self._exit or screen._closing or screen._closed or getattr(screen, "_pruning", False))

    def refresh_views(self, force: bool = False) -> None:
        """Sample the controller's state and apply what changed to the visible panels."""
        if self.closing:
            return
        self.samples += 1
        now = self.clock()
        second = int(now)
        state = self.client.state
        version = state.version
        jobs = self.jobwatch.snapshot()
        if force:
            self._dirty = set(TABS)
        if version != self._state_seen:
            # Hosts only: the GPU view reads the GPUs it shows from the state itself, so this
            # thread never holds (and so never has to free) a whole second of GPU samples.
            self.hosts_snapshot = state.snapshot(gpus=False)
            self._state_seen = version
            self._dirty |= {"hosts", "gpus", "map"}
            self._notice_host_keys()
            gpus = sum(h.gpu_count for h in self.hosts_snapshot)
            if gpus > self._frozen_for_gpus:
                self._frozen_for_gpus = gpus
                # The cluster grew (hosts connected): freeze in a moment, once they settle.
                self._freeze_at = min(self._freeze_at, time.monotonic() + 2.0)
        self._tune_gc()
        if jobs.version != self._jobs_seen or second != self._second:
            if jobs.version != self._jobs_seen:
                toast(self, self.notices.feed(jobs, now))
            self.jobs_snapshot = jobs
            self._jobs_seen = jobs.version
            self._second = second
            self._dirty |= {"jobs", "job", "checkpoints", "logs", "map"}
            if self.job_id is None and jobs.rows:
                live = [r for r in jobs.rows if r.state not in TERMINAL]
                if live:
                    self.select_job(live[0].job_id)
        active = self.tabs.active
        with self.batch_update():
            self._update_summary()
            if active in self._dirty:
                self._dirty.discard(active)
                if active == "hosts":
                    self.query_one("#hosts-table", HostsTable).apply(
                        host_rows(self.hosts_snapshot, self.widths)
                    )
                    self._update_host_detail()
                elif active == "gpus":
                    self._update_gpus()
                elif active == "jobs":
                    self._update_jobs(now)
                elif active in JOB_TABS:
                    self._update_detail(active, now)
                elif active == "sweeps":
                    self._update_sweeps(now)
                elif active == "map":
                    self.query_one("#map-pane", MapPane).apply(self.client.state, self.jobs_snapshot)
                elif active == "pipelines":
                    self._update_pipelines(now)
                elif active == "doctor":
                    self._update_doctor(now)
            if active == "logs":
                self.query_one("#log-view", LogView).sync()

    def _tune_gc(self) -> None:
        """Keep the garbage collector's full passes short.

        Thousands of GPUs mean hundreds of thousands of live objects, and a full collection
        walks all of them (tens of ms, a stalled frame, every few seconds as samples churn).
        Once a minute (and soon after the cluster grows) collect, then ``gc.freeze()`` what is
        left: it lives on, and later full passes walk only what is newer than a minute.
        """
        now = time.monotonic()
        if now < self._freeze_at or not self._frozen_for_gpus:
            return
        self._freeze_at = now + 60.0
        gc.collect()
        gc.freeze()

    def _update_summary(self) -> None:
        c = summarize(self.hosts_snapshot)
        jobs = self.jobs_snapshot
        running = jobs_running(jobs.rows)
        hosts = f"hosts [b]{c['up']}/{c['hosts']} up[/b]"  # "hosts 2/3 up · 1 stale · 0 down"
        hosts += f" · [$warning]{c['stale']} stale[/]" if c["stale"] else " · 0 stale"
        hosts += f" · [$error]{c['down']} down[/]" if c["down"] else " · 0 down"
        if c["connecting"]:
            hosts += f" · {c['connecting']} connecting"
        gpus = f"GPUs [b]{c['busy']} busy[/b] · {c['free']} free · {c['gpus']} total"
        if c["simulated"]:  # only the simulated ones: "(sim)" when all are, else "(4 sim)"
            gpus += (" [$text-muted](sim)[/]" if c["simulated"] == c["gpus"]
                     else f" [$text-muted]({c['simulated']} sim)[/]")
        rate = self.client.telemetry_hz
        rates = f"refresh {self.sample_hz:g} Hz" + (f", telemetry {rate:g} Hz" if rate else "")
        queued = sum(1 for r in jobs.rows if r.state == "queued")
        text = (
            f"{hosts} [$text-muted]│[/] {gpus} [$text-muted]│[/] jobs [b]{running}[/b] running"
            + (f" · {queued} queued" if queued else "")
            + f" [$text-muted]│ {rates}[/]"
        )
        link = self.client.link()
        if link.kind == "server":
            if link.up:
                text += f"\n[$text-muted]controller: {escape(link.detail)}[/]"
            else:
                down = max(0, int(self.clock() - link.since))
                text += f"\n[$error]{escape(link.detail)} ({down}s)[/]"
        elif queued:
            text += "\n[$text-muted]controller: embedded (queued jobs start only while rigdeck runs)[/]"
        if jobs.error:
            text += f"\n[$error]jobs: {escape(jobs.error[:300])}[/]"
        set_text(self.query_one("#summary", Static), text)

    def _update_host_detail(self) -> None:
        key = self.query_one("#hosts-table", HostsTable).cursor_key
        h = self.host_entry(key) if key else None
        text = host_detail(h, self.client.inventory) if h else ""
        set_text(self.query_one("#host-detail", Static), text)

    @on(DataTable.RowHighlighted, "#hosts-table")
    def _host_highlighted(self) -> None:
        self._update_host_detail()

    def _notice_host_keys(self) -> None:
        for h in self.hosts_snapshot:
            key = h.host_key or HostKey()
            if h.error_kind == "unknown-host-key" and key.fingerprint not in self._warned_keys:
                self._warned_keys.add(key.fingerprint or "")
                self.notify(
                    f"{h.name} presents an unknown host key ({key.type} "
                    f"{key.fingerprint}). Select it in Hosts and press t to check and "
                    "trust it.",
                    title="unknown host key",
                    severity="warning",
                    timeout=15,
                )

    def _update_gpus(self) -> None:
        table = self.query_one("#gpus-table", GpusTable)
        hosts = self.hosts_snapshot
        table.apply_state(self.client.state, hosts, self.widths, self.gpu_filter, self.gpu_sort)
        total = sum(h.gpu_count for h in hosts)
        status = (
            f"{table.row_count}/{total} GPUs · filter: {escape(self.gpu_filter.describe())} · "
            f"sort: {SORT_LABELS[self.gpu_sort]}  [$text-muted](/ filter · b busy/idle · o sort)[/]"
        )
        set_text(self.query_one("#gpus-status", Static), status)

    def _update_jobs(self, now: float) -> None:
        jobs = self.jobs_snapshot
        self.query_one("#jobs-table", JobsTable).apply(job_rows(jobs.rows, now))
        n = len(jobs.rows)
        status = (
            f"{n} job(s) · {jobs_running(jobs.rows)} running"
            "  [$text-muted](enter opens · l launch · s stop)[/]"
        )
        if not n:
            status = "no jobs yet: press l to launch one"
        set_text(self.query_one("#jobs-status", Static), status)

    def _update_detail(self, tab: str, now: float) -> None:
        detail = self.jobwatch.detail(self.job_id) if self.job_id else None
        if tab == "job":
            self._update_job(detail, now)
        elif tab == "checkpoints":
            self._update_checkpoints(detail, now)
        elif tab == "logs":
            view = self.query_one("#log-view", LogView)
            view.set_buffer(
                detail.logs if detail else None,
                empty_message="no job open: pick one in Jobs (3)" if detail is None else None,
            )
            self._update_logs_status()

    def _update_job(self, detail: JobDetail | None, now: float) -> None:
        head = self.query_one("#job-head", Static)
        chart = self.query_one("#loss", LossChart)
        ranks = self.query_one("#ranks-table", RanksTable)
        self._update_signals(detail)
        self._update_stages(detail)
        self._update_pools(detail)
        self._update_processing(detail)
        # A processing job reports no loss: its chart gives its room to the panels (unless a
        # loss came after all).
        chart.display = detail is None or detail.processing is None or bool(detail.points)
        if detail is None:
            set_text(head, "no job open: launch one (l), or pick one in Jobs (3) and press enter")
            chart.set_points((), None, empty="no job open")
            ranks.apply([])
            return
        r = detail.row
        lvl = {"running": "$success", "succeeded": "$success", "failed": "$error"}.get(
            r.state, "$warning"
        )
        line1 = (
            f"[b]{escape(r.job_id)}[/b]  [{lvl}]{escape(r.state)}[/]"
            + (f" after {r.restarts} restart(s)" if r.restarts else "")
            + f"  [$text-muted]on[/] {placement_markup(r.placement)}"
        )
        step = (
            "-"
            if r.step is None
            else (f"{r.step}/{r.total_steps}" if r.total_steps else str(r.step))
        )
        eta = r.eta_s
        best = min((p[1] for p in detail.points), default=None)
        line2 = (
            f"runtime {duration(r.runtime_s(now))} · ranks {r.ranks_running}/{r.ranks_total} running"
        ) if detail.processing is not None and r.step is None else (
            f"step [b]{step}[/b] · loss [b]{loss_text(r.loss)}[/b]"
            + (
                f" (min {loss_text(best)})"
                if best is not None and r.loss is not None and best < r.loss
                else ""
            )
            + f" · {step_rate_text(r.step_rate)}"
            + (f" · ETA [b]{duration(eta)}[/b]" if eta is not None else "")
            + f" · runtime {duration(r.runtime_s(now))}"
            + f" · ranks {r.ranks_running}/{r.ranks_total} running"
        )
        lines = [line1, line2]
        code = code_markup(detail.spec.get("code"), detail.events)
        if code:
            lines.append(code)
        if r.unreachable:
            lines.append(f"[$warning]not answering: {escape(', '.join(r.unreachable))}[/]")
        if r.cause:
            lines.append(f"[$error]cause: {escape(_cause_text(r.cause))}[/]")
            for tail in (r.cause.get("tail") or [])[-3:]:
                lines.append(f"[$text-muted]  | {escape(terminal_safe(str(tail)))}[/]")
        set_text(head, "\n".join(lines))
        x_max = float(r.total_steps - 1) if r.total_steps else None
        chart.set_points(
            detail.points,
            (r.job_id, detail.points_version),
            x_max=x_max,
            empty="waiting for the first loss",
        )
        ranks.apply(rank_rows(detail.ranks, r.placement))

    def _update_signals(self, detail: JobDetail | None) -> None:
        box = self.query_one("#job-signals", Static)
        signals = detail.signals if detail is not None else ()
        box.display = bool(signals)
        lines = []
        for sig in signals:
            lvl = {"bad": "$error", "warn": "$warning"}.get(sig.verdict, "$text-muted")
            pad = " " * max(1, 5 - len(sig.verdict))
            lines.append(f"[{lvl}]{escape(sig.verdict)}[/]{pad}{escape(sig.summary)}")
            lines.append(f"     [$text-muted]{escape(sig.advice)}[/]")
        set_text(box, "\n".join(lines))

    def _update_panel(self, name: str, view: Any, head_markup: Callable[[Any], str],
                      rows: Callable[[Any], Any]) -> None:
        """A Job view panel (``#NAME-head`` over ``#NAME-table``) shown only for a job that has
        its view: a model-parallel job's stages, a worker-pool job's pools, a processing job's
        inputs."""
        head = self.query_one(f"#{name}-head", Static)
        table = self.query_one(f"#{name}-table")
        head.display = table.display = view is not None
        if view is None:
            table.apply([])  # type: ignore[attr-defined]
            return
        set_text(head, head_markup(view))
        table.apply(rows(view))  # type: ignore[attr-defined]

    def _update_stages(self, detail: JobDetail | None) -> None:
        self._update_panel("stages", detail.stages if detail is not None else None,
                           stages_head_markup, stage_rows)

    def _update_pools(self, detail: JobDetail | None) -> None:
        self._update_panel("pools", detail.pools if detail is not None else None,
                           pools_head_markup, pool_rows)

    def _update_processing(self, detail: JobDetail | None) -> None:
        self._update_panel("processing", detail.processing if detail is not None else None,
                           processing_head_markup, processing_rows)

    def _update_checkpoints(self, detail: JobDetail | None, now: float) -> None:
        head = self.query_one("#ckpt-head", Static)
        saves = self.query_one("#saves-table", SavesTable)
        if detail is None:
            set_text(head, "no job open: pick one in Jobs (3)")
            saves.apply([])
            return
        ck = detail.checkpoints
        owners = ", ".join(o.label() for o in ck.owners) or "-"
        lines = [
            f"[b]{escape(detail.row.job_id)}[/b]  policy [b]{escape(ck.policy)}[/b]"
            + (f" · dir {escape(ck.directory)}" if ck.directory else "")
            + f" · owner{'s' if len(ck.owners) != 1 else ''} [b]{escape(owners)}[/b]"
        ]
        d = ck.last_done
        if d is not None:
            age = duration(now - d.time) + " ago" if d.time is not None else "-"
            speed = f"{size_bytes(d.speed_bps)}/s" if d.speed_bps else "-"
            lines.append(
                f"last complete: step [b]{d.step}[/b] by {escape(d.owner.label())} · {age} · "
                f"{size_bytes(d.bytes)} in {d.seconds or 0:.2f}s · {speed}"
            )
        else:
            lines.append("[$text-muted]no complete checkpoint yet[/]")
        if ck.failed:
            lines.append(f"[$error]{ck.failed} failed save(s): highlighted below[/]")
        for m in ck.moves[-2:]:
            lines.append(
                f"[$warning]owner moved: {escape(m.from_.label())} → {escape(m.to.label())}"
                f" ({escape(m.reason or '')})[/]"
            )
        set_text(head, "\n".join(lines))
        from tui.app.widgets.tables import save_rows

        saves.apply(save_rows(ck, now))

    def _update_logs_status(self) -> None:
        view = self.query_one("#log-view", LogView)
        if view.buffer is None:
            set_text(self.query_one("#logs-status", Static), "no job open")
            return
        rank = "all ranks" if view.rank is None else f"rank {view.rank}"
        parts = [
            f"[b]{escape(self.job_id or '')}[/b]",
            rank,
            f"follow {'on' if view.follow else 'off'}",
            f"{view.line_count} lines",
        ]
        if view.search:
            parts.append(escape(view.match_status))
        text = " · ".join(parts) + "  [$text-muted](r rank · f follow · / search · n next)[/]"
        set_text(self.query_one("#logs-status", Static), text)

    @on(LogView.Changed)
    def _log_changed(self) -> None:
        self._update_logs_status()

    # -- sweeps -----------------------------------------------------------------------------

    def poll_sweeps(self, soon: bool = False) -> None:
        """Fetch the sweeps (and the selected one's detail) on a worker thread, while the view
        shows and no fetch is under way; ``soon``: one more right after the current one (the
        selection changed, a stop was sent)."""
        if self.closing or self.tabs.active != "sweeps":
            return
        if self._sweeps_inflight:
            self._sweeps_again = self._sweeps_again or soon
            return
        self._sweeps_inflight = True
        self.run_worker(
            lambda sel=self.sweep_id: fetch_sweeps(self.client, sel),
            thread=True,
            group="sweeps",
            name="sweeps",
            exit_on_error=False,
        )

    def _sweeps_fetched(self, fetch: SweepFetch | None, error: str | None = None) -> None:
        self._sweeps_inflight = False
        self.sweeps_fetches += 1
        if self.closing:
            return
        if fetch is None:
            self.sweeps_error = error or "sweeps: the fetch failed"
        else:
            self.sweeps_error = fetch.error
            if fetch.rows is not None:
                self.sweep_list = fetch.rows
                ids = {r.sweep_id for r in fetch.rows}
                if self._sweep_wanted not in ids:
                    self._sweep_wanted = None  # a pipeline's sweep step's sweep, gone
                if self.sweep_id not in ids:
                    self.sweep_id = fetch.selected
                    self.sweep_detail = None
            if fetch.selected == self.sweep_id:
                if fetch.detail is not None:
                    self.sweep_detail = fetch.detail
                elif fetch.error is None:
                    self.sweep_detail = None
            else:
                self._sweeps_again = True  # the selection moved while this one was fetched
        if self.tabs.active == "sweeps":
            self._update_sweeps(self.clock())
            self._dirty.discard("sweeps")
        if self._sweeps_again:
            self._sweeps_again = False
            self.poll_sweeps()

    def current_trial(self) -> TrialRow | None:
        d = self.sweep_detail
        if d is None:
            return None
        key = self.query_one("#trials-table", TrialsTable).cursor_key
        return next((t for t in d.trials if str(t.number) == key), None)

    def _update_sweeps(self, now: float) -> None:
        status = self.query_one("#sweeps-status", Static)
        sweeps = self.query_one("#sweeps-table", SweepsTable)
        trials = self.query_one("#trials-table", TrialsTable)
        rows = self.sweep_list
        detail = self.sweep_detail
        if not self.sweeps_fetches:
            text = "loading sweeps…"
        elif not rows:
            text = NO_SWEEPS
        else:
            running = sum(1 for r in rows if r.state in ("running", "stopping"))
            text = (
                f"{len(rows)} sweep(s) · {running} running  "
                "[$text-muted](enter: its trials · enter on a trial: its job)[/]"
            )
        if self.sweeps_error:
            text = f"[$error]{escape(self.sweeps_error[:300])}[/]" + (
                "  [$text-muted](showing the last fetched)[/]" if rows else ""
            )
        set_text(status, text)
        sweeps.apply(sweep_rows(rows))
        wanted = self._sweep_wanted  # a pipeline's sweep step was opened: the cursor on its sweep
        if wanted is not None and wanted in sweeps._order:
            self._sweep_wanted = None
            sweeps.move_cursor(row=sweeps._order.index(wanted))
        if detail is not None and detail.row.sweep_id != self.sweep_id:
            detail = None
        head = self.query_one("#sweep-head", Static)
        if not rows:
            set_text(head, "no sweep selected" if self.sweeps_fetches else "")
        elif detail is None and self.sweep_id is not None:
            set_text(head, f"[b]{escape(self.sweep_id)}[/b]  [$text-muted]loading…[/]")
        else:
            set_text(head, sweep_head(detail))
        metric = detail.row.metric if detail is not None else "objective"
        if trials.metric != metric:
            trials.metric = metric
            trials.set_columns(trials.columns_for(self.widths))
        trials.apply(trial_rows(detail, now) if detail is not None else [])
        self._update_sweep_charts(detail)

    def _update_sweep_charts(self, detail: SweepDetail | None) -> None:
        best = self.query_one("#sweep-best", LossChart)
        curves = self.query_one("#sweep-curves", LossChart)
        if detail is None:
            empty = "no sweep selected" if self.sweep_list else "no sweeps"
            best.set_series((), None, empty=empty)
            curves.set_series((), None, empty=empty)
            curves.border_subtitle = ""
            self.query_one("#trials-table", TrialsTable).border_subtitle = ""
            return
        r = detail.row
        so_far = detail.best_so_far()
        best.set_series(
            [so_far] if so_far else [],
            (r.sweep_id, so_far, r.max_trials),
            x_max=float(r.max_trials),
            x_min_step=1.0,
            steps=True,
            empty="no trial completed yet",
        )
        best.border_title = f"best {r.metric} so far, by trial"
        cursor = self.current_trial()
        self.query_one("#trials-table", TrialsTable).border_subtitle = trial_line(cursor)
        chosen = curve_trials(detail, extra=cursor.number if cursor is not None else None)
        curves.set_series(
            [t.curve for t in chosen],
            (r.sweep_id, tuple((t.number, len(t.curve), t.curve[-1]) for t in chosen)),
            empty=f"no {r.metric} reported yet",
        )
        curves.border_title = f"{r.metric} by step"
        curves.border_subtitle = " ".join(
            f"[{var}]━ #{t.number}[/]" for var, t in zip(LINE_VARS, chosen, strict=False)
        )

    @on(DataTable.RowHighlighted, "#sweeps-table")
    def _sweep_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value
        if key and key != self.sweep_id:
            self.sweep_id = key
            self.sweep_detail = None
            self._update_sweeps(self.clock())
            self.query_one("#trials-table", TrialsTable).move_cursor(row=0)
            self.poll_sweeps(soon=True)

    @on(DataTable.RowSelected, "#sweeps-table")
    def _sweep_chosen(self) -> None:
        self.query_one("#trials-table").focus()

    @on(DataTable.RowHighlighted, "#trials-table")
    def _trial_highlighted(self) -> None:
        self._update_sweep_charts(
            self.sweep_detail
            if self.sweep_detail is not None and self.sweep_detail.row.sweep_id == self.sweep_id
            else None
        )

    @on(DataTable.RowSelected, "#trials-table")
    def _trial_chosen(self) -> None:
        t = self.current_trial()
        if t is not None and t.state == "ready":
            self.notify(f"Trial {t.number} was asked ahead of its turn: it starts (and has a job) when a GPU frees.")
        elif t is not None:
            self.select_job(t.job_id)
            self.tabs.active = "job"

    # -- pipelines --------------------------------------------------------------------------

    def poll_pipelines(self, soon: bool = False) -> None:
        """Fetch the pipelines (and the selected one's detail) on a worker thread, while the
        view shows and no fetch is under way (as ``poll_sweeps``): a slow or dead controller
        leaves the last fetched on screen and never holds the UI."""
        if self.closing or self.tabs.active != "pipelines":
            return
        if self._pipelines_inflight:
            self._pipelines_again = self._pipelines_again or soon
            return
        self._pipelines_inflight = True
        self.run_worker(
            lambda sel=self.pipeline_id: fetch_pipelines(self.client, sel),
            thread=True,
            group="pipelines",
            name="pipelines",
            exit_on_error=False,
        )

    def _pipelines_fetched(self, fetch: PipelineFetch | None, error: str | None = None) -> None:
        self._pipelines_inflight = False
        self.pipelines_fetches += 1
        if self.closing:
            return
        if fetch is None:
            self.pipelines_error = error or "pipelines: the fetch failed"
        else:
            self.pipelines_error = fetch.error
            if fetch.rows is not None:
                self.pipeline_list = fetch.rows
                if self.pipeline_id not in {r.pipeline_id for r in fetch.rows}:
                    self.pipeline_id = fetch.selected
                    self.pipeline_detail = None
            if fetch.selected == self.pipeline_id:
                if fetch.detail is not None:
                    self.pipeline_detail = fetch.detail
                elif fetch.error is None:
                    self.pipeline_detail = None
            else:
                self._pipelines_again = True  # the selection moved while this one was fetched
        if self.tabs.active == "pipelines":
            self._update_pipelines(self.clock())
            self._dirty.discard("pipelines")
        if self._pipelines_again:
            self._pipelines_again = False
            self.poll_pipelines()

    def _shown_pipeline(self) -> PipelineDetail | None:
        d = self.pipeline_detail
        return d if d is not None and d.row.pipeline_id == self.pipeline_id else None

    def current_step(self) -> StepRow | None:
        d = self._shown_pipeline()
        if d is None:
            return None
        key = self.query_one("#steps-table", StepsTable).cursor_key
        return d.step(key) if key else None

    def _update_pipelines(self, now: float) -> None:
        status = self.query_one("#pipelines-status", Static)
        rows = self.pipeline_list
        detail = self._shown_pipeline()
        if not self.pipelines_fetches:
            text = "loading pipelines…"
        elif not rows:
            text = NO_PIPELINES
        else:
            running = sum(1 for r in rows if r.state in ("running", "stopping"))
            text = (
                f"{len(rows)} pipeline(s) · {running} running  "
                "[$text-muted](enter: its steps · enter on a step: its job · S stop · r retry step)[/]"
            )
        if self.pipelines_error:
            text = f"[$error]{escape(self.pipelines_error[:300])}[/]" + (
                "  [$text-muted](showing the last fetched)[/]" if rows else ""
            )
        set_text(status, text)
        self.query_one("#pipelines-table", PipelinesTable).apply(pipeline_rows(rows, now))
        head = self.query_one("#pipeline-head", Static)
        if not rows:
            set_text(head, "no pipeline selected" if self.pipelines_fetches else "")
        elif detail is None and self.pipeline_id is not None:
            set_text(head, f"[b]{escape(self.pipeline_id)}[/b]  [$text-muted]loading…[/]")
        else:
            set_text(head, pipeline_head(detail, now))
        steps = self.query_one("#steps-table", StepsTable)
        steps.apply(step_rows(detail, now) if detail is not None else [])
        set_text(self.query_one("#step-detail", Static), step_detail(self.current_step(), now))

    @on(DataTable.RowHighlighted, "#pipelines-table")
    def _pipeline_highlighted(self, event: DataTable.RowHighlighted) -> None:
        key = event.row_key.value
        if key and key != self.pipeline_id:
            self.pipeline_id = key
            self.pipeline_detail = None
            self._update_pipelines(self.clock())
            self.query_one("#steps-table", StepsTable).move_cursor(row=0)
            self.poll_pipelines(soon=True)

    @on(DataTable.RowSelected, "#pipelines-table")
    def _pipeline_chosen(self) -> None:
        self.query_one("#steps-table").focus()

    @on(DataTable.RowHighlighted, "#steps-table")
    def _step_highlighted(self) -> None:
        # A highlight queued while the app shuts down (a late fetch's rows) finds no panel: nothing
        # to show then, and no reason to crash the app.
        found = self.query("#step-detail").results(Static)
        detail = next(found, None)
        if detail is None:
            return
        set_text(detail, step_detail(self.current_step(), self.clock()))

    @on(DataTable.RowSelected, "#steps-table")
    def _step_chosen(self) -> None:
        """A job step: its job in the Job view; a sweep step: its sweep in the Sweeps view."""
        s = self.current_step()
        if s is None:
            return
        if s.kind == "sweep" and s.sweep_id:
            if s.sweep_id != self.sweep_id:
                self.sweep_id = s.sweep_id
                self.sweep_detail = None
            self._sweep_wanted = s.sweep_id
            self.tabs.active = "sweeps"
        elif s.job_id:
            self.select_job(s.job_id)
            self.tabs.active = "job"
        else:
            self.notify(f"step {s.name} has no job yet ({s.state})", title="pipeline")

    def stop_pipeline(self) -> None:
        """Stop the selected pipeline (its running steps; no further step starts), after a
        confirmation."""
        d = self._shown_pipeline()
        row = d.row if d is not None else None
        if row is None:
            row = next((r for r in self.pipeline_list if r.pipeline_id == self.pipeline_id), None)
        if row is None:
            self.notify("no pipeline selected: pick one in Pipelines (9)", severity="warning")
            return
        if not can_stop_pipeline(row):
            self.notify(f"{row.pipeline_id} has already ended ({row.state})", severity="warning")
            return
        pipeline_id = row.pipeline_id

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.notify(f"stopping pipeline {pipeline_id}…", title="pipeline")
                self._stop_pipeline(pipeline_id)

        title = f"Stop pipeline [b]{escape(pipeline_id)}[/b]?"
        self.dialog(ConfirmSweepStop(title, stop_pipeline_text(d, row), "Stop pipeline"), confirmed)

    @work(thread=True, group="action", name="stop pipeline", exit_on_error=False)
    def _stop_pipeline(self, pipeline_id: str) -> str:
        d = self.client.pipeline_stop(pipeline_id)
        return f"pipeline {pipeline_id}: {d.row.state}"

    def retry_step(self) -> None:
        """Run the failed or stopped step under the cursor again (and what was skipped for it)."""
        d = self._shown_pipeline()
        if d is None:
            self.notify("no pipeline selected: pick one in Pipelines (9)", severity="warning")
            return
        s = self.current_step()
        if s is None:
            self.notify("no step selected: pick one in the steps table", severity="warning")
            return
        if not can_retry_step(s):
            self.notify(f"step {s.name} is {s.state}: only a failed or stopped step is retried",
                        severity="warning")
            return
        self.notify(f"retrying step {s.name} of {d.row.pipeline_id}…", title="pipeline")
        self._retry_step(d.row.pipeline_id, s.name)

    @work(thread=True, group="action", name="retry step", exit_on_error=False)
    def _retry_step(self, pipeline_id: str, step: str) -> str:
        d = self.client.pipeline_retry(pipeline_id, step)
        after = d.step(step)
        return f"pipeline {pipeline_id}: step {step} {after.state if after else 'retried'}"

    # -- doctor -----------------------------------------------------------------------------

    @property
    def doctor_running(self) -> bool:
        return self._doctor_since is not None

    def run_doctor(self) -> None:
        """Run the doctor over every host on a worker thread (measurement jobs: it takes a
        while); one run at a time. The last report stays shown until the new one arrives."""
        if self.doctor_running:
            self.notify("the doctor is already running", title="doctor", severity="warning")
            return
        self._doctor_since = time.monotonic()
        self.doctor_error = None
        self.run_worker(
            lambda: run_doctor(self.client),
            thread=True,
            group="doctor",
            name="doctor",
            exit_on_error=False,
        )
        self._update_doctor(self.clock())

    def doctor_from_palette(self) -> None:
        self.tabs.active = "doctor"
        self.run_doctor()

    def _doctor_done(self, run: DoctorRun | None, error: str | None = None) -> None:
        self._doctor_since = None
        self.doctor_runs += 1
        if run is None:
            self.doctor_error = error or "doctor: the run failed"
        elif run.report is not None:
            self.doctor_report = run.report
            self.doctor_error = None
        else:
            self.doctor_error = run.error
        if self.tabs.active == "doctor":
            self._update_doctor(self.clock())
        else:
            self._dirty.add("doctor")
            report = self.doctor_report
            if self.doctor_error:
                self.notify(escape(self.doctor_error), title="doctor failed", severity="error")
            elif report is not None:
                self.notify(f"doctor: {report.worst} (0 shows it)", title="doctor")

    def _doctor_tick(self) -> None:
        """Twice a second while the view shows: the run's elapsed time, the report's age."""
        if not self.closing and self.tabs.active == "doctor":
            self._update_doctor(self.clock())

    def _update_doctor(self, now: float) -> None:
        report = self.doctor_report
        lines = []
        if self._doctor_since is not None:
            took = int(time.monotonic() - self._doctor_since)
            lines.append(f"[$warning]running… ({took}s)[/] [$text-muted]measurement jobs on every host"
                         + ("; the last report below" if report is not None else "") + "[/]")
        if self.doctor_error:
            lines.append(f"[$error]{escape(self.doctor_error[:300])}[/]"
                         + (" [$text-muted](showing the last report)[/]" if report is not None else ""))
        if report is not None:
            lines.append(summary_markup(report, now) + "  [$text-muted](D runs again)[/]")
            skipped = skipped_markup(report)
            if skipped:
                lines.append(skipped)
        elif self._doctor_since is None:
            lines.append("[$text-muted]D runs it again[/]" if self.doctor_error else NO_REPORT)
        set_text(self.query_one("#doctor-status", Static), "\n".join(lines))
        self.query_one("#doctor-table", FindingsTable).apply(finding_rows(report))
        self._update_doctor_detail()
        matrix = p2p_matrix(report)
        box = self.query_one("#doctor-matrix", Static)
        box.display = matrix is not None
        if matrix is not None:
            set_text(box, matrix_markup(matrix))

    @on(DataTable.RowHighlighted, "#doctor-table")
    def _update_doctor_detail(self) -> None:
        key = self.query_one("#doctor-table", FindingsTable).cursor_key
        f = dict(keyed_findings(self.doctor_report)).get(key) if key else None
        box = self.query_one("#doctor-detail", Static)
        text = finding_detail(f)
        box.display = bool(text)
        set_text(box, text)

    # -- navigation -------------------------------------------------------------------------

    def action_show_tab(self, tab: str) -> None:
        self.tabs.active = tab

    @on(TabbedContent.TabActivated)
    def _tab_activated(self, event: TabbedContent.TabActivated) -> None:
        pane = event.pane.id
        self.refresh_views()
        focus = {
            "hosts": "#hosts-table",
            "gpus": "#gpus-table",
            "jobs": "#jobs-table",
            "job": "#ranks-table",
            "checkpoints": "#saves-table",
            "logs": "#log-view",
            "sweeps": "#sweeps-table",
            "map": "#cluster-map",
            "pipelines": "#pipelines-table",
            "doctor": "#doctor-table",
        }.get(pane or "")
        if focus:
            self.query_one(focus).focus()
        if pane == "sweeps":
            self.poll_sweeps(soon=True)
        if pane == "pipelines":
            self.poll_pipelines(soon=True)

    def select_job(self, job_id: str | None) -> None:
        if job_id != self.job_id:
            self.job_id = job_id
            self.jobwatch.select(job_id)
            self._dirty |= set(JOB_TABS)

    @on(ClusterMap.Selected)
    def _map_selected(self, event: ClusterMap.Selected) -> None:
        """A GPU chosen on the map: its job becomes the open one (Job 4 shows it)."""
        if event.job_id:
            self.select_job(event.job_id)
            self.notify(f"{event.job_id} is the open job: 4 shows it", title="map")

    @on(DataTable.RowSelected, "#jobs-table")
    def _job_chosen(self, event: DataTable.RowSelected) -> None:
        if event.row_key.value:
            self.select_job(event.row_key.value)
            self.tabs.active = "job"

    @on(Input.Submitted, "#gpu-filter")
    @on(Input.Changed, "#gpu-filter")
    def _filter_changed(self, event: Input.Changed | Input.Submitted) -> None:
        self.gpu_filter = GpuFilter(self.gpu_filter.busy, event.value)
        self.refresh_views(force=True)
        if isinstance(event, Input.Submitted):
            self.query_one("#gpus-table").focus()

    @on(LogView.SearchRequested)
    def _search_requested(self) -> None:
        box = self.query_one("#log-search", Input)
        box.display = True
        box.focus()

    @on(Input.Submitted, "#log-search")
    def _search_submitted(self, event: Input.Submitted) -> None:
        view = self.query_one("#log-view", LogView)
        view.set_search(event.value.strip())
        if not event.value.strip():
            event.input.display = False
        view.focus()

    def on_key(self, event: Any) -> None:
        if (
            event.key == "escape"
            and self.focused is not None
            and self.focused.id in ("log-search", "gpu-filter")
        ):
            box = self.focused
            assert isinstance(box, Input)
            if box.id == "log-search":
                box.value = ""
                box.display = False
                view = self.query_one("#log-view", LogView)
                view.set_search("")
                view.focus()
            else:
                self.query_one("#gpus-pane", GpusPane).action_clear_filter()
                self.query_one("#gpus-table").focus()
            event.stop()

    # -- the current host and job -----------------------------------------------------------

    def current_host(self) -> str | None:
        names = [h.name for h in self.hosts_snapshot] or list(self.client.inventory.names)
        if self.tabs.active == "gpus":
            key = self.query_one("#gpus-table", GpusTable).cursor_key
            if key:
                return key.split("/", 1)[0]
        if self.tabs.active == "map":
            key = self.query_one("#cluster-map", ClusterMap).cursor_host
            if key:
                return key
        key = self.query_one("#hosts-table", HostsTable).cursor_key
        if key:
            return key
        return names[0] if names else None

    def current_job(self) -> str | None:
        if self.tabs.active == "jobs":
            key = self.query_one("#jobs-table", JobsTable).cursor_key
            if key:
                return key
        return self.job_id

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

    @work(thread=True, group="action", name="stop", exit_on_error=False)
    def _stop_job(self, job_id: str) -> str:
        state = self.jobwatch.stop_job(job_id)
        return f"{job_id}: {state}"

    def stop_trial(self) -> None:
        """Stop the trial the cursor is on, after a confirmation."""
        d = self.sweep_detail
        if d is None or d.row.sweep_id != self.sweep_id:
            self.notify("no sweep selected: pick one in Sweeps (7)", severity="warning")
            return
        t = self.current_trial()
        if t is None:
            self.notify("no trial selected: pick one in the trials table", severity="warning")
            return
        if not can_stop_trial(t):
            self.notify(f"trial {t.number} has already ended ({t.state})", severity="warning")
            return
        sweep_id, number = d.row.sweep_id, t.number

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.notify(f"stopping trial {number} of {sweep_id}…", title="sweep")
                self._stop_trial(sweep_id, number)

        title = f"Stop trial [b]{number}[/b] of sweep [b]{escape(sweep_id)}[/b]?"
        self.dialog(ConfirmSweepStop(title, stop_trial_text(d.row, t), "Stop trial"), confirmed)

    @work(thread=True, group="action", name="stop trial", exit_on_error=False)
    def _stop_trial(self, sweep_id: str, number: int) -> str:
        self.client.sweep_stop_trial(sweep_id, number)
        return f"{sweep_id}: trial {number} stopping"

    def stop_sweep(self) -> None:
        """Stop the selected sweep (its queued and running trials), after a confirmation."""
        d = self.sweep_detail
        row = d.row if d is not None and d.row.sweep_id == self.sweep_id else None
        if row is None:
            row = next((r for r in self.sweep_list if r.sweep_id == self.sweep_id), None)
        if row is None:
            self.notify("no sweep selected: pick one in Sweeps (7)", severity="warning")
            return
        if not can_stop_sweep(row):
            self.notify(f"{row.sweep_id} has already ended ({row.state})", severity="warning")
            return
        sweep_id = row.sweep_id

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.notify(f"stopping sweep {sweep_id}…", title="sweep")
                self._stop_sweep(sweep_id)

        title = f"Stop sweep [b]{escape(sweep_id)}[/b]?"
        self.dialog(ConfirmSweepStop(title, stop_sweep_text(row), "Stop sweep"), confirmed)

    @work(thread=True, group="action", name="stop sweep", exit_on_error=False)
    def _stop_sweep(self, sweep_id: str) -> str:
        d = self.client.sweep_stop(sweep_id)
        return f"sweep {sweep_id}: {d.row.state}"

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
        if w.group == "sweeps":
            if event.state == WorkerState.SUCCESS:
                self._sweeps_fetched(w.result)
            elif event.state in (WorkerState.ERROR, WorkerState.CANCELLED):
                self._sweeps_fetched(None, f"sweeps: {describe_error(w.error or Exception('cancelled'))}")
            return
        if w.group == "pipelines":
            if event.state == WorkerState.SUCCESS:
                self._pipelines_fetched(w.result)
            elif event.state in (WorkerState.ERROR, WorkerState.CANCELLED):
                self._pipelines_fetched(
                    None, f"pipelines: {describe_error(w.error or Exception('cancelled'))}")
            return
        if w.group == "doctor":
            if event.state == WorkerState.SUCCESS:
                self._doctor_done(w.result)
            elif event.state in (WorkerState.ERROR, WorkerState.CANCELLED):
                self._doctor_done(None, f"doctor: {describe_error(w.error or Exception('cancelled'))}")
            return
        if w.group != "action":
            return
        if event.state == WorkerState.SUCCESS and w.result:
            self.notify(escape(str(w.result)), title=w.name)
            self.refresh_views(force=True)
            self.poll_sweeps(soon=True)
            self.poll_pipelines(soon=True)
        elif event.state == WorkerState.ERROR:
            self.notify(
                escape(describe_error(w.error or Exception("failed"))),
                title=f"{w.name} failed",
                severity="error",
                timeout=12,
            )


def host_detail(h: HostView, inventory: Any) -> str:
    """The selected host in full: where it is, what runs there, and why it is not up."""
    try:
        spec = inventory.get(h.name)
        where = "local" if spec.is_local else f"{spec.user}@{spec.address}:{spec.port}"
    except Exception:  # UnknownHostError: a recorded snapshot without inventory entry
        where = str(h.address or "")
    status = str(h.status or "connecting")
    lvl = {"up": "$success", "stale": "$warning", "down": "$error"}.get(status, "$text-muted")
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
    why = host_why(h)
    if why:
        color = "$error" if status == "down" or h.error_kind else "$warning"
        text += f"\n[{color}]{escape(why)}[/]"
    return text


def code_markup(code: Mapping[str, Any] | None, events: Sequence[Mapping[str, Any]]) -> str | None:
    """``[code] sync``: the snapshot's hash and size, and what its hosts were sent for it."""
    if not code or not code.get("tree"):
        return None
    from tui.app.widgets.format import size_bytes

    text = (f"code [b]{escape(str(code['tree'])[:12])}[/b] · {code.get('files')} files "
            f"{size_bytes(code.get('size') or 0)}")
    sync = next((e for e in reversed(events) if e.get("event") == "code"), None)
    if sync:
        per = []
        for host, got in sorted((sync.get("hosts") or {}).items()):
            per.append(f"{escape(host)} had it" if got.get("had_tree") else
                       f"{escape(host)} +{got.get('files_sent')} ({size_bytes(got.get('bytes_sent') or 0)})")
        text += " · synced: " + ", ".join(per)
    else:
        text += " · [$text-muted]not yet synced[/]"
    return text


def _cause_text(cause: Mapping[str, Any]) -> str:
    return describe_cause(dict(cause)) or "unknown"
