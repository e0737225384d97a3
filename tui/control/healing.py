"""The controller's healer: finds what leaves every process of a job alive and the job going nowhere
(a hang, a failing GPU, a host gone, a loss turned NaN), records what it cost, and hands the
job to the gang rules to be stopped and resumed on healthy hardware.

The supervisor (``JobManager.supervise_once``) calls ``look`` at each poll of a running job with
what its hosts said (``job_status``: ``progress``, ``gpu_health``); a ``Fault`` it returns is
acted on by ``JobManager`` through ``heal``. The rules themselves (when a job is hung, goodput)
are in tui/model/health.py.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent import hangrule
from tui.model.health import (
    UNHEALTHY,
    Drain,
    HealthSpec,
    Incident,
    ProgressWatch,
    bad_loss,
    sections_of,
)

if TYPE_CHECKING:
    from tui.control.history import History

log = logging.getLogger(__name__)

NAN_RUN = 3  # reports in a row whose loss is NaN or inf at every reporting rank
# The job hosts judge hangs on their own ranks by the same rule, sooner and with the stacks taken
# on the spot (agent/jobhost.py); this watch is the backstop (an agent without the rule, a job
# host that cannot judge) and waits this much longer than the timeout before it judges itself.
BACKSTOP_S = 10.0


@dataclass(frozen=True)
class Fault:
    """Why a running job must be stopped now. ``restart``: whether its spec lets a restart follow
    (a hang with ``on_hang = "fail"`` or a NaN with ``on_nan = "fail"`` does not)."""

    kind: str  # hang | gpu | host | nan | drain | exit | container (only a gpu drains what failed)
    message: str
    host: str | None = None
    gpu: int | None = None
    rank: int | None = None
    last_step: float | None = None
    detect_s: float | None = None
    restart: bool = True
    section: str | None = None  # a hang: the section it is stuck in (agent/hangrule.py)
    timeout_s: float | None = None  # a hang: the timeout that judged it
    stacks: Mapping[str, Sequence[Mapping[str, Any]]] | None = None  # host -> the stacks its job host took
    what: str | None = None  # a GPU's fault: what its host says of it, without the host and GPU (a drain's reason)

    def cause(self) -> dict[str, Any]:
        c: dict[str, Any] = {"message": self.message, "kind": self.kind}
        for k in ("host", "gpu", "rank", "last_step", "section", "timeout_s"):
            if getattr(self, k) is not None:
                c[k] = getattr(self, k)
        return c


def job_gpus(rec: Mapping[str, Any]) -> dict[str, set[int]]:
    """Each host of the job's placement and the GPUs it holds there."""
    out: dict[str, set[int]] = {}
    for n in rec.get("placement") or []:
        out.setdefault(str(n["host"]), set()).update(int(g) for g in n.get("gpus") or [])
    return out


@dataclass
class _Pending:
    """An incident whose cost is not known until the next attempt takes its first step."""

    seq: int
    stopped_at: float
    attempt: int
    last_step: float | None


@dataclass
class Healer:
    history: History
    watch: ProgressWatch = field(default_factory=ProgressWatch)
    unreachable: dict[tuple[str, str], float] = field(default_factory=dict)  # (job, host) -> since
    answered: dict[tuple[str, str], float] = field(default_factory=dict)  # (job, host) -> its last answer
    bad: dict[str, list[float]] = field(default_factory=dict)  # job -> steps seen with every loss bad
    seen_steps: dict[str, float] = field(default_factory=dict)  # job -> the newest step the guard read
    good_steps: dict[str, float] = field(default_factory=dict)  # job -> the newest step read with a good loss
    pending: dict[str, _Pending] = field(default_factory=dict)
    gpu_seen: dict[tuple[str, str, int], float] = field(default_factory=dict)  # (job, host, GPU) -> first seen bad
    drains: list[Drain] = field(default_factory=list)
    drains_read: float = 0.0

    # -- looking --------------------------------------------------------------------------------

    def current_drains(self, max_age: float = 2.0) -> list[Drain]:
        """The history's drains, read again at most every ``max_age`` s (another controller, or
        the server, may drain too)."""
        now = time.monotonic()
        if now - self.drains_read > max_age:
            self.drains = [Drain.from_dict(d) for d in self.history.drains()]
            self.drains_read = now
        return self.drains

    def look(self, rec: Mapping[str, Any], states: Mapping[str, Any], now: float | None = None,
             hangs_on_host: bool = False, gpus_on_host: bool = False) -> Fault | None:
        """What, if anything, says this running job must be stopped now. ``hangs_on_host``: the
        job's host restarts it itself after a hang (``heals_on_host``): no hang is this look's.
        ``gpus_on_host``: its host moves it off a failed GPU itself, or stops it (``gpu_fault``)."""
        now = time.time() if now is None else now
        job_id = str(rec["job_id"])
        spec = HealthSpec.from_dict((rec.get("spec") or {}).get("health"))
        attempt = int(rec.get("restarts") or 0)
        progress = [p for st in states.values() if isinstance(st, dict)
                    for p in (st.get("progress") or {}).values() if int(p.get("attempt") or 0) == attempt]
        inside, ended = sections_of(progress)
        seen = self.watch.observe(job_id, attempt, [_num(p.get("step")) for p in progress], now, spec,
                                  inside, ended)
        self._resumed(job_id, attempt, seen.last_step, now)
        host = self._host_fault(job_id, states, spec, now)  # it keeps when each host last answered: always
        # While a host is out of reach, the others' stall is its doing: host_timeout judges it.
        away = any(not isinstance(st, dict) for st in states.values())
        # Every rank past its program's end, on its way out (agent/stacks.py's exit marks): a
        # slow exit is not a hang.
        exiting = bool(progress) and all(p.get("exiting") for p in progress)
        return (self.gpu_fault(rec, states, now, on_host=gpus_on_host) or self._drained(rec) or host
                or self._nan_fault(job_id, progress, spec)
                or (None if away or hangs_on_host or exiting else self._host_hang(states, attempt, spec)
                    or self._idle_hang(states, attempt, spec) or self._hang_fault(job_id, spec, now)))

    def gpu_fault(self, rec: Mapping[str, Any], states: Mapping[str, Any], now: float | None = None,
                  on_host: bool = False) -> Fault | None:
        """A GPU of the job that its host judges unhealthy (the first found), as a fault.

        ``on_host``: the job's host acts on it first (agent/jobhost.py: it moves the ranks to a
        spare GPU there and restarts them in place, or stops the job, which the gang rules then
        move as a failed one), so this look leaves it alone while the host is healing and for
        ``BACKSTOP_S`` after it first saw it: one owner of each restart. Past that, a host that
        did nothing (an agent without the rule) leaves it to this look."""
        now = time.time() if now is None else now
        mine = job_gpus(rec)
        for host, st in states.items():
            if not isinstance(st, dict):
                continue
            for g in st.get("gpu_health") or []:
                index = g.get("index")
                if g.get("health") == UNHEALTHY and index in mine.get(host, ()):
                    what = g.get("reason") or "unhealthy"
                    sim = " (simulated)" if g.get("simulated") else ""
                    fault = Fault("gpu", f"{host} GPU {index}{sim}: {what}", host=host, gpu=int(index),
                                  what=f"{what}{sim}")
                    if not on_host:
                        return fault
                    first = self.gpu_seen.setdefault((str(rec["job_id"]), host, int(index)), now)
                    if not st.get("healing") and now - first >= BACKSTOP_S:
                        return fault
        return None

    def _drained(self, rec: Mapping[str, Any]) -> Fault | None:
        """An operator's ``drain --now`` of a GPU or host the job runs on."""
        mine = job_gpus(rec)
        for d in self.current_drains():
            if not d.now or d.host not in mine:
                continue
            if d.gpu is None or d.gpu in mine[d.host]:
                why = f" ({d.reason})" if d.reason else ""
                return Fault("drain", f"{d.target} drained by {d.who}{why}", host=d.host, gpu=d.gpu)
        return None

    def _host_fault(self, job_id: str, states: Mapping[str, Any], spec: HealthSpec, now: float) -> Fault | None:
        """A host out of reach for ``host_timeout``; or, at once, out of reach while every other
        host of the job says its ranks are asleep with no step for their quiet timeout (``idle``,
        agent/hangrule.py): the job waits for it, so waiting longer only loses time."""
        reachable = {h: st for h, st in states.items() if isinstance(st, dict)}
        stalled = bool(reachable) and all(isinstance(st.get("idle"), dict) for st in reachable.values())
        for host, st in states.items():
            key = (job_id, host)
            if isinstance(st, dict):
                self.answered[key] = now
                self.unreachable.pop(key, None)
                continue
            # Out of reach since it last answered (a cut link makes the look that finds it wait)
            since = self.unreachable.setdefault(key, self.answered.get(key, now))
            if now - since >= spec.host_timeout:
                return Fault("host", f"{host} unreachable for {now - since:.0f} s ({st})", host=host,
                             detect_s=now - since)
            if stalled:
                return Fault("host", f"{host} unreachable for {now - since:.0f} s ({st}), and the job waits for it: "
                             f"every rank on {', '.join(sorted(reachable))} asleep with no step", host=host,
                             detect_s=now - since)
        return None

    def _nan_fault(self, job_id: str, progress: Sequence[Mapping[str, Any]], spec: HealthSpec) -> Fault | None:
        """A loss that every reporting rank reports as NaN or inf for NAN_RUN reports in a row (the
        reports this watch reads: each poll's newest step)."""
        if spec.on_nan == "ignore":
            return None
        with_loss = [p for p in progress if p.get("loss") is not None and _num(p.get("step")) is not None]
        if not with_loss:
            return None
        step = max(_num(p.get("step")) or 0.0 for p in with_loss)
        if step <= self.seen_steps.get(job_id, float("-inf")):
            return None
        self.seen_steps[job_id] = step
        newest = [p for p in with_loss if _num(p.get("step")) == step]
        run = self.bad.setdefault(job_id, [])
        if all(bad_loss(p.get("loss")) for p in newest):
            run.append(step)
        else:
            run.clear()
            self.good_steps[job_id] = step
        if len(run) < NAN_RUN:
            return None
        # The first bad step is after the last good one this guard read, and at or before the
        # first bad one it read: a slow look can miss steps between them, and a checkpoint
        # saved there may hold the NaN. The restart resumes before the step after the last good.
        good = self.good_steps.get(job_id)
        first = run[0] if good is None else min(run[0], good + 1)
        run.clear()
        return Fault("nan", f"loss is NaN or inf at every reporting rank since step {first:g}", last_step=first,
                     restart=spec.on_nan == "restart")

    def _hang_fault(self, job_id: str, spec: HealthSpec, now: float) -> Fault | None:
        hang = self.watch.hang(job_id, spec, now, margin=BACKSTOP_S)
        if hang is None:
            return None
        return Fault("hang", hang.message(), last_step=hang.last_step, detect_s=hang.stalled_s,
                     restart=spec.on_hang != "fail", section=hang.section, timeout_s=hang.timeout_s)

    def _host_hang(self, states: Mapping[str, Any], attempt: int, spec: HealthSpec) -> Fault | None:
        """A hang a job host judged on its own ranks (agent/jobhost.py, by the same rule), with the
        stacks it took: acted on at this look, without waiting out this watch's own timer. The
        stacks of every host that recorded one go with it (the controller asks the others)."""
        hangs = {h: st["hang"] for h, st in states.items() if isinstance(st, dict) and isinstance(st.get("hang"), dict)
                 and int(st.get("restart_count") or 0) == attempt}
        if not hangs:
            return None
        host, first = min(hangs.items(), key=lambda kv: float(kv[1].get("at") or 0))
        stacks = {h: list(v.get("stacks") or []) for h, v in hangs.items()}
        return Fault("hang", f"{first.get('message')}, judged by {host}'s job host",
                     last_step=_num(first.get("last_step")), detect_s=_num(first.get("stalled_s")),
                     restart=spec.on_hang != "fail",
                     section=first.get("section"), timeout_s=_num(first.get("timeout_s")), stacks=stacks)

    def _idle_hang(self, states: Mapping[str, Any], attempt: int, spec: HealthSpec) -> Fault | None:
        """A quiet hang (agent/hangrule.py): every host of the job says its ranks have waited
        asleep with no step (``idle`` in its state, said at part of the quiet timeout, its times
        counted on by the host's agent at each answer), each for its whole quiet timeout. Judged
        here, since no host sees the others' ranks; the one that has waited least says for how
        long. The stacks each host took when it said so go with it (nothing ran since)."""
        live = [(h, st) for h, st in states.items() if isinstance(st, dict)]
        if not live or any(int(st.get("restart_count") or 0) != attempt for _, st in live):
            return None
        idle: dict[str, Mapping[str, Any]] = {h: st["idle"] for h, st in live if isinstance(st.get("idle"), dict)}
        if len(idle) != len(live):
            return None

        def waited(v: Mapping[str, Any]) -> float:  # no step, every rank asleep: the shorter
            stalled = _num(v.get("stalled_s")) or 0.0
            asleep = _num(v.get("asleep_s"))
            return stalled if asleep is None else min(stalled, asleep)

        least = min(idle.values(), key=waited)
        stalled, timeout = waited(least), _num(least.get("timeout_s"))
        if timeout is None or stalled < timeout:
            return None
        verdict = hangrule.Verdict(hangrule.STEP, stalled, timeout, _num(least.get("last_step")), "quiet",
                                   _num(least.get("learned_from")))
        stacks = {h: list(v["stacks"]) for h, v in idle.items() if isinstance(v.get("stacks"), list) and v["stacks"]}
        return Fault("hang", f"{verdict.message()}, judged by the controller: every host's ranks asleep "
                     f"({', '.join(sorted(idle))})", last_step=_num(least.get("last_step")),
                     detect_s=stalled, restart=spec.on_hang != "fail",
                     section=least.get("section"), timeout_s=timeout, stacks=stacks)

    # -- recording ------------------------------------------------------------------------------

    def record(self, job_id: str, fault: Fault, attempt: int, stopped_at: float,
               detected_at: float | None = None) -> int:
        """Keep the incident (``detected_at``: when the fault was found, default ``stopped_at``:
        when the attempt was told to stop); the restart's moments are added as they come
        (``restart_began``, ``_resumed``), its cost when the next attempt takes its first step."""
        seen = self.watch.jobs.get(job_id)
        last = fault.last_step if fault.last_step is not None else seen.last_step if seen is not None else None
        inc = Incident(kind=fault.kind, detected_at=stopped_at if detected_at is None else detected_at,
                       message=fault.message, host=fault.host, gpu=fault.gpu, rank=fault.rank,
                       detect_s=fault.detect_s, last_step=last, attempt=attempt, section=fault.section,
                       timeout_s=fault.timeout_s, stopped_at=stopped_at)
        seq = self.history.add_incident(job_id, inc.to_dict())
        self._clear(job_id)  # the next attempt is watched afresh
        self.pending[job_id] = _Pending(seq, stopped_at, attempt, last)
        return seq

    def restart_began(self, job_id: str, stopped_at: float, started_at: float | None = None) -> None:
        """The failed attempt is gone from every host (``stopped_at``), and, once the engine has
        started the next one, ``started_at``: kept with the pending incident."""
        p = self.pending.get(job_id)
        if p is None:
            return
        p.stopped_at = stopped_at
        changes: dict[str, Any] = {"stopped_at": stopped_at}
        if started_at is not None:
            changes["started_at"] = started_at
        self.history.update_incident(job_id, p.seq, **changes)

    def _resumed(self, job_id: str, attempt: int, first_step: float | None, now: float) -> None:
        p = self.pending.get(job_id)
        if p is None or attempt <= p.attempt or first_step is None:
            return
        del self.pending[job_id]
        # (the steps run twice are read from the metrics, which have every step: see with_reruns)
        self.history.update_incident(job_id, p.seq, resumed_at=now, resume_s=round(now - p.stopped_at, 3))

    def forget(self, job_id: str) -> None:
        """The job ended: nothing more to watch (its incidents stay in the history)."""
        self._clear(job_id)

    def _clear(self, job_id: str) -> None:
        """Forget what was watched of the job's current attempt, and its pending incident."""
        self.watch.forget(job_id)
        self.pending.pop(job_id, None)
        self.bad.pop(job_id, None)
        self.seen_steps.pop(job_id, None)
        self.good_steps.pop(job_id, None)
        self.gpu_seen = {k: v for k, v in self.gpu_seen.items() if k[0] != job_id}
        self.unreachable = {k: v for k, v in self.unreachable.items() if k[0] != job_id}
        self.answered = {k: v for k, v in self.answered.items() if k[0] != job_id}


def with_reruns(incidents: Sequence[Incident], records: Sequence[Mapping[str, Any]]) -> list[Incident]:
    """Each incident with the steps its next attempt computed again: from its last step before
    the stop to the first step the next attempt reported (it resumed from a checkpoint before).
    An incident whose resumption no supervisor saw live (the next attempt ran while none looked,
    or ran its course between two looks on a loaded machine) gets it from the metrics: the time
    of the next attempt's first record."""
    first: dict[int, float] = {}
    first_at: dict[int, float] = {}
    for r in records:
        s = _num(r.get("step"))
        if s is None or r.get("event") is not None:
            continue
        a = int(r.get("restart") or 0)
        first[a] = min(first.get(a, s), s)
        t = _num(r.get("time"))
        if t is not None:
            first_at[a] = min(first_at.get(a, t), t)
    out = []
    for inc in incidents:
        nxt = first.get(inc.attempt + 1)
        if inc.last_step is not None and nxt is not None:
            inc = dataclasses.replace(inc, steps_rerun=max(0, int(inc.last_step - nxt) + 1))
        at = first_at.get(inc.attempt + 1)
        if inc.resumed_at is None and at is not None and at >= inc.detected_at:
            inc = dataclasses.replace(inc, resumed_at=at, resume_s=round(at - inc.detected_at, 3))
        out.append(inc)
    return out


def host_heals(states: Mapping[str, Any], attempt: int) -> list[tuple[str, Mapping[str, Any]]]:
    """The restarts the job's hosts made in place (``state.json``'s ``heals``, agent/jobhost.py)
    that the history does not have yet: each ended an attempt at or after ``attempt`` (the
    history's newest), oldest first, with its host."""
    found = [(str(h), x) for h, st in states.items() if isinstance(st, dict)
             for x in st.get("heals") or () if isinstance(x, Mapping) and int(x.get("attempt", -1)) >= attempt]
    return sorted(found, key=lambda hx: int(hx[1]["attempt"]))


def adopted(host: str, heal: Mapping[str, Any]) -> tuple[dict[str, Any], Incident]:
    """A restart a job host made in place, as the history keeps a controller's own: the incident
    event's cause (with the stacks of a hang, summed up) and the incident with its cost."""
    by = f"{host}'s job host"
    message = str(heal.get("message") or f"{heal.get('kind')} on {host}")
    cause: dict[str, Any] = {"message": message, "kind": str(heal.get("kind") or "exit"), "host": host,
                             "healed_by": by}
    if heal.get("kind") == "hang":
        summary, rows = stack_summary({host: list(heal.get("stacks") or [])})
        cause["message"] = f"{message}, judged by {by}; {summary}"
        cause["stacks"] = rows
    for k in ("rank", "last_step", "section", "timeout_s"):
        if heal.get(k) is not None:
            cause[k] = heal[k]
    gpu = gpu_moved(heal)
    if gpu is not None:
        cause.update(gpu=gpu[0], moved_to=gpu[1])
    stopped, resumed = _num(heal.get("stopped_at")), _num(heal.get("resumed_at"))
    inc = Incident(stopped_at=stopped, started_at=_num(heal.get("started_at")),
                   kind=cause["kind"], detected_at=float(heal.get("detected_at") or stopped or time.time()),
                   message=cause["message"], host=host, gpu=gpu[0] if gpu is not None else None,
                   rank=heal.get("rank"), detect_s=_num(heal.get("detect_s")),
                   last_step=_num(heal.get("last_step")), attempt=int(heal["attempt"]), section=heal.get("section"),
                   timeout_s=_num(heal.get("timeout_s")), resumed_at=resumed, healed_by=by,
                   resume_s=round(resumed - stopped, 3) if resumed is not None and stopped is not None else None)
    return cause, inc


def gpu_moved(heal: Mapping[str, Any]) -> tuple[int, list[int], dict[int, int]] | None:
    """A GPU incident a job host healed in place by moving its ranks off the failed GPU
    (agent/jobhost.py ``gpu_move_fields``): (the failed GPU, the host's GPUs for the job after the
    move, each failed GPU -> its spare), or None (another kind of heal, or a record not to trust)."""
    if heal.get("kind") != "gpu":
        return None
    gpu, gpus, moved = heal.get("gpu"), heal.get("gpus"), heal.get("moved")
    if not isinstance(gpu, int) or not _index(gpu) or not isinstance(gpus, list) or not gpus:
        return None
    if not all(_index(g) for g in gpus) or not isinstance(moved, Mapping):
        return None
    moves: dict[int, int] = {}
    for k, v in moved.items():
        if not str(k).isdigit() or not _index(v):
            return None
        moves[int(k)] = int(v)
    if gpu not in moves or any(m in moves for m in gpus):
        return None
    return gpu, [int(g) for g in gpus], moves


def moved_placement(placement: Sequence[Mapping[str, Any]], host: str, gpus: Sequence[int]) -> list[dict[str, Any]]:
    """The job's placement with ``host``'s GPUs replaced by ``gpus`` (a job host moved its ranks)."""
    return [dict(n, gpus=list(gpus)) if n.get("host") == host else dict(n) for n in placement]


def _index(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def stack_summary(stacks: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """From each host's ``job_stacks`` answer: a sentence for the cause (the ranks not inside a
    collective call and where they are; when every rank is inside one, where rank 0 is) and the
    per-rank rows kept with the incident."""
    rows: list[dict[str, Any]] = []
    for host, got in stacks.items():
        for s in getattr(got, "stacks", ()) or ():
            rows.append({"host": host, "rank": s.rank, "pid": s.pid, "top": s.top, "in_collective": s.in_collective})
        if isinstance(got, (list, tuple)):  # the rows a job host recorded with its hang
            rows += [{"host": host, "rank": r.get("rank"), "pid": r.get("pid"), "top": r.get("top"),
                      "in_collective": bool(r.get("in_collective"))} for r in got if isinstance(r, Mapping)]
    rows.sort(key=lambda r: (r["rank"], r["pid"]))
    if not rows:
        return "no Python stacks could be taken", rows
    outside = [r for r in rows if not r["in_collective"]]
    if outside and len(outside) < len(rows):
        where = "; ".join(f"rank {r['rank']} at {r['top']}" for r in outside[:4])
        return f"not in a collective: {where}", rows
    if not outside:
        return f"every rank waits in a collective (rank {rows[0]['rank']} at {rows[0]['top']})", rows
    return f"stacks of {len(rows)} rank(s) in the logs (rank {rows[0]['rank']} at {rows[0]['top']})", rows


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)
