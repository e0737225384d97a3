"""What the faces show about jobs: plain, immutable views, and the job source they read.

One job is one ``JobView``, built by ``job_view`` from its history record and what its hosts
said: ``rigdeck status`` prints it (``tui.control.jobs``), the app's Job view draws it with what
the poller folded from the metrics (``tui.control.jobwatch``). The faces only read views, in
their own process or decoded from a server's answers (``JobView.from_json`` for the commands'
results, ``tui.model.wire`` for the app's); string-keyed dicts stay inside those decoders and
the fields that carry a host's own words (spec, placement, ranks, events, hosts). The jobs table
has one ``JobRow`` per job, a view's head. A job's log lines are kept in a ``LogBuffer``, made
safe to draw as they arrive.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

from tui.model.diagnose import Signal
from tui.model.health import Goodput, Incident
from tui.model.jobspec import JobSpec
from tui.model.jobstate import QUEUED, RUNNING, TERMINAL, UNKNOWN
from tui.model.poolview import PoolsView, gpu_of_rank, pools_json, pools_view
from tui.model.processingview import ProcessingView, processing_json, processing_view
from tui.model.stages import StagesView
from tui.model.termsafe import terminal_safe
from tui.model.textformat import simulated_text
from tui.model.trackerlinks import TrackerLink, links_from_json, links_json, tracker_links

LOG_LIMIT = 200_000  # lines kept per job; the oldest half goes when it is reached

# ---------------------------------------------------------------------------------------------
# Plain data the app renders


@dataclass(frozen=True)
class Owner:
    """A checkpoint writer: a rank on a host's GPU (``gpu`` is the local rank without GPUs)."""

    rank: int | None
    host: str | None
    gpu: int | None
    simulated: bool = False  # the GPU is a simulated one (the job's placement says so): labelled

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Owner:
        d = d or {}
        return cls(d.get("rank"), d.get("host"), d.get("gpu"))

    def label(self) -> str:
        where = (simulated_text(f"{self.host or '?'}/gpu{self.gpu}", self.simulated) if self.gpu is not None
                 else (self.host or "?"))
        return where if self.rank is None else f"{where} r{self.rank}"


@dataclass(frozen=True)
class CheckpointSave:
    step: int
    status: str  # writing | done | failed
    owner: Owner
    bytes: int | None = None
    seconds: float | None = None
    time: float | None = None
    path: str | None = None
    error: str | None = None

    @property
    def speed_bps(self) -> float | None:
        if self.bytes and self.seconds and self.seconds > 0:
            return self.bytes / self.seconds
        return None


@dataclass(frozen=True)
class OwnerMove:
    time: float | None
    policy: str | None
    from_: Owner
    to: Owner
    reason: str | None


@dataclass(frozen=True)
class CheckpointView:
    """Who owns a job's checkpoints and what they wrote."""

    policy: str
    directory: str | None
    owners: tuple[Owner, ...]  # current owners: from saves when any, else from the policy
    last_done: CheckpointSave | None
    saves: tuple[CheckpointSave, ...]  # one per (step, owner), in the order they started
    moves: tuple[OwnerMove, ...]
    failed: int


@dataclass(frozen=True)
class JobRow:
    """One line of the jobs table (and the head of the job view)."""

    job_id: str
    name: str
    state: str
    placement: tuple[dict[str, Any], ...]
    ranks_running: int
    ranks_total: int
    step: int | None
    loss: float | None
    step_rate: float | None  # steps per second
    total_steps: int | None
    created: float | None
    started: float | None
    ended: float | None
    restarts: int
    checkpoint_owner: str
    cause: dict[str, Any] | None
    unreachable: tuple[str, ...] = ()  # placement hosts that did not answer the last round

    @property
    def eta_s(self) -> float | None:
        if self.total_steps is None or self.step is None or not self.step_rate:
            return None
        if self.state in TERMINAL:
            return None
        return max(0.0, (self.total_steps - (self.step + 1)) / self.step_rate)

    def runtime_s(self, now: float) -> float | None:
        if self.started is None:
            return None
        return max(0.0, (self.ended if self.ended is not None else now) - self.started)


# ---------------------------------------------------------------------------------------------
# Logs


class LogBuffer:
    """A job's log lines as (host, rank, text), append-only; old lines drop off past ``limit``.

    Indices are absolute: line ``i`` stays line ``i`` while it is kept (``base`` is the index of
    the oldest one kept), so a view can cache by index.
    """

    def __init__(self, limit: int = LOG_LIMIT):
        self._lock = threading.Lock()
        self._lines: list[tuple[str, int, str]] = []
        self.base = 0
        self.limit = limit
        self.ranks: set[int] = set()

    def __len__(self) -> int:
        return self.base + len(self._lines)

    def extend(self, lines: Iterable[tuple[str, int, str]]) -> None:
        """Add lines, made safe to draw (``terminal_safe``): views and searches see that text."""
        new = [(host, rank, terminal_safe(text)) for host, rank, text in lines]
        if not new:
            return
        with self._lock:
            self._lines.extend(new)
            self.ranks.update(r for _, r, _ in new)
            if len(self._lines) > self.limit:
                drop = len(self._lines) - self.limit // 2
                del self._lines[:drop]
                self.base += drop

    def get(self, index: int) -> tuple[str, int, str] | None:
        i = index - self.base
        if 0 <= i < len(self._lines):
            return self._lines[i]
        return None

    def since(self, index: int) -> tuple[int, list[tuple[str, int, str]]]:
        """(first index returned, lines from ``index`` on) — what a view has not seen yet."""
        with self._lock:
            start = max(index, self.base)
            return start, self._lines[start - self.base :]


# ---------------------------------------------------------------------------------------------
# One job


# A view that carries no checkpoint story (``rigdeck status`` reads none): the default policy,
# nothing saved, so the jobs table's owner cell reads "-".
NO_CHECKPOINTS = CheckpointView(policy="rank0", directory=None, owners=(), last_done=None, saves=(), moves=(),
                                failed=0)


def owner_summary(view: CheckpointView) -> str:
    """The jobs table's checkpoint cell: the one owner, or the policy and how many there are."""
    if not view.owners:
        return "-" if view.policy == "rank0" and not view.saves else view.policy
    if len(view.owners) == 1:
        text = view.owners[0].label()
    else:
        text = f"{view.policy}: {len(view.owners)} owners"
    if view.moves:
        text += " (moved)"
    return text


def rank_rows(states: Mapping[str, Any], placement: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every rank of every host that answered (``states``: host -> its job status, anything else
    for a host that did not), in rank order, each with its GPU: the one the rank reports, else
    the placement's. Ranks are contiguous in node order and local rank ``l`` of a node has its
    ``l``-th GPU, so a rank's number finds its node even where a host holds several (pools); a
    rank that reports no number takes its host's first node."""
    out = []
    for host, st in states.items():
        if not isinstance(st, Mapping):
            continue
        for r in st.get("ranks") or []:
            gpu = r.get("gpu")
            local = r.get("local_rank")
            if gpu is None and r.get("rank") is not None:
                gpu = gpu_of_rank(placement, r.get("rank"))
            elif gpu is None and local is not None:
                gpus = next((n.get("gpus") or [] for n in placement if n.get("host") == host), [])
                gpu = gpus[local] if local < len(gpus) else None
            out.append({"rank": r.get("rank"), "host": host, "local_rank": local, "gpu": gpu, "pid": r.get("pid"),
                        "state": r.get("state"), "exit_code": r.get("exit_code"), "signal": r.get("signal")})
    out.sort(key=lambda r: r["rank"] if r["rank"] is not None else -1)
    return out


@dataclass(frozen=True)
class Progress:
    """What a job's metrics say so far: the newest step and loss from the hosts' last records
    (``rigdeck status``), or all of this folded as the records arrive (the app's poller)."""

    step: int | None = None
    loss: float | None = None
    step_rate: float | None = None  # steps per second
    points: tuple[tuple[int, float], ...] = ()  # (step, loss), steps ascending
    points_version: int = 0
    checkpoints: CheckpointView = NO_CHECKPOINTS
    signals: tuple[Signal, ...] = ()  # live bottleneck signals, worst first (tui.model.diagnose)
    stages: StagesView | None = None  # a [model_parallel] job's plan and stages (tui.model.stages)


@dataclass(frozen=True)
class JobView:
    """One job, as every face shows it (built by ``job_view``)."""

    job_id: str
    name: str
    state: str  # the record's, or ``unknown`` while hosts of a live job cannot be reached
    spec: dict[str, Any]
    placement: tuple[dict[str, Any], ...] = ()
    restarts: int = 0
    cause: dict[str, Any] | None = None
    created: float | None = None
    started: float | None = None
    ended: float | None = None
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)  # each host's status; {"error": ...}: no answer
    ranks: tuple[dict[str, Any], ...] = ()
    last_step: int | None = None
    last_loss: float | None = None
    events: tuple[dict[str, Any], ...] = ()
    unreachable: tuple[str, ...] = ()  # hosts that did not answer this look
    waiting: str | None = None  # a queued job: what it waits for
    pool_sizing: dict[str, Any] | None = None  # a job with reduction servers: the sizing check
    pools: PoolsView | None = None  # a job made of worker pools: its pools (tui.model.poolview)
    processing: ProcessingView | None = None  # a processing job: inputs and outputs (tui.model.processingview)
    # What the app's poller folds from the metrics as they arrive (``rigdeck status`` reads its
    # signals and stages from the records once, and leaves these empty).
    step_rate: float | None = None  # steps per second
    points: tuple[tuple[int, float], ...] = ()  # (step, loss), steps ascending
    points_version: int = 0
    checkpoints: CheckpointView = NO_CHECKPOINTS
    signals: tuple[Signal, ...] = ()  # live bottleneck signals, worst first (tui.model.diagnose)
    stages: StagesView | None = None  # a [model_parallel] job's plan and stages (tui.model.stages)
    logs: LogBuffer = field(default_factory=LogBuffer, compare=False, repr=False)  # the open job's, in the app
    # Health and healing (tui.model.health): each failure and what it cost, and the share of the
    # wall time spent in steps that count (``rigdeck status`` reads the metrics for it).
    incidents: tuple[Incident, ...] = ()
    goodput: Goodput | None = None
    # Links to experiment trackers its ranks printed (tui.model.trackerlinks), the first printed first.
    links: tuple[TrackerLink, ...] = ()
    user: str | None = None  # its owner: who submitted it (None: recorded before owners were)
    # Run through Slurm (tui/control/engines.py): Slurm's job id, its state as last read, the login host.
    slurm: dict[str, Any] | None = None

    @property
    def stopped_by(self) -> str | None:
        """Who stopped it (its newest stop's ``by``), or None."""
        for e in reversed(self.events):
            if e.get("event") in ("stop requested", "cancelled while queued") and e.get("by"):
                return str(e["by"])
        return None

    @property
    def state_line(self) -> str:
        """The state as a person reads it: ``unknown (h1, h2 unreachable)``."""
        if self.state == UNKNOWN and self.unreachable:
            return f"unknown ({', '.join(self.unreachable)} unreachable)"
        if self.state == QUEUED and self.waiting:
            return f"queued ({self.waiting})"
        return self.state

    @cached_property
    def row(self) -> JobRow:
        """The job's line in the jobs table (and the head of the Job view)."""
        running = 0 if self.state in TERMINAL else sum(1 for r in self.ranks if r.get("state") == RUNNING)
        return JobRow(
            job_id=self.job_id,
            name=self.name,
            state=self.state,
            placement=tuple(self.placement),
            ranks_running=running,
            ranks_total=sum(int(n.get("slots") or 0) for n in self.placement),
            step=self.last_step,
            loss=self.last_loss,
            step_rate=self.step_rate,
            total_steps=self.spec.get("total_steps"),
            created=self.created,
            started=self.started,
            ended=self.ended,
            restarts=self.restarts,
            checkpoint_owner=owner_summary(self.checkpoints),
            cause=self.cause,
            unreachable=tuple(self.unreachable),
        )

    def to_json(self) -> dict[str, Any]:
        """The commands' form (``rigdeck status --json``, a server's answer to ``view``)."""
        hosts = {h: (s if isinstance(s, dict) else {"error": str(s)}) for h, s in self.hosts.items()}
        return {
            "job_id": self.job_id, "name": self.name, "state": self.state, "restarts": self.restarts,
            "placement": list(self.placement), "cause": self.cause, "created": self.created,
            "started": self.started, "ended": self.ended, "ranks": list(self.ranks),
            "last_step": self.last_step, "last_loss": self.last_loss, "hosts": hosts,
            "events": list(self.events), "unreachable": list(self.unreachable), "waiting": self.waiting,
            "sweep_id": self.spec.get("sweep_id"), "trial": self.spec.get("trial"),
            "code": self.spec.get("code"), "pipeline_id": self.spec.get("pipeline_id"),
            "step": self.spec.get("step"), "pool_sizing": self.pool_sizing, "pools": pools_json(self.pools),
            "processing": processing_json(self.processing),
            "incidents": [i.to_dict() for i in self.incidents],
            "goodput": self.goodput.to_dict() if self.goodput is not None else None,
            "links": links_json(self.links), "user": self.user, "stopped_by": self.stopped_by,
            "slurm": self.slurm,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> JobView:
        """The inverse of ``to_json`` (a host that could not be reached stays ``{"error": ...}``)."""
        events = tuple(d.get("events") or ())
        return cls(
            job_id=d["job_id"], name=d["name"], state=d["state"],
            spec=d.get("spec") or {k: d[k] for k in ("sweep_id", "trial", "code", "pipeline_id", "step")
                                   if d.get(k) is not None},
            placement=tuple(d.get("placement") or ()), restarts=d.get("restarts") or 0, cause=d.get("cause"),
            created=d.get("created"), started=d.get("started"), ended=d.get("ended"),
            hosts=d.get("hosts") or {}, ranks=tuple(d.get("ranks") or ()), last_step=d.get("last_step"),
            last_loss=d.get("last_loss"), events=events,
            unreachable=tuple(d.get("unreachable") or ()), waiting=d.get("waiting"),
            pool_sizing=d.get("pool_sizing"),
            pools=PoolsView.from_json(d.get("pools"), d.get("pool_sizing"), events),
            processing=ProcessingView.from_json(d.get("processing")),
            incidents=tuple(Incident.from_dict(i) for i in d.get("incidents") or ()),
            goodput=Goodput(float(g.get("useful_s") or 0.0), float(g.get("wall_s") or 0.0), int(g.get("steps") or 0))
            if (g := d.get("goodput")) else None,
            links=links_from_json(d.get("links")), user=d.get("user"), slurm=d.get("slurm"),
        )


JobDetail = JobView  # the app's name for the view it draws: the same type


def job_view(
    rec: Mapping[str, Any],
    states: Mapping[str, Any],
    *,
    state: str | None = None,
    unreachable: Sequence[str] = (),
    ranks: Sequence[dict[str, Any]] | None = None,
    progress: Progress = Progress(),
    state_dirs: Mapping[str, str] | None = None,
    logs: LogBuffer | None = None,
    panels: bool = True,
    incidents: Sequence[Incident] = (),
    goodput: Goodput | None = None,
) -> JobView:
    """The view of the job ``rec`` (its history record) from what its hosts said (``states``:
    host -> its job status, anything else for a host that did not answer; empty: not asked).

    ``state`` overrides the record's (a look that could not reach the hosts says ``unknown``);
    ``ranks``, when the caller keeps them, stand for ``rank_rows(states, ...)``; ``progress`` is
    what the metrics said; ``panels`` false leaves out the per-kind panels (pools, processing)
    and the trackers' links, which the jobs table does not need."""
    placement = tuple(rec.get("placement") or ())
    return JobView(
        job_id=rec["job_id"],
        name=rec["name"],
        state=state or rec["state"],
        spec=rec.get("spec") or {},
        placement=placement,
        restarts=int(rec.get("restarts") or 0),
        cause=rec.get("cause"),
        created=rec.get("created"),
        started=rec.get("started"),
        ended=rec.get("ended"),
        hosts={h: (s if isinstance(s, dict) else {"error": str(s)}) for h, s in states.items()},
        ranks=tuple(rank_rows(states, placement) if ranks is None else ranks),
        last_step=progress.step,
        last_loss=progress.loss,
        events=tuple(rec.get("events") or ()),
        unreachable=tuple(unreachable),
        waiting=rec.get("waiting") if rec["state"] == QUEUED else None,
        pool_sizing=rec.get("pool_sizing"),
        pools=pools_view(rec, states) if panels else None,
        processing=processing_view(rec, state_dirs) if panels else None,
        step_rate=progress.step_rate,
        points=progress.points,
        points_version=progress.points_version,
        checkpoints=progress.checkpoints,
        signals=progress.signals,
        stages=progress.stages,
        logs=LogBuffer() if logs is None else logs,
        incidents=tuple(incidents),
        goodput=goodput,
        links=tracker_links(states) if panels else (),
        user=rec.get("user"),
        slurm=dict(rec["slurm"]) if rec.get("slurm") else None,
    )


@dataclass(frozen=True)
class JobsSnapshot:
    rows: tuple[JobRow, ...]
    version: int
    error: str | None = None
    polled_at: float | None = None

    def row(self, job_id: str) -> JobRow | None:
        return next((r for r in self.rows if r.job_id == job_id), None)


@dataclass(frozen=True)
class StopPlan:
    """What stopping a job touches, for the confirmation dialog."""

    job_id: str
    state: str
    hosts: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]  # (host, ranks, GPUs)
    grace_s: float
    pools: tuple[tuple[str, int, tuple[str, ...]], ...] = ()  # a pool job's: (role, replicas, hosts)

    @property
    def rank_count(self) -> int:
        return sum(len(r) for _, r, _ in self.hosts)


class JobSource(Protocol):
    """What the app needs from a job watcher (``JobWatch``, or a recorded stand-in in tests)."""

    def start(self) -> Any: ...
    def stop(self) -> None: ...
    def snapshot(self) -> JobsSnapshot: ...
    def detail(self, job_id: str) -> JobView | None: ...
    def select(self, job_id: str | None) -> None: ...
    def kick(self) -> None: ...
    def stop_plan(self, job_id: str) -> StopPlan: ...
    # user: the owner (a server's); env_values: the spec's env_from_file values, read by the
    # launching client (None: the spec has none, or the hosts read the file themselves).
    def launch(self, spec: JobSpec, user: str | None = None,
               env_values: Mapping[str, str] | None = None) -> str: ...
    def stop_job(self, job_id: str, user: str | None = None) -> str: ...
    def inventory_hosts(self) -> list[str]: ...
