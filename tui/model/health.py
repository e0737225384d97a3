"""Health and healing, the rules: GPU health words, drains, when a job is hung, what a failure cost.

Plain data and rules (no I/O): the controller (tui/control/healing.py) feeds them what hosts and
metrics say, with the time, and acts on what they decide.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent import hangrule
from agent.gpuhealth import CONTAINER

# Each GPU's health as the agent judges it (agent/gpuhealth.py), and the controller's own word.
OK = "ok"
WARN = "warn"
UNHEALTHY = "unhealthy"
DRAINED = "drained"
HEALTH_STATES = (OK, WARN, UNHEALTHY, DRAINED)

WHOLE_HOST = -1  # a drain of every GPU of a host (and the host itself for CPU-only jobs)


def failure_kind(cause: Mapping[str, Any]) -> str:
    """The incident kind of a rank's failure its host reported: ``container`` when the host judged
    that the rank's container lost its GPUs while the host sees them healthy (agent/gpuhealth.py
    ``container_fault``: nothing to drain, a restart makes a new container), else ``exit``."""
    return CONTAINER if cause.get("kind") == CONTAINER else "exit"


class DrainTargetError(ValueError):
    """A drain target that is not ``HOST`` or ``HOST:GPU``."""


@dataclass(frozen=True)
class Drain:
    """A GPU (or a whole host: ``gpu`` is None) kept out of placement: who, when and why.
    ``source`` is "operator" (``rigdeck drain``) or "health" (rigdeck saw it unhealthy); a health
    drain moves the job that ran there, an operator's only with ``now``."""

    host: str
    gpu: int | None
    reason: str
    who: str
    at: float
    source: str = "operator"
    now: bool = False  # also move the jobs running there (``rigdeck drain --now``)

    @property
    def target(self) -> str:
        return self.host if self.gpu is None else f"{self.host}:{self.gpu}"

    def covers(self, host: str, gpu: int | None) -> bool:
        return self.host == host and (self.gpu is None or gpu is None or self.gpu == gpu)

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "gpu": self.gpu, "target": self.target, "reason": self.reason,
                "who": self.who, "at": self.at, "source": self.source, "now": self.now}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Drain:
        gpu = d.get("gpu")
        return cls(str(d["host"]), None if gpu is None or int(gpu) < 0 else int(gpu), str(d.get("reason") or ""),
                   str(d.get("who") or ""), float(d.get("at") or 0.0), str(d.get("source") or "operator"),
                   bool(d.get("now")))


def parse_target(text: str, hosts: Sequence[str] | None = None) -> tuple[str, int | None]:
    """``HOST`` or ``HOST:GPU`` (a GPU index). ``hosts``: the inventory's names, when known."""
    host, sep, gpu = text.strip().partition(":")
    if not host:
        raise DrainTargetError(f"{text!r}: expected HOST or HOST:GPU")
    if hosts is not None and host not in hosts:
        raise DrainTargetError(f"{text!r}: no host {host!r} in the inventory (hosts: {', '.join(hosts)})")
    if not sep:
        return host, None
    if not gpu.isdigit():
        raise DrainTargetError(f"{text!r}: the GPU after ':' must be an index (0, 1, ...), not {gpu!r}")
    return host, int(gpu)


def drained(drains: Iterable[Drain], host: str, gpu: int | None) -> Drain | None:
    """The drain that keeps this GPU (or host) out of placement, if any."""
    return next((d for d in drains if d.covers(host, gpu)), None)


# -- progress: is the job hung? ----------------------------------------------------------------


@dataclass(frozen=True)
class HealthSpec:
    """A job spec's ``[health]`` table, in seconds. ``hang_timeout`` and ``startup_timeout`` None
    (no value in the spec): learned from the job, section by section (agent/hangrule.py); a value
    wins over anything learned."""

    hang_timeout: float | None = None
    startup_timeout: float | None = None
    on_hang: str = "restart"  # or "fail"
    host_timeout: float = 60.0
    on_nan: str = "fail"  # or "restart" | "ignore"

    def to_dict(self) -> dict[str, Any]:
        return {"hang_timeout": self.hang_timeout, "startup_timeout": self.startup_timeout, "on_hang": self.on_hang,
                "host_timeout": self.host_timeout, "on_nan": self.on_nan}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> HealthSpec:
        d = d or {}
        base = cls()
        return cls(hang_timeout=_seconds_or_none(d.get("hang_timeout")),
                   startup_timeout=_seconds_or_none(d.get("startup_timeout")),
                   on_hang=str(d.get("on_hang", base.on_hang)),
                   host_timeout=float(d.get("host_timeout", base.host_timeout)),
                   on_nan=str(d.get("on_nan", base.on_nan)))


HOST_HEALS_LAUNCHERS = ("direct", "torchrun")


def heals_on_host(spec: Mapping[str, Any], hosts: int, slurm: bool = False) -> bool:
    """Who restarts a job after a rank's failure or a hang its job host judged: for a job on one
    host that rigdeck runs itself (``direct`` or ``torchrun``, no worker pools, no container), its
    job host, in place, with nobody watching; otherwise the controller. The plan tells the job
    host (``heal``), and a controller adopts the host's restarts instead of making its own: one
    owner of each restart (docs/jobs.md, "With nobody watching")."""
    return (hosts == 1 and not slurm and spec.get("launcher") in HOST_HEALS_LAUNCHERS
            and not spec.get("pools") and not spec.get("container"))


def _seconds_or_none(v: Any) -> float | None:
    return None if v is None else float(v)


def step_of(record: Mapping[str, Any]) -> float | None:
    """The step a metrics record reports (an event, or a record without a step, reports none)."""
    if record.get("event") is not None:
        return None
    s = record.get("step")
    if isinstance(s, bool) or not isinstance(s, (int, float)):
        return None
    return float(s)


@dataclass
class Progress:
    """What the controller saw of one attempt, by its own clock (hosts' clocks may differ): the
    hang rule's watch (agent/hangrule.py), fed at each look."""

    attempt: int
    since: float  # when this attempt was first seen running
    watch: hangrule.Watch

    @property
    def last_step(self) -> float | None:
        return self.watch.last_step

    @property
    def last_change(self) -> float | None:
        return self.watch.last_change


Hang = hangrule.Verdict  # a hang: its section, how long, the timeout that judged it and why


def sections_of(progress: Iterable[Mapping[str, Any]]) -> tuple[set[str], dict[str, float]]:
    """From each rank's ``progress`` record (agent ``job_status``): the sections some rank is in
    now, and the longest run of each section the ranks reported ended."""
    inside: set[str] = set()
    ended: dict[str, float] = {}
    for p in progress:
        inside.update(str(n) for n in p.get("sections") or ())
        for name, seconds in (p.get("ended") or {}).items():
            if isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
                ended[str(name)] = max(ended.get(str(name), 0.0), float(seconds))
    return inside, ended


class ProgressWatch:
    """Per job: the hang rule's watch on its current attempt (agent/hangrule.py owns the rule)."""

    def __init__(self) -> None:
        self.jobs: dict[str, Progress] = {}

    def observe(self, job_id: str, attempt: int, steps: Iterable[float | None], now: float,
                spec: HealthSpec | None = None, inside: Iterable[str] = (),
                ended: Mapping[str, float] | None = None) -> Progress:
        p = self.jobs.get(job_id)
        if p is None or p.attempt != attempt:
            spec = spec or HealthSpec()
            p = self.jobs[job_id] = Progress(attempt, now, hangrule.Watch(now, spec.hang_timeout,
                                                                          spec.startup_timeout))
        p.watch.observe(now, steps, inside, ended or {})
        return p

    def hang(self, job_id: str, spec: HealthSpec, now: float, margin: float = 0.0) -> Hang | None:
        """The job's hang, once its section outlasted its timeout by ``margin`` more."""
        p = self.jobs.get(job_id)
        if p is None:
            return None
        p.watch.hang_timeout, p.watch.startup_timeout = spec.hang_timeout, spec.startup_timeout
        return p.watch.judge(now, margin)

    def forget(self, job_id: str) -> None:
        self.jobs.pop(job_id, None)


# -- the loss guard ------------------------------------------------------------------------------


def bad_loss(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return math.isnan(value) or math.isinf(value)
    if isinstance(value, str):
        return value.strip().lower() in ("nan", "inf", "-inf", "+inf", "infinity", "-infinity")
    return False


def first_bad_loss(records: Iterable[Mapping[str, Any]], run: int = 3) -> float | None:
    """The first step of ``run`` reported steps in a row whose loss, at every rank that reported
    one for that step, is NaN or inf; None while the loss is sound."""
    by_step: dict[float, list[Any]] = {}
    for r in records:
        s = step_of(r)
        if s is not None and r.get("loss") is not None:
            by_step.setdefault(s, []).append(r["loss"])
    streak: list[float] = []
    for s in sorted(by_step):
        if all(bad_loss(v) for v in by_step[s]):
            streak.append(s)
            if len(streak) >= run:
                return streak[0]
        else:
            streak = []
    return None


# -- incidents and goodput -------------------------------------------------------------------


@dataclass(frozen=True)
class Incident:
    """One failure of a job and what it cost. Times are the controller's (epoch seconds)."""

    kind: str  # hang | gpu | host | nan | drain | exit | container (lost its GPUs, the host sees them healthy)
    detected_at: float
    message: str
    host: str | None = None
    gpu: int | None = None
    rank: int | None = None
    detect_s: float | None = None  # from the last sign of life (last step, last answer) to detection
    last_step: float | None = None
    resumed_at: float | None = None  # the next attempt's first step
    resume_s: float | None = None  # from the stop to that first step
    steps_rerun: int | None = None  # steps the next attempt computed again (after its checkpoint)
    attempt: int = 0
    section: str | None = None  # a hang: the section it was stuck in (agent/hangrule.py)
    timeout_s: float | None = None  # a hang: the timeout that judged it (its message says why)
    healed_by: str | None = None  # a restart a job host made in place ("h1's job host"); None: a controller's
    stopped_at: float | None = None  # the failed attempt's processes all gone (or, at worst, told to go)
    started_at: float | None = None  # the next attempt started on its hosts

    def parts(self) -> dict[str, float | None]:
        """The restart's parts in seconds: ``detect`` (from the last sign of life to detection),
        ``stop`` (detection to the attempt stopped), ``start`` (stopped to the next attempt
        started), ``first_step`` (started to its first step). None where a moment is unknown."""
        def gap(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else round(max(0.0, b - a), 3)

        return {"detect": self.detect_s, "stop": gap(self.detected_at, self.stopped_at),
                "start": gap(self.stopped_at, self.started_at), "first_step": gap(self.started_at, self.resumed_at)}

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Incident:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__ if k in d})  # type: ignore[arg-type]


@dataclass(frozen=True)
class Goodput:
    """Time in steps that count over wall time since the job started."""

    useful_s: float
    wall_s: float
    steps: int

    @property
    def ratio(self) -> float | None:
        return None if self.wall_s <= 0 else max(0.0, min(1.0, self.useful_s / self.wall_s))

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "useful_s": round(self.useful_s, 3), "wall_s": round(self.wall_s, 3),
                "steps": self.steps}


def first_started(rec: Mapping[str, Any]) -> float | None:
    """When the job first started (its first ``started`` event): goodput's wall time counts from
    there (the record's ``started`` moves with each attempt)."""
    t = next((e.get("time") for e in rec.get("events") or [] if e.get("event") == "started"), None)
    return float(t) if t is not None else None


def goodput(records: Iterable[Mapping[str, Any]], started: float, now: float) -> Goodput:
    """Each step counts once, as its newest attempt computed it; its time is the gap from the
    step before it in the same attempt and rank (the first step of an attempt also carries the
    start-up, which is not useful work: it counts as the attempt's median step). Steps an earlier
    attempt computed and a later one redid count for nothing: that is the failure's cost."""
    per: dict[tuple[int, Any], list[tuple[float, float]]] = {}  # (attempt, rank) -> [(step, time)]
    for r in records:
        s = step_of(r)
        t = r.get("time")
        if s is None or isinstance(t, bool) or not isinstance(t, (int, float)):
            continue
        per.setdefault((int(r.get("restart") or 0), r.get("rank")), []).append((s, float(t)))
    # One rank's view is the gang's (they step together): the lowest rank that reports.
    ranks = sorted({k[1] for k in per}, key=lambda x: (x is None, x if isinstance(x, (int, float)) else 0))
    if not ranks:
        return Goodput(0.0, max(0.0, now - started), 0)
    rank = ranks[0]
    newest: dict[float, int] = {}
    for (attempt, rk), rows in per.items():
        if rk == rank:
            for s, _ in rows:
                newest[s] = max(newest.get(s, -1), attempt)
    useful = 0.0
    counted = 0
    for (attempt, rk), rows in per.items():
        if rk != rank:
            continue
        rows.sort()
        gaps = [b[1] - a[1] for a, b in zip(rows, rows[1:], strict=False) if b[1] >= a[1]]
        typical = sorted(gaps)[len(gaps) // 2] if gaps else 0.0
        for i, (s, t) in enumerate(rows):
            if newest.get(s) != attempt:
                continue
            counted += 1
            useful += typical if i == 0 else max(0.0, min(t - rows[i - 1][1], 10 * typical or t - rows[i - 1][1]))
    return Goodput(useful, max(0.0, now - started), counted)


def steps_rerun(records: Iterable[Mapping[str, Any]], attempt: int) -> int:
    """How many steps attempt ``attempt`` computed again that an earlier attempt had computed."""
    before: set[float] = set()
    again: set[float] = set()
    for r in records:
        s = step_of(r)
        if s is None:
            continue
        a = int(r.get("restart") or 0)
        if a < attempt:
            before.add(s)
        elif a == attempt:
            again.add(s)
    return len(before & again)


@dataclass
class HealthView:
    """What the faces show of a job's health: its incidents and its goodput."""

    incidents: list[Incident] = field(default_factory=list)
    goodput: Goodput | None = None
