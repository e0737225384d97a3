"""The controller service: one object that holds everything the controller does, and the one
place the faces' requests land.

Embedded (the default), the app and the CLI call it in their own process through
``tui.client.InProcessClient``. With a server, ``rigdeck serve`` holds one on a head host and
``tui.control.server`` exposes the same methods over a unix socket; ``tui.client.RemoteClient``
calls them from the workstation. Same code in both places: the agent connections
(``HostLinks``), telemetry (``Monitor``), the job history and the gang rules (``JobManager``),
the poller that supervises live jobs and folds their metrics (``JobWatch``) and the queue.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tui.control import images
from tui.control.history import History
from tui.control.hostlinks import HostLinks, HostReport
from tui.control.images import ImageError, ImagePush
from tui.control.jobs import JobError, JobManager, JobView, new_job_id
from tui.control.jobwatch import JobDetail, JobsSnapshot, JobWatch, StopPlan
from tui.control.notify import Notifier
from tui.control.pipelines import PipelineRunner
from tui.control.queue import JobQueue, QueueEntry
from tui.control.sweeps import SweepRunner
from tui.model.doctor import DoctorReport
from tui.model.fairshare import QueuePolicy
from tui.model.health import DRAINED, UNHEALTHY, Drain, drained, parse_target
from tui.model.identity import local_user
from tui.model.inventory import Inventory
from tui.model.jobspec import PRIORITY_MAX, PRIORITY_MIN, JobSpec
from tui.model.jobstate import QUEUED, RUNNING, TERMINAL
from tui.model.pipelineview import PIPELINE_FINAL, PipelineDetail, PipelineRow
from tui.model.promexport import cluster_exposition
from tui.model.state import ClusterState, HostStatus
from tui.model.sweepview import SweepDetail, SweepRow
from tui.model.usage import UsageReport, usage_report
from tui.model.userconfig import NotifyConfig

log = logging.getLogger(__name__)


def _user() -> str:
    return local_user() or "?"

SWEEP_ROUND_S = 0.25  # the poller's interval while a sweep has trials to follow
QUIET_STALE_S = 2.0  # a host stale this long (no telemetry for ~4.5 s) is asked briefly


@dataclass(frozen=True)
class ServiceInfo:
    """Where the controller runs, for the faces' status line."""

    kind: str  # "embedded" or "server"
    host: str | None  # the server's host (inventory name), None embedded
    pid: int
    since: float
    version: str
    history: str  # the history database's path (on the controller's machine)
    queue_advances: bool  # whether queued jobs start while no face is open


class ControllerService:
    """Everything a controller does; thread-safe where the faces need it to be."""

    def __init__(
        self,
        inventory: Inventory,
        *,
        accept_new: bool = False,
        history: History | None = None,
        telemetry_hz: float = 1.0,
        kind: str = "embedded",
        host: str | None = None,
        owner: str | None = None,
        monitor: Any = None,
        watch: Any = None,
        controller: HostLinks | None = None,
        source: Any = None,
        notify: NotifyConfig | None = None,
        queue_policy: QueuePolicy | None = None,
        groups: Mapping[str, Sequence[str]] | None = None,
    ):
        self.kind = kind
        self.queue_policy = queue_policy or QueuePolicy()
        if groups is None:  # the queue's [[group]] tables: user -> their groups
            members = {u for g in self.queue_policy.groups for u in g.members}
            groups = {u: [g.name for g in self.queue_policy.groups if u in g.members] for u in members}
        self.groups = dict(groups)  # user -> their groups (``usage --by group``)
        self._goodput_cache: dict[str, float | None] = {}  # an ended job's goodput, read once
        self.host = host
        self.ctl = controller or HostLinks(inventory, accept_new=accept_new)
        self.inventory = self.ctl.inventory
        self._history = history
        self._manager: JobManager | None = None
        self._owner = owner
        self.telemetry_hz = telemetry_hz
        self._monitor = monitor
        self._watch = watch
        self._queue: JobQueue | None = None
        self._sweeps: SweepRunner | None = None
        self._pipelines: PipelineRunner | None = None
        self._round_s = getattr(watch, "interval", 1.0)  # the poller's own interval, between sweeps
        self._lock = threading.Lock()
        self.since = time.time()
        self._started = False
        self.notify_config = notify
        self.notifier: Notifier | None = None  # made with the manager, when [notify] sends anything
        # What the app shows of jobs: this service's own poller, or a stand-in (recorded data).
        self.source: Any = source if source is not None else ServiceJobSource(self)

    # -- the parts, made when first needed (a CLI command needs no telemetry) ------------------

    @property
    def manager(self) -> JobManager:
        with self._lock:
            if self._manager is None:
                self._manager = JobManager(self.ctl, self._history)
                if getattr(self.ctl, "memory", False) is None:  # hosts found out of reach, for
                    self.ctl.memory = self._manager.history  # the next command (a HostLinks's)
                if self._owner:
                    self._manager.owner = self._owner
                if self.notify_config is not None and self.notify_config.sends:
                    self.notifier = Notifier(self.notify_config, self._manager.history, controller=self.kind)
                    self.notifier.attach_jobs()
            return self._manager

    @property
    def queue(self) -> JobQueue:
        m = self.manager
        with self._lock:
            if self._queue is None:
                self._queue = JobQueue(m, self.queue_policy)
            return self._queue

    @property
    def sweeps(self) -> SweepRunner:
        m = self.manager
        q = self.queue
        with self._lock:
            if self._sweeps is None:
                self._sweeps = SweepRunner(m, q)
                if self.notifier is not None:
                    self.notifier.attach_sweeps(self._sweeps.store)
            return self._sweeps

    @property
    def pipelines(self) -> PipelineRunner:
        m = self.manager
        q = self.queue
        sw = self.sweeps
        with self._lock:
            if self._pipelines is None:
                self._pipelines = PipelineRunner(m, q, sw)
                if self.notifier is not None:
                    self.notifier.attach_pipelines(self._pipelines.store)
            return self._pipelines

    def _after_round(self) -> None:
        """What the poller does after supervising each round: start queued jobs that fit now,
        then advance the pipelines (which submit their steps' jobs and sweeps) and the sweeps
        (which queue their trials)."""
        self.queue.advance()
        self._sync_drains()
        stepping = self.pipelines.tick()
        busy = self.sweeps.tick() or stepping
        if self._watch is not None and hasattr(self._watch, "interval"):
            # A trial that ends is noticed within a round: rounds come faster while sweeps run.
            self._watch.interval = SWEEP_ROUND_S if busy else self._round_s
            if self.sweeps.started or self.pipelines.changed:
                # Trials ended and others started: more of the same wave may have ended while
                # this round started them, so the next round looks at once.
                self._watch.kick()

    def _sync_drains(self) -> None:
        """Lay the drains in force over the telemetry the faces read (when it runs)."""
        mon = self._monitor
        if mon is None:
            return
        drains = self.manager.healer.current_drains()
        mon.state.set_drains({(d.host, d.gpu): f"drained by {d.who}" + (f": {d.reason}" if d.reason else "")
                              for d in drains})

    @property
    def monitor(self) -> Any:
        with self._lock:
            if self._monitor is None:
                from tui.control.monitor import Monitor

                self._monitor = Monitor(self.ctl, rate_hz=self.telemetry_hz)
            return self._monitor

    @property
    def watch(self) -> Any:
        m = self.manager
        with self._lock:
            if self._watch is None:
                self._watch = JobWatch(m)
                self._round_s = self._watch.interval
            if getattr(self._watch, "after_round", "absent") is None:
                self._watch.after_round = self._after_round
            if getattr(self._watch, "on_records", "absent") is None:
                self._watch.on_records = self._feed_sweeps
            if getattr(self._watch, "gpu_util", "absent") is None:
                self._watch.gpu_util = self._gpu_util
            if getattr(self._watch, "read_bps", "absent") is None:
                self._watch.read_bps = self._read_bps
            return self._watch

    # Telemetry for the jobs' signals (input-bound): none unless the telemetry readers run.
    def _telemetry_hosts(self, placement: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], Any]]:
        mon = self._monitor  # made when telemetry starts; never started here for the signals' sake
        if mon is None:
            return []
        hosts = mon.state.hosts
        return [(n, hosts[n["host"]]) for n in placement if n.get("host") in hosts]

    def _gpu_util(self, placement: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
        """host -> mean utilization (%) of the job's GPUs there, from their latest samples."""
        out: dict[str, float | None] = {}
        for node, h in self._telemetry_hosts(placement):
            if h.stale:
                continue
            utils = [(g.sample or {}).get("utilization_pct") for i in node.get("gpus") or ()
                     if (g := h.gpus.get(int(i))) is not None]
            known = [float(u) for u in utils if u is not None]
            out[node["host"]] = sum(known) / len(known) if known else None
        return out

    def _read_bps(self, placement: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
        """host -> the bytes per second its disks read now (its latest telemetry sample)."""
        out: dict[str, float | None] = {}
        for node, h in self._telemetry_hosts(placement):
            v = (h.host_sample or {}).get("disk_read_bps")
            if not h.stale and v is not None:
                out[node["host"]] = float(v)
        return out

    def _quiet(self, host: str) -> str | None:
        """Why telemetry says ``host`` is out of reach now, or None: its reader found it
        unreachable, or it has sent nothing for ``QUIET_STALE_S`` past being marked stale."""
        mon = self._monitor
        h = mon.state.hosts.get(host) if mon is not None else None
        if h is None:
            return None
        if h.status == HostStatus.DOWN and h.error_kind == "unreachable":
            return h.reason or "down"
        if h.status == HostStatus.STALE and time.monotonic() - h.status_since > QUIET_STALE_S:
            return h.reason or "stale"
        return None

    def _feed_sweeps(self, job_id: str, records: list[dict[str, Any]]) -> None:
        self.sweeps.feed(job_id, records)

    @property
    def state(self) -> ClusterState:
        return self.monitor.state

    def start(self, *, telemetry: bool = True, jobs: bool = True) -> ControllerService:
        """Start the background parts: telemetry readers, and the job poller that supervises
        live jobs and advances the queue."""
        if self._started:
            return self
        self._started = True
        if telemetry:
            self.monitor.start()
            self.ctl.quiet = self._quiet  # requests learn from telemetry which hosts went quiet
        if jobs:
            self.watch.start()
        return self

    def close(self) -> None:
        if self._watch is not None and hasattr(self._watch, "stop"):
            self._watch.stop()
        if self._pipelines is not None:
            self._pipelines.close()
        if self._sweeps is not None:
            self._sweeps.close()
        if self._monitor is not None and hasattr(self._monitor, "stop"):
            self._monitor.stop(timeout=2.0)
        self.ctl.close()
        self.close_notifier()

    def close_notifier(self) -> None:
        """Send the notifications still queued, then stop sending."""
        if self.notifier is not None:
            self.notifier.close()

    def info(self) -> ServiceInfo:
        import importlib.metadata
        import os

        try:
            version = importlib.metadata.version("rigdeck")
        except importlib.metadata.PackageNotFoundError:
            version = "dev"
        return ServiceInfo(
            kind=self.kind, host=self.host, pid=os.getpid(), since=self.since, version=version,
            history=str(self.manager.history.path), queue_advances=self.kind == "server",
        )

    # -- hosts -----------------------------------------------------------------------------

    def probe(self, names: Sequence[str] | None = None) -> list[HostReport]:
        """Each host as it answers now. A drained GPU carries its ``drain`` (who, when, why) and
        reads ``health`` "drained", unless its agent calls it unhealthy: that stays what it reads
        until the fault is gone."""
        reports = self.ctl.probe(names)
        drains = [Drain.from_dict(d) for d in self.manager.history.drains()]
        for r in reports:
            for g in r.gpus:
                d = drained(drains, r.name, g.get("index"))
                g["drain"] = d.to_dict() if d is not None else None
                if d is None:
                    continue
                if g.get("health") != UNHEALTHY:
                    g["health"] = DRAINED
                    g["health_reason"] = f"drained by {d.who}" + (f": {d.reason}" if d.reason else "")
        return reports

    # -- drains: GPUs and hosts kept out of placement ------------------------------------------

    def drains(self) -> list[dict[str, Any]]:
        return [Drain.from_dict(d).to_dict() for d in self.manager.history.drains()]

    def drain(self, targets: Sequence[str], reason: str = "", now: bool = False, who: str = "") -> list[dict[str, Any]]:
        """Keep ``HOST`` or ``HOST:GPU`` targets out of placement (all checked before any is
        drained); ``now`` also stops the jobs running there and restarts them elsewhere (from
        their checkpoints, counted against their restarts). Returns every drain in force."""
        m = self.manager
        parsed = [parse_target(t, self.ctl.inventory.names) for t in targets]
        for host, gpu in parsed:
            m.history.drain(host, gpu, reason, who or _user(), source="operator", now=now)
            m.slurm_drain(host, gpu, reason)  # on a Slurm cluster, Slurm's node drained too
        m.healer.drains_read = 0.0  # read again at the next look
        if now:
            hit = {h for h, _ in parsed}
            for rec in m.history.list(limit=500):
                if rec["state"] == RUNNING and hit & {n["host"] for n in rec.get("placement") or []}:
                    m.supervise_once(rec)  # the healer sees the drain and moves the job
        return self.drains()

    def undrain(self, targets: Sequence[str]) -> list[dict[str, Any]]:
        """Put ``HOST`` or ``HOST:GPU`` back into placement; the hosts forget the faults they
        remembered for those GPUs (a fault still there shows again at once). The drains removed."""
        m = self.manager
        parsed = [parse_target(t, self.ctl.inventory.names) for t in targets]
        removed: list[dict[str, Any]] = []
        for host, gpu in parsed:
            removed += m.history.undrain(host, gpu)
            try:
                self.ctl.agent(host).gpu_health_clear(gpus=None if gpu is None else [gpu], timeout=20)
            except Exception as e:  # an unreachable host forgets nothing: its next sample decides
                log.warning("%s: could not clear its remembered GPU faults: %s", host, e)
            m.slurm_resume(host)  # on a Slurm cluster: its node resumed once rigdeck drains none of it
        m.healer.drains_read = 0.0
        return [Drain.from_dict(d).to_dict() for d in removed]

    def deploy(self, names: Sequence[str] | None = None) -> list[HostReport]:
        return self.ctl.deploy(names)

    def image_push(self, image: str, names: Sequence[str] | None = None,
                   progress: Callable[[str, int, int], None] | None = None) -> list[ImagePush]:
        """A container image of this machine's Podman store into each host's (tui/control/images.py);
        hosts that have it are skipped."""
        hosts = list(names) if names else list(self.ctl.inventory.names)
        unknown = [h for h in hosts if h not in self.ctl.inventory.names]
        if unknown:
            raise ImageError(f"unknown hosts {', '.join(unknown)} (the inventory has "
                             f"{', '.join(self.ctl.inventory.names)})")
        return images.push(self.ctl, self.manager.code_store, image, hosts, progress)

    def exec(self, hosts: Sequence[str], argv: list[str], timeout_s: float) -> dict[str, Any]:
        """``argv`` on every host at once, through each agent, with no shell."""
        return dict(self.ctl.agents(list(hosts)).exec(argv=list(argv), timeout_s=timeout_s, timeout=timeout_s + 30))

    def slurm_read(self, argv: Sequence[str]) -> dict[str, Any]:
        """``argv``, one of ``SERVER_READS`` exactly (anything else is refused before it runs), on
        the ``[slurm]`` login host through its agent, with no shell: {login: the agent's answer}
        (what kept the host from answering as ``error``)."""
        from tui.model.slurm import READ_TIMEOUT_S, SERVER_READS, SlurmReadError, login_of

        if not isinstance(argv, (list, tuple)) or tuple(argv) not in SERVER_READS:
            raise ValueError(f"slurm_read: expected one of {[' '.join(a) for a in SERVER_READS]}, got {argv!r:.200}")
        try:
            login = login_of(self.ctl.inventory)
        except SlurmReadError as e:
            raise ValueError(f"slurm_read: {e}") from None
        answers = self.exec([login], list(argv), READ_TIMEOUT_S)
        answer = answers.get(login)
        if not isinstance(answer, dict):
            answer = {"exit_code": None, "stdout": "", "stderr": "", "error": f"{type(answer).__name__}: {answer}"}
        return {login: answer}

    def reconnect(self, host: str) -> None:
        if self._monitor is not None:
            self._monitor.reconnect(host)

    def trust_host_key(self, host: str, fingerprint: str) -> str:
        return self.ctl.trust_host_key(host, fingerprint)

    # -- jobs: what the app shows ------------------------------------------------------------

    def jobs_snapshot(self) -> JobsSnapshot:
        return self.source.snapshot()

    def job_detail(self, job_id: str) -> JobDetail | None:
        return self.source.detail(job_id)

    def select(self, job_id: str | None, who: str | None = None) -> None:
        if who is not None and isinstance(self.source, ServiceJobSource):
            self.watch.select(job_id, who=who)
        else:
            self.source.select(job_id)

    def stop_plan(self, job_id: str) -> StopPlan:
        return self.source.stop_plan(job_id)

    # -- jobs: commands ----------------------------------------------------------------------

    def launch(self, spec: JobSpec, *, queue: bool = True, job_id: str | None = None,
               user: str | None = None, env_values: Mapping[str, str] | None = None) -> JobView:
        """Start ``spec`` now, or queue it when it does not fit now (``queue``). ``user``: who
        owns it (default: this process's account); on a server, the session's person (never what a client
        claims); set by in-process callers otherwise. ``env_values``: its ``env_from_file``'s
        values as they came with the launch (a server's), held in memory until its first start."""
        if spec.code is not None and spec.code.tree is None:
            # The hosts are connected to while the files are read: placement asks them next.
            self.manager.ctl.reach(self.queue.candidates(spec))
        spec = self.manager.snapshot_code(spec)  # reading the files holds up no supervision
        if env_values is not None:
            job_id = job_id or new_job_id(spec.name)
            self.manager.env_values[job_id] = dict(env_values)
        try:
            with self._exclusive():
                view = self.queue.submit(spec, queue=queue, job_id=job_id, user=user)
        except BaseException:
            if job_id is not None:
                self.manager.env_values.pop(job_id, None)
            raise
        if view.state != QUEUED:
            self.manager.env_values.pop(view.job_id, None)  # started (its hosts keep them) or ended
        if view.state == QUEUED:
            view = self._after_stops(view)
        if self._watch is not None:
            if view.state != QUEUED:
                self._watch.select(view.job_id)
            self._watch.kick()
        return view

    def _after_stops(self, view: JobView) -> JobView:
        """A job queued while jobs on its hosts are being stopped (``stop --no-wait``, a stop
        from another controller) starts as soon as they are gone: this launch follows those
        stops to their end (no process, no GPU claim left), then advances the queue, and
        returns the job started, or still queued saying why. Waits no longer than the stops'
        grace periods allow (their end is forced after the grace)."""
        stopping = [r for r in self.manager.stopping_on(self.queue.candidates(view.spec))
                    if r["job_id"] != view.job_id]
        if not stopping:
            return view
        now = time.time()
        until = now
        for r in stopping:
            asked = [e for e in r.get("events") or [] if e.get("event") == "stop requested"]
            grace = float(asked[-1].get("grace_s") or 30) if asked else float(r["spec"].get("grace_s", 30))
            since = float(asked[-1].get("time") or now) if asked else now
            until = max(until, since + grace + 30)
        ids = [r["job_id"] for r in stopping]
        self.manager.history.update(view.job_id, waiting=f"waiting for {', '.join(ids)} to stop "
                                                         "(it starts once their GPU claims are released)")
        began = time.monotonic()
        left = self.manager.await_stopped(ids, timeout=min(90.0, max(5.0, until - now)))
        if not left:
            with self._exclusive():
                started = self.queue.advance()
            if view.job_id in started:
                self.manager.history.add_event(view.job_id, {
                    "event": "waited for stop", "jobs": ids, "waited_s": round(time.monotonic() - began, 3)})
        return self.manager.view(view.job_id, live=False)

    def _exclusive(self) -> Any:
        """Held while a command starts jobs: never interleaved with the poller's supervision and
        queue rounds."""
        import contextlib

        lock = getattr(self._watch, "_jm_lock", None)
        return lock if lock is not None else contextlib.nullcontext()

    # -- sweeps ------------------------------------------------------------------------------

    def sweep(self, spec: JobSpec, user: str | None = None) -> SweepDetail:
        """Start a sweep: record it (``user``: its owner) and queue its first trials."""
        spec = self.manager.snapshot_code(spec)  # every trial runs this version of the files
        with self._exclusive():
            detail = self.sweeps.create(spec, user=user)
        if self._watch is not None:
            self._watch.kick()
        return detail

    def sweep_rows(self) -> list[SweepRow]:
        return self.sweeps.rows()

    def sweep_detail(self, ref: str) -> SweepDetail:
        return self.sweeps.detail(ref)

    def sweep_stop(self, ref: str, user: str | None = None) -> SweepDetail:
        with self._exclusive():
            detail = self.sweeps.stop(ref, user=user)
        if self._watch is not None:
            self._watch.kick()
        return detail

    def sweep_stop_trial(self, ref: str, number: int, user: str | None = None) -> SweepDetail:
        detail = self.sweeps.stop_trial(ref, number, user=user)
        if self._watch is not None:
            self._watch.kick()
        return detail

    def sweep_wait(self, ref: str, timeout: float | None = None, poll_s: float = 1.0) -> Iterator[SweepDetail]:
        """The sweep's detail each time a trial changes state, until the sweep ends. Embedded,
        this process advances it meanwhile (its poller supervises the trials)."""
        if self.kind == "embedded":
            self.start(telemetry=False, jobs=True)  # nothing more when already started
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            detail = self.sweeps.detail(ref)
            key = tuple((t.number, t.state) for t in detail.trials) + (detail.row.state,)
            if key != last:
                last = key
                yield detail
            if detail.row.state in ("completed", "stopped", "failed"):
                return
            if deadline is not None and time.monotonic() > deadline:
                return
            time.sleep(poll_s)

    # -- doctor ------------------------------------------------------------------------------

    def doctor(self, hosts: Sequence[str] | None = None, checks: Sequence[str] | None = None) -> DoctorReport:
        """Run the doctor's checks (tui.control.doctor): measurement jobs through the queue, and
        the per-host checks. Embedded, this process supervises the jobs meanwhile."""
        from tui.control.doctor import run_doctor

        return run_doctor(self, hosts, checks)

    # -- pipelines ---------------------------------------------------------------------------

    def pipeline(self, spec: Any, user: str | None = None) -> PipelineDetail:
        """Start a pipeline: every step's code is snapshotted now (each step runs the files as
        they are at submission), the pipeline recorded and its first steps submitted."""
        import dataclasses

        from tui.control.pipelines import spec_files, workdir_key

        steps = tuple(dataclasses.replace(s, job=self.manager.snapshot_code(s.job)) for s in spec.steps)
        spec = dataclasses.replace(spec, steps=steps)
        skip = spec_files(spec)  # reading files holds up no supervision
        keys = {s.name: workdir_key(s.job, self.manager.code_store, skip) for s in spec.steps}
        with self._exclusive():
            detail = self.pipelines.create(spec, code_keys=keys, user=user)
        if self._watch is not None:
            self._watch.kick()
        return detail

    def pipeline_rows(self) -> list[PipelineRow]:
        return self.pipelines.rows()

    def pipeline_detail(self, ref: str) -> PipelineDetail:
        return self.pipelines.detail(ref)

    def pipeline_stop(self, ref: str, user: str | None = None) -> PipelineDetail:
        with self._exclusive():
            detail = self.pipelines.stop(ref, user=user)
        if self._watch is not None:
            self._watch.kick()
        return detail

    def pipeline_retry(self, ref: str, step: str) -> PipelineDetail:
        with self._exclusive():
            detail = self.pipelines.retry(ref, step)
        if self._watch is not None:
            self._watch.kick()
        return detail

    def pipeline_wait(self, ref: str, timeout: float | None = None, poll_s: float = 1.0) -> Iterator[PipelineDetail]:
        """The pipeline's detail each time a step changes state, until it ends. Embedded, this
        process advances it meanwhile."""
        if self.kind == "embedded":
            self.start(telemetry=False, jobs=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            detail = self.pipelines.detail(ref)
            key = tuple((s.name, s.state, s.attempt) for s in detail.steps) + (detail.row.state,)
            if key != last:
                last = key
                yield detail
            if detail.row.state in PIPELINE_FINAL:
                return
            if deadline is not None and time.monotonic() > deadline:
                return
            time.sleep(poll_s)

    def stop(self, ref: str, grace_s: float | None = None, *, yes: bool = False,
             wait: bool = True, user: str | None = None) -> JobView:
        """Stop the job; ``user``: who stops it (default: the local account), recorded."""
        view = self.manager.stop(ref, grace_s=grace_s, wait=wait, yes=yes, user=user)
        if self._watch is not None:
            self._watch.kick()
        return view

    def retry(self, ref: str, *, queue: bool = True, user: str | None = None) -> JobView:
        """Launch an ended job again as a new job: its recorded spec (the same code snapshot),
        owned by the same person (their work, their share and quotas); ``user``: who asked,
        recorded on both jobs. JobError for a job that has not ended."""
        rec = self.manager.resolve(ref).rec
        old = str(rec["job_id"])
        if rec.get("state") not in TERMINAL:
            raise JobError(f"job {old} is {rec.get('state')}: only an ended job is retried (stop it first)")
        who = user or local_user()
        view = self.launch(JobSpec.from_dict(rec["spec"]), queue=queue, user=rec.get("user") or who)
        self.manager.history.add_event(view.job_id, {"event": "retry of", "job": old, "by": who})
        self.manager.history.add_event(old, {"event": "retried", "job": view.job_id, "by": who})
        return self.manager.view(view.job_id, live=False)

    def reprioritise(self, ref: str, priority: int, *, user: str | None = None) -> JobView:
        """Set the priority of a job that has not ended: a waiting one's place in line, a running
        one's standing against preemption. ``user``: who changed it, recorded."""
        if isinstance(priority, bool) or not isinstance(priority, int) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
            raise JobError(f"priority: expected an integer {PRIORITY_MIN}..{PRIORITY_MAX}, got {priority!r}")
        with self._exclusive():
            rec = self.manager.resolve(ref).rec
            job_id = str(rec["job_id"])
            if rec.get("state") in TERMINAL:
                raise JobError(f"job {job_id} has ended ({rec.get('state')}): its priority no longer matters")
            spec = dict(rec.get("spec") or {})
            before = int(spec.get("priority") or 0)
            spec["priority"] = priority
            self.manager.history.update(job_id, spec=spec, priority=priority)
            self.manager.history.add_event(job_id, {"event": "reprioritised", "from": before, "to": priority,
                                                    "by": user or local_user()})
        if self._watch is not None:
            self._watch.kick()
        return self.manager.view(job_id, live=False)

    def view(self, ref: str) -> JobView:
        return self.manager.view(ref)

    def list_jobs(self, refresh: bool = True) -> list[JobView]:
        return self.manager.list(refresh=refresh)

    def owner(self, kind: str, ref: str) -> tuple[str, str | None]:
        """The id of the ``kind`` ("job", "sweep", "pipeline") ``ref`` names, and its owner (None:
        none recorded). The server's permission checks ask; LookupError for no such one."""
        if kind == "job":
            rec = self.manager.resolve(ref).rec
            return str(rec["job_id"]), rec.get("user")
        row = (self.sweeps.store if kind == "sweep" else self.pipelines.store).find(ref)
        return str(row[f"{kind}_id"]), row.get("user")

    def usage(self, by: str = "user", since: float | None = None) -> UsageReport:
        """GPU hours, jobs, preemptions and goodput by user, group or job (after ``since``),
        from the jobs' recorded GPU time (``tui.model.usage``)."""
        now = time.time()
        recs = self.manager.history.list(limit=1_000_000)
        goodputs = self._goodputs(recs, since)
        note = None
        if getattr(self.ctl.inventory, "slurm", None) is not None:
            slurm, note = self._slurm_usage(by, since, now, goodputs)
            if slurm is not None:
                return slurm
        report = usage_report(recs, by=by, since=since, now=now, groups=self.groups, goodputs=goodputs)
        return dataclasses.replace(report, note=note) if note else report

    def _slurm_usage(self, by: str, since: float | None, now: float,
                     goodputs: Mapping[str, float | None]) -> tuple[UsageReport | None, str | None]:
        """On a Slurm cluster, the figures of Slurm's own accounting where ``sacct`` answers
        (slurmdbd keeps it): every user's Slurm jobs, rigdeck's among them (with their goodput).
        Where it does not: no report, and why (the jobs rigdeck launched are counted then)."""
        from tui.model.slurm import (
            SlurmParseError,
            SlurmReadError,
            parse_sacct,
            run_on_login,
            sacct_args,
            sacct_usage_records,
        )

        try:
            login, out = run_on_login(self.exec, self.ctl.inventory, sacct_args(None if since is None else now - since),
                                      "Slurm's accounting")
            jobs = parse_sacct(out)
        except (SlurmReadError, SlurmParseError) as e:
            return None, f"{e}: the figures are the jobs rigdeck launched"
        report = usage_report(sacct_usage_records(jobs), by=by, since=since, now=now, groups=self.groups,
                              goodputs=goodputs)
        return dataclasses.replace(report, source=f"sacct on {login}"), None

    def _goodputs(self, recs: Sequence[Mapping[str, Any]], since: float | None) -> dict[str, float | None]:
        """Each started job's goodput ratio, from its metrics (read from its hosts, several jobs at
        once); an ended job's is kept once read."""
        from concurrent.futures import ThreadPoolExecutor

        out: dict[str, float | None] = {}
        todo = []
        for rec in recs:
            job_id = str(rec["job_id"])
            if not rec.get("started") or (since is not None and float(rec.get("ended") or time.time()) < since):
                continue
            if job_id in self._goodput_cache:
                out[job_id] = self._goodput_cache[job_id]
            else:
                todo.append(rec)

        def one(rec: Mapping[str, Any]) -> float | None:
            try:
                gp = self.manager.health(rec)[1]
            except Exception as e:  # hosts gone, files collected: no figure, never an error
                log.info("goodput of %s: %s", rec["job_id"], e)
                return None
            return gp.ratio if gp is not None else None

        if todo:
            with ThreadPoolExecutor(max_workers=min(8, len(todo)), thread_name_prefix="goodput") as pool:
                for rec, ratio in zip(todo, pool.map(one, todo), strict=True):
                    out[str(rec["job_id"])] = ratio
                    if rec.get("state") in TERMINAL:
                        self._goodput_cache[str(rec["job_id"])] = ratio
        return out

    def queue_entries(self) -> list[QueueEntry]:
        return self.queue.entries()

    def metrics(self, ref: str) -> list[dict[str, Any]]:
        return self.manager.metrics(ref)

    def exposition(self) -> str:
        """What this controller knows now in Prometheus' text format (tui.model.promexport): the
        telemetry's hosts and GPUs, the jobs its poller follows (as their views read now), the
        queue. Nothing is asked of the hosts here: a scrape reads what is already known."""
        source = self.source
        snap = source.snapshot()
        jobs = [v for r in snap.rows if (v := source.detail(r.job_id)) is not None]
        return cluster_exposition(
            self.state.snapshot(), jobs, self.queue_entries(), now=time.time(), monotonic=time.monotonic(),
            host_users={h.name: h.user for h in self.inventory.hosts}, jobs_polled_at=snap.polled_at,
        ).text()

    def log_chunks(self, ref: str, rank: int | None = None, follow: bool = False,
                   binary: bool = False) -> Iterator[tuple[str, int, Any, bool]]:
        return self.manager.log_chunks(ref, rank=rank, follow=follow, binary=binary)

    def tensorboard_pull(self, ref: str, have: list[list[Any]] | None = None) -> Iterator[dict[str, Any]]:
        yield from self.manager.tensorboard_pull(ref, have)

    def collect_garbage(self, hosts: Sequence[str] | None = None) -> dict[str, Any]:
        return self.manager.collect_garbage(hosts)

    def wait(self, ref: str, timeout: float | None = None) -> Iterator[JobView]:
        """The job's view each time its state or restart count changes, until it ends. Embedded,
        this process supervises it meanwhile (and advances the queue, for a queued job); a
        server supervises its jobs anyway."""
        jm = self.manager
        job_id = jm.record(ref)["job_id"]
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            rec = jm.record(job_id)
            if rec["state"] == QUEUED and self.kind == "embedded":
                self.queue.advance()
            elif rec["state"] not in TERMINAL and self.kind == "embedded":
                jm.history.try_lease(job_id, jm.owner, 60.0)
                jm.supervise_once(rec)
            rec = jm.record(job_id)
            if (rec["state"], rec["restarts"]) != last:
                last = (rec["state"], rec["restarts"])
                yield jm.view(job_id, live=False)
            if rec["state"] in TERMINAL:
                return
            if deadline is not None and time.monotonic() > deadline:
                return
            time.sleep(0.5)


class ServiceJobSource:
    """The app's job source over a service: its JobWatch, launches through the queue."""

    def __init__(self, service: ControllerService):
        self.svc = service

    def start(self) -> ServiceJobSource:
        self.svc.watch.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        if self.svc._watch is not None:
            self.svc._watch.stop(timeout)

    def snapshot(self) -> JobsSnapshot:
        return self.svc.watch.snapshot()

    def detail(self, job_id: str) -> JobDetail | None:
        return self.svc.watch.detail(job_id)

    def select(self, job_id: str | None) -> None:
        self.svc.watch.select(job_id)

    def kick(self) -> None:
        self.svc.watch.kick()

    def stop_plan(self, job_id: str) -> StopPlan:
        return self.svc.watch.stop_plan(job_id)

    def launch(self, spec: JobSpec, user: str | None = None, env_values: Mapping[str, str] | None = None) -> str:
        return self.svc.launch(spec, user=user, env_values=env_values).job_id

    def stop_job(self, job_id: str, user: str | None = None) -> str:
        return str(self.svc.stop(job_id, user=user).state)

    def inventory_hosts(self) -> list[str]:
        return list(self.svc.inventory.names)
