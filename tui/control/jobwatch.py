"""What the app shows about jobs, fetched off the UI thread: the fetch side of the job panels.

``JobWatch`` runs one poller thread. Each round it lists the job history, applies the gang rules
to every live job (``JobManager.supervise_once``, as every controller that looks at a job does),
reads new metrics records from each host by byte offset (never the whole file again) and, for
the job the user has open, new log lines. It folds them into plain per-job state (loss by step,
step rate, ranks, checkpoint saves and owner moves) and publishes immutable snapshots. The app
samples ``snapshot()`` on a timer; nothing here knows about Textual.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from tui.control.healing import with_reruns
from tui.control.reader import JobReader, log_ranks
from tui.model.diagnose import Signal, StepTimes, signals
from tui.model.health import Goodput, Incident, first_started, goodput
from tui.model.jobspec import JobSpec
from tui.model.jobstate import QUEUED, TERMINAL
from tui.model.jobview import (  # noqa: F401  (the views this poller builds; importers find them here too)
    LOG_LIMIT,
    CheckpointSave,
    CheckpointView,
    JobDetail,
    JobRow,
    JobSource,
    JobsSnapshot,
    JobView,
    LogBuffer,
    Owner,
    OwnerMove,
    Progress,
    StopPlan,
    job_view,
    owner_summary,
    rank_rows,
)
from tui.model.poolview import pools_view
from tui.model.stages import StagesFold, checkpointing_of, plan_from_events
from tui.remote.transport import TransportError

log = logging.getLogger(__name__)

RATE_WINDOW_S = 30.0
LOG_CHUNKS_PER_ROUND = 8  # per rank, so one chatty rank cannot hold up a round
LINE_SHOWN = 4096  # characters of one log line kept for the log view; the rest is counted


# ---------------------------------------------------------------------------------------------
# Folding metrics records


class MetricsFold:
    """Loss by step, step timing and checkpoint events of one job, from metrics records."""

    def __init__(self) -> None:
        self.loss: dict[int, tuple[int, float]] = {}  # step -> (rank that said it, loss)
        self.steps: list[int] = []  # sorted
        self.version = 0
        self.lead_rank: int | None = None
        self.timing: deque[tuple[float, int]] = deque(maxlen=4096)  # (time, step) of the lead rank
        self.saves: dict[tuple[int, int | None, str | None], CheckpointSave] = {}
        self.moves: list[OwnerMove] = []
        self._points: tuple[tuple[int, float], ...] | None = ()

    def apply(self, records: Iterable[Mapping[str, Any]], received_at: float) -> None:
        changed = False
        for r in records:
            event = r.get("event")
            if event == "checkpoint":
                self._checkpoint(r)
                continue
            if event == "checkpoint_owner":
                self.moves.append(
                    OwnerMove(
                        r.get("time"),
                        r.get("policy"),
                        Owner.from_json(r.get("from")),
                        Owner.from_json(r.get("to")),
                        r.get("reason"),
                    )
                )
                continue
            if event is not None:
                continue
            step, loss, rank = r.get("step"), r.get("loss"), r.get("rank")
            if not isinstance(step, int) or isinstance(step, bool):
                continue
            if isinstance(loss, (int, float)) and not isinstance(loss, bool):
                rank_i = rank if isinstance(rank, int) else 1 << 30
                have = self.loss.get(step)
                if have is None:
                    bisect.insort(self.steps, step)
                if have is None or rank_i <= have[0]:
                    self.loss[step] = (rank_i, float(loss))
                    changed = True
            if isinstance(rank, int) and (self.lead_rank is None or rank < self.lead_rank):
                self.lead_rank = rank
                self.timing.clear()
            if rank == self.lead_rank or rank is None:
                t = r.get("time")
                self.timing.append((float(t) if isinstance(t, (int, float)) else received_at, step))
        if changed:
            self.version += 1
            self._points = None

    def _checkpoint(self, r: Mapping[str, Any]) -> None:
        owner = Owner.from_json(r.get("owner"))
        step = r.get("step")
        if not isinstance(step, int):
            return
        key = (step, owner.rank, owner.host)
        prev = self.saves.get(key)
        save = CheckpointSave(
            step=step,
            status=str(r.get("status") or "?"),
            owner=owner,
            bytes=r.get("bytes"),
            seconds=r.get("seconds"),
            time=r.get("time"),
            path=r.get("path"),
            error=r.get("error"),
        )
        if prev is not None:
            self.saves[key] = replace(save, time=prev.time or save.time)  # keep its start time
        else:
            self.saves[key] = save

    @property
    def points(self) -> tuple[tuple[int, float], ...]:
        if self._points is None:
            self._points = tuple((s, self.loss[s][1]) for s in self.steps)
        return self._points

    @property
    def last(self) -> tuple[int | None, float | None]:
        if not self.steps:
            return None, None
        s = self.steps[-1]
        return s, self.loss[s][1]

    def step_rate(self) -> float | None:
        """Steps per second of the lead rank over the last ``RATE_WINDOW_S`` of its records."""
        if len(self.timing) < 2:
            return None
        t1, s1 = self.timing[-1]
        t0, s0 = t1, s1
        for t, s in reversed(self.timing):
            if t1 - t > RATE_WINDOW_S:
                break
            t0, s0 = t, s
        if t1 <= t0 or s1 <= s0:
            return None
        return (s1 - s0) / (t1 - t0)


def expected_owners(
    policy: str, ranks: Sequence[Mapping[str, Any]], placement: Sequence[Mapping[str, Any]]
) -> tuple[tuple[Owner, ...], OwnerMove | None]:
    """Who the policy makes write checkpoints, from the ranks the job runs (or its placement)."""
    rows = list(ranks)
    if not rows:  # not started yet: derive ranks from the placement
        rank = 0
        for node in placement:
            gpus = list(node.get("gpus") or [])
            for local in range(int(node.get("slots") or 0)):
                rows.append(
                    {
                        "rank": rank,
                        "host": node.get("host"),
                        "local_rank": local,
                        "gpu": gpus[local] if local < len(gpus) else None,
                    }
                )
                rank += 1

    def owner(r: Mapping[str, Any]) -> Owner:
        gpu = r.get("gpu")
        return Owner(r.get("rank"), r.get("host"), gpu if gpu is not None else r.get("local_rank"))

    rank0 = [owner(r) for r in rows if r.get("rank") == 0]
    if policy == "rank0":
        return tuple(rank0), None
    if policy == "per-node":
        return tuple(owner(r) for r in rows if r.get("local_rank") == 0), None
    if policy == "all":
        return tuple(owner(r) for r in rows), None
    if policy.startswith("host:") and "/gpu:" in policy:
        host, _, gpu_s = policy[len("host:") :].partition("/gpu:")
        try:
            gpu = int(gpu_s)
        except ValueError:
            return (), None
        hosts = {r.get("host") for r in rows}
        if host not in hosts:
            move = OwnerMove(
                None,
                policy,
                Owner(None, host, gpu),
                rank0[0] if rank0 else Owner(0, None, None),
                f"host {host} not in this run",
            )
            return tuple(rank0), move
        return tuple(
            owner(r)
            for r in rows
            if r.get("host") == host
            and (r.get("gpu") if r.get("gpu") is not None else r.get("local_rank")) == gpu
        ), None
    return (), None


def checkpoint_view(
    spec: Mapping[str, Any],
    fold: MetricsFold,
    ranks: Sequence[Mapping[str, Any]],
    placement: Sequence[Mapping[str, Any]],
) -> CheckpointView:
    ck = spec.get("checkpoint") or {}
    policy = str(ck.get("owner") or "rank0")
    owners, predicted_move = expected_owners(policy, ranks, placement)
    saves = sorted(fold.saves.values(), key=lambda s: (s.time or 0.0, s.step, s.owner.rank or 0))
    if saves:
        # The owners are whoever wrote the newest step (they can differ from the policy's
        # prediction after a restart without the named host).
        newest = max(s.step for s in saves)
        seen = tuple(
            sorted(
                {s.owner for s in saves if s.step == newest},
                key=lambda o: (o.rank if o.rank is not None else -1, o.host or ""),
            )
        )
        owners = seen or owners
    done = [s for s in saves if s.status == "done"]
    last_done = max(done, key=lambda s: (s.step, s.time or 0.0)) if done else None
    moves = tuple(fold.moves) or ((predicted_move,) if predicted_move else ())
    # An owner on a GPU of a host whose GPUs the placement says are simulated is labelled so.
    sim = {str(n.get("host")) for n in placement if n.get("simulated")}

    def marked(o: Owner) -> Owner:
        return replace(o, simulated=True) if o.gpu is not None and o.host in sim and not o.simulated else o

    return CheckpointView(
        policy=policy,
        directory=ck.get("dir"),
        owners=tuple(marked(o) for o in owners),
        last_done=replace(last_done, owner=marked(last_done.owner)) if last_done is not None else None,
        saves=tuple(replace(x, owner=marked(x.owner)) for x in saves),
        moves=tuple(replace(m, from_=marked(m.from_), to=marked(m.to)) for m in moves),
        failed=sum(1 for s in saves if s.status == "failed"),
    )


# ---------------------------------------------------------------------------------------------
# One job's tracked state


@dataclass
class _Track:
    rec: dict[str, Any]
    fold: MetricsFold = field(default_factory=MetricsFold)
    times: StepTimes = field(default_factory=StepTimes)  # recent step timing per rank
    signals: tuple[Signal, ...] = ()
    stages: StagesFold = field(default_factory=StagesFold)  # a [model_parallel] job's plan and stages
    reader: JobReader | None = None  # the job's offsets on its hosts; made at its first read
    logs: LogBuffer = field(default_factory=LogBuffer)
    states: dict[str, Any] = field(default_factory=dict)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    unreachable: tuple[str, ...] = ()
    final: bool = False  # terminal and read once more after it ended: nothing left to fetch
    logs_complete: bool = False  # final, and every log read to its end
    incidents: tuple[Incident, ...] = ()  # its failures and what they cost (the history's)
    steps: list[dict[str, Any]] = field(default_factory=list)  # (rank, step, time, restart) of each record: goodput

    def keep_steps(self, records: Sequence[Mapping[str, Any]]) -> None:
        """What goodput needs of the records, and no more (a long job reports many steps)."""
        self.steps.extend({"rank": r.get("rank"), "step": r["step"], "time": r.get("time"),
                           "restart": r.get("restart")}
                          for r in records if r.get("event") is None and r.get("step") is not None)

    def goodput(self, now: float | None = None) -> Goodput | None:
        """Goodput until the job ended, or until ``now`` (the poller's clock) while it runs."""
        first = first_started(self.rec)
        if first is None:
            return None
        until = self.rec.get("ended") or (time.time() if now is None else now)
        return goodput(self.steps, started=first, now=float(until))

    def row(self) -> JobRow:
        """The job's line in the jobs table: its view's head, without the per-kind panels."""
        return self.view(panels=False).row

    def detail(self, state_dirs: Mapping[str, str] | None = None, now: float | None = None) -> JobView:
        return self.view(state_dirs, now=now)

    def view(self, state_dirs: Mapping[str, str] | None = None, panels: bool = True,
             now: float | None = None) -> JobView:
        """The job's view (``job_view``, as ``rigdeck status`` builds it) with what this poller
        folded from its metrics: loss curve, step rate, checkpoints, signals, stages, logs."""
        rec = self.rec
        spec = rec.get("spec") or {}
        step, loss = self.fold.last
        stages = (self.stages.view(plan_from_events(rec.get("events") or ()), checkpointing_of(spec))
                  if panels else None)
        progress = Progress(
            step=step,
            loss=loss,
            step_rate=self.fold.step_rate(),
            points=self.fold.points,
            points_version=self.fold.version,
            checkpoints=checkpoint_view(spec, self.fold, self.ranks, rec.get("placement") or []),
            signals=self.signals,
            stages=stages,
        )
        # The history keeps when each failure happened; what it cost in steps computed twice is
        # read from the steps (as rigdeck status does).
        incidents = with_reruns(self.incidents, self.steps) if panels and self.incidents else self.incidents
        return job_view(rec, self.states, unreachable=self.unreachable, ranks=self.ranks, progress=progress,
                        state_dirs=state_dirs, logs=self.logs, panels=panels, incidents=incidents,
                        goodput=self.goodput(now) if panels else None)

    def diagnose(self, gpu_util: Mapping[str, float | None] | None,
                 read_bps: Mapping[str, float | None] | None = None) -> None:
        """The job's live signals from its recent step timing (none once it ended)."""
        if self.rec["state"] in TERMINAL:
            self.signals = ()
            return
        placement = self.rec.get("placement") or []
        world = sum(int(n.get("slots") or 0) for n in placement)
        self.signals = signals(self.times, spec=self.rec.get("spec") or {}, world=world,
                               gpu_util=gpu_util, read_bps=read_bps)




class JobWatch:
    """Polls jobs on its own thread; ``snapshot()`` and ``detail()`` are safe from any thread."""

    def __init__(
        self,
        jobs: Any,
        *,
        interval: float = 1.0,
        limit: int = 50,
        clock: Callable[[], float] = time.time,
    ):
        self.jobs = jobs  # a tui.control.jobs.JobManager
        self.ctl = jobs.ctl
        self.interval = interval
        self.limit = limit
        self.clock = clock
        self._lock = threading.Lock()
        self._jm_lock = threading.Lock()  # launch and supervision never interleave
        self._tracks: dict[str, _Track] = {}
        self._order: list[str] = []
        self._selected: str | None = None
        self._selections: dict[str, str] = {}  # more viewers (a server's attached faces): who -> job
        self.after_round: Callable[[], None] | None = None  # run each round, as supervision is
        # Each live job's new metrics records as the round reads them (the sweeps' objective).
        self.on_records: Callable[[str, list[dict[str, Any]]], None] | None = None
        # host -> mean utilization (%) of the GPUs a placement names there (telemetry), for the
        # input-bound signal; None: not known.
        self.gpu_util: Callable[[Sequence[Mapping[str, Any]]], Mapping[str, float | None]] | None = None
        # host -> its disk read rate now (telemetry), likewise.
        self.read_bps: Callable[[Sequence[Mapping[str, Any]]], Mapping[str, float | None]] | None = None
        self._snapshot = JobsSnapshot((), 0)
        self._kick = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.rounds = 0

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> JobWatch:
        self._thread = threading.Thread(target=self._run, name="jobwatch", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def kick(self) -> None:
        """Poll now instead of at the end of the interval."""
        self._kick.set()

    def select(self, job_id: str | None, who: str | None = None) -> None:
        """The job whose logs to follow (only open jobs' logs are fetched). ``who`` names one of
        several viewers (a server's attached faces); without it, this process's own."""
        if who is not None:
            if job_id is None:
                self._selections.pop(who, None)
            elif self._selections.get(who) != job_id:
                self._selections[who] = job_id
                self.kick()
            return
        if job_id != self._selected:
            self._selected = job_id
            self.kick()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._kick.clear()
            try:
                self.poll_once()
            except Exception as e:  # a bug must not end the poller; the app shows the error
                log.exception("job poll failed")
                with self._lock:
                    self._snapshot = replace(self._snapshot, error=f"{type(e).__name__}: {e}")
            # The next round starts after this one finished, so rounds never overlap.
            self._kick.wait(self.interval)

    # -- reading ----------------------------------------------------------------------------

    def snapshot(self) -> JobsSnapshot:
        with self._lock:
            return self._snapshot

    def detail(self, job_id: str) -> JobDetail | None:
        with self._lock:
            t = self._tracks.get(job_id)
            return t.detail(self._state_dirs(), now=self.clock()) if t is not None else None

    def _state_dirs(self) -> dict[str, str]:
        """Each inventory host's ``state_dir`` (where its agent keeps jobs); {} when unknown."""
        inventory = getattr(self.ctl, "inventory", None)
        if inventory is None:
            return {}
        return {name: inventory.get(name).state_dir for name in inventory.names}

    def inventory_hosts(self) -> list[str]:
        return list(self.ctl.inventory.names)

    def stop_plan(self, job_id: str) -> StopPlan:
        with self._lock:
            t = self._tracks.get(job_id)
            rec = t.rec if t is not None else self.jobs.record(job_id)
            ranks = list(t.ranks) if t is not None else []
        hosts: dict[str, tuple[list[int], list[int]]] = {}  # a pool job's host may have several replicas
        rank = 0
        for node in rec.get("placement") or []:
            slots = int(node.get("slots") or 0)
            mine = [
                r["rank"]
                for r in ranks
                if r.get("host") == node["host"] and r.get("rank") is not None
            ]
            if not mine:
                mine = list(range(rank, rank + slots))
            rank += slots
            have_ranks, have_gpus = hosts.setdefault(node["host"], ([], []))
            have_ranks += [r for r in mine if r not in have_ranks]
            have_gpus += [g for g in node.get("gpus") or () if g not in have_gpus]
        grace = float((rec.get("spec") or {}).get("grace_s") or 30.0)
        view = pools_view(rec)
        pools = tuple((p.role, p.replicas, p.hosts) for p in view.pools) if view is not None else ()
        return StopPlan(rec["job_id"], rec["state"],
                        tuple((h, tuple(sorted(r)), tuple(g)) for h, (r, g) in hosts.items()), grace, pools)

    # -- acting -----------------------------------------------------------------------------

    def launch(self, spec: JobSpec, user: str | None = None, env_values: Mapping[str, str] | None = None) -> str:
        """Place and start ``spec`` (raises PlacementError, JobError); returns the job id.
        ``user``: its owner (default: the local account). ``env_values``: the spec's
        ``env_from_file`` values as a client read them (None: read from the file here), held
        only until the start has taken them to the hosts."""
        from tui.control.jobs import new_job_id

        with self._jm_lock:
            job_id = new_job_id(spec.name) if env_values is not None else None
            if job_id is not None and env_values is not None:
                self.jobs.env_values[job_id] = dict(env_values)
            try:
                view = self.jobs.launch(spec, job_id=job_id, user=user)
            finally:
                if job_id is not None:
                    self.jobs.env_values.pop(job_id, None)
        self.select(view.job_id)
        self.kick()
        return str(view.job_id)

    def stop_job(self, job_id: str, user: str | None = None) -> str:
        """Stop the job on every host and wait for it to end; returns its final state."""
        self.kick()
        view = self.jobs.stop(job_id, user=user)
        self.kick()
        return str(view.state)

    # -- polling ----------------------------------------------------------------------------

    def poll_once(self) -> JobsSnapshot:
        recs = self.jobs.history.list(limit=self.limit)
        # Every job that holds GPUs is supervised, however many newer ones (a deep queue) push it
        # out of the newest ``limit``: its end must be seen for its GPUs to be given back.
        listed = {r["job_id"] for r in recs}
        recent = getattr(self.jobs.history, "recent", None)  # a stand-in history may lack it
        if recent is not None:
            recs += [r for r in recent(time.time() + 1) if r["job_id"] not in listed
                     and r["state"] not in TERMINAL and r["state"] != QUEUED]
        errors: list[str] = []
        work: list[tuple[dict[str, Any], _Track]] = []
        for rec in recs:
            with self._lock:
                track = self._tracks.get(rec["job_id"])
                if track is None:
                    track = self._tracks[rec["job_id"]] = _Track(rec)
            if track.final:
                track.rec = rec
                continue
            work.append((rec, track))
        # Every job's hosts are asked side by side: a round's length is then about one job's
        # round trips, not the sum of all of them (an ended job is noticed sooner).
        with self._jm_lock:
            looked = self._map(self._look, [rec for rec, _ in work])
        read = self._map(lambda item: self._read_metrics(item[0]["job_id"], self._hosts_ever(item[0]), item[1]),
                         [(rec_now, track) for (rec_now, _, _, _), (_, track) in zip(looked, work, strict=True)])
        for (rec, states, live, error), (_, track), records in zip(looked, work, read, strict=True):
            job_id = rec["job_id"]
            if error:
                errors.append(error)
            placement = rec.get("placement") or []
            unreachable = tuple(h for h, s in states.items() if not isinstance(s, dict))
            ranks = rank_rows(states, placement)
            if records and self.on_records is not None:
                try:
                    self.on_records(job_id, records)
                except Exception:
                    log.exception("job %s: metrics hook failed", job_id)
            with self._lock:
                track.rec = rec
                track.states = dict(states)
                track.unreachable = unreachable
                if ranks or not live:
                    track.ranks = ranks or track.ranks
                track.fold.apply(records, self.clock())
                track.keep_steps(records)
                kept = getattr(self.jobs.history, "incidents", None)  # a stand-in history may keep none
                if kept is not None and (rec.get("restarts") or track.incidents or live):
                    track.incidents = tuple(Incident.from_dict(d) for d in kept(job_id))
                plan = track.stages.add(records)
                if records or track.signals and rec["state"] in TERMINAL:
                    track.times.add(records)
                    track.diagnose(self._hint(self.gpu_util, placement, gpus=True),
                                   self._hint(self.read_bps, placement))
                # Read once more after the job ended, then never again.
                track.final = rec["state"] in TERMINAL and not live
            if plan is not None:
                self._keep_plan(rec, plan)
        if self.after_round is not None:
            with self._jm_lock:
                self.after_round()
        selected = {j for j in (self._selected, *self._selections.values()) if j}
        for job_id in selected:
            if job_id in self._tracks:
                self._read_logs(self._tracks[job_id])
        with self._lock:
            order = [r["job_id"] for r in recs]
            for job_id in list(self._tracks):
                if job_id not in order and job_id not in selected:
                    del self._tracks[job_id]
            rows = tuple(self._tracks[j].row() for j in order if j in self._tracks)
            self.rounds += 1
            self._snapshot = JobsSnapshot(
                rows,
                self._snapshot.version + 1,
                error="; ".join(errors) or None,
                polled_at=self.clock(),
            )
            return self._snapshot

    def _keep_plan(self, rec: Mapping[str, Any], plan: dict[str, Any]) -> None:
        """Keep a job's plan in its history (a finished job still shows it), unless the history
        has it already (another controller, or this one reading the job's metrics again)."""
        if plan_from_events(rec.get("events") or ()) == plan:
            return
        try:
            self.jobs.history.add_event(rec["job_id"], {"event": "mp_plan", "plan": plan})
        except Exception:  # the history is where it is kept, not how it is shown
            log.exception("job %s: keeping its plan", rec["job_id"])

    @staticmethod
    def _hint(of: Callable[[Sequence[Mapping[str, Any]]], Mapping[str, float | None]] | None,
              placement: Sequence[Mapping[str, Any]], gpus: bool = False) -> Mapping[str, float | None] | None:
        """Telemetry for the signals (``gpu_util``, ``read_bps``) over the job's hosts."""
        if of is None or (gpus and not any(n.get("gpus") for n in placement)):
            return None
        try:
            return of(placement)
        except Exception:  # telemetry is a hint here; its failure must not stop the round
            log.exception("telemetry for signals")
            return None

    def _look(self, rec: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], bool, str | None]:
        """One job's hosts, supervised when it is live: (its record now, host states, live, error)."""
        live = rec["state"] not in TERMINAL
        try:
            states = self.jobs.supervise_once(rec) if live else self.jobs.host_states(rec)
            return self.jobs.record(rec["job_id"]), states, live, None
        except TransportError as e:
            return rec, {}, live, str(e)

    @staticmethod
    def _map(fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        if len(items) <= 1:
            return [fn(x) for x in items]
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(16, len(items)), thread_name_prefix="jobwatch-look") as pool:
            return list(pool.map(fn, items))

    def _hosts_ever(self, rec: Mapping[str, Any]) -> list[str]:
        """Every host the job ran on (a restart can move it): its logs and metrics stay there."""
        hosts_ever = getattr(self.jobs, "hosts_ever", None)
        if hosts_ever is not None:
            return list(hosts_ever(rec))
        return [n["host"] for n in rec.get("placement") or []]

    def _reader(self, track: _Track) -> JobReader:
        if track.reader is None:
            # Lines that came in pieces are kept to LINE_SHOWN characters for the log view.
            # Through the job's owner's own agents where they joined with accounts of their own.
            ctl_for = getattr(self.jobs, "ctl_for", None)
            ctl = ctl_for(track.rec.get("user")) if ctl_for is not None else self.ctl
            track.reader = JobReader(ctl, track.rec["job_id"], keep=LINE_SHOWN)
        return track.reader

    def _read_metrics(
        self, job_id: str, hosts: Sequence[str], track: _Track
    ) -> list[dict[str, Any]]:
        # Bounded: a huge backlog comes in over several rounds.
        return self._reader(track).metrics(hosts, max_rounds=64, timeout=20)

    def _read_logs(self, track: _Track) -> None:
        if track.logs_complete:
            return
        reader = self._reader(track)
        complete = track.final
        states = dict(track.states)
        for host in self._hosts_ever(track.rec):
            if host not in states:  # ran there before a restart moved the job
                try:
                    states[host] = reader.status(host)
                except TransportError as e:
                    states[host] = e
        for host, st in states.items():
            if not isinstance(st, dict):
                complete = False
                continue
            for rank in log_ranks(st):
                caught_up = False
                try:
                    for chunk in reader.log_chunks(host, rank, max_chunks=LOG_CHUNKS_PER_ROUND):
                        track.logs.extend((host, rank, line) for line in reader.lines(host, rank, chunk))
                        caught_up = not chunk.more
                except TransportError as e:
                    log.info("logs from %s: %s", host, e)
                if not caught_up:
                    complete = False
        track.logs_complete = complete
