"""The job queue: a job that does not fit now waits, in history, and starts when it fits.

Order: higher ``priority`` first. Within one priority, with ``[queue] order = "fairshare"`` (the
default), the owner whose top-level account (group, or the user alone) and then whose own
fair-share factor is higher goes first (tui/model/fairshare.py), first come first among equals;
with ``order = "fifo"`` first come first. The line is strict: a job never jumps ahead of one
that comes before it in this order and still waits (no job starves behind a stream of smaller
ones). Fair share keeps that true over time: a waiting owner's decayed usage only shrinks, so
their factor only rises, and an owner with nothing running reaches the top of their priority
within a few half-lives. Two exceptions, both named in what the job waits for: a job over its
owner's quota (``[[quota]]``) waits without holding back the jobs behind it, and a job that
cannot start otherwise may preempt running ``preemptible`` jobs of lower priority (they go back
to the queue and resume from their checkpoints). A job that could never fit (more GPUs than the
candidate hosts have at all) is refused at once, as before; only "not now" waits.

Whoever runs the controller advances the queue: the server (always on), or the app and a
``launch --wait`` in embedded mode (so there a queue advances only while one of them runs). Each
start goes through ``History.take_queued``, so of two controllers only one starts a given job.
The hosts' GPU claims stay the last word: a start that finds its GPUs claimed goes back to
waiting, with the claim as its reason.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

from tui.control.jobs import JobError, JobManager, JobView, new_job_id
from tui.model.fairshare import (
    WEEK_S,
    QueuePolicy,
    Shares,
    decayed_gpu_hours,
    job_gpus,
    job_priority,
    job_user,
    preempt_pending,
    preemptible,
    projected_gpu_hours,
    quota_block,
    run_intervals,
    shares,
)
from tui.model.identity import local_user
from tui.model.jobspec import JobSpec
from tui.model.jobstate import FAILED, PENDING, QUEUED, RUNNING, STOPPING, TERMINAL
from tui.model.scheduler import HostCapacity, PlacementError, Scheduler
from tui.remote.transport import TransportError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QueueEntry:
    """One waiting job: its place in line (1 = next), and what it waits for."""

    position: int
    job_id: str
    name: str
    priority: int
    queued_at: float
    waiting: str  # hosts and GPUs named: "h2 0 GPUs (GPU 0,1 claimed by job 'a' ...)" or "behind job x"
    hosts: tuple[str, ...]  # the hosts it may use (the spec's, or every inventory host)
    gpus: int  # GPUs it needs in all (0: CPU processes only)
    user: str = "?"  # who owns it
    fairshare: float | None = None  # its owner's fair-share factor (0..1], None with order = "fifo"
    preempted: int = 0  # times it was stopped for a higher-priority job


@dataclass
class _Line:
    """The queue as one round sees it: the waiting jobs in order, every job that holds GPUs or
    used them lately, and the owners' fair-share factors."""

    queued: list[dict[str, Any]]
    recent: list[dict[str, Any]]
    shares: Shares
    now: float
    used: dict[str, float] = dataclasses.field(default_factory=dict)  # user -> decayed GPU-hours
    held: dict[str, int] = dataclasses.field(default_factory=dict)  # user -> GPUs held (or starting) now


def _free_of_others(capacity: list[HostCapacity]) -> list[HostCapacity]:
    """The hosts as they would be with nothing else running: every host up, every GPU free (a
    Slurm job's GPUs too: it ends)."""
    return [dataclasses.replace(c, up=True, status="up", foreign_busy=(), foreign_users=(), job_busy=(),
                                claimed=(), slurm=()) for c in capacity]


class JobQueue:
    def __init__(self, manager: JobManager, policy: QueuePolicy | None = None):
        self.jm = manager
        self.history = manager.history
        self.policy = policy or QueuePolicy()

    # -- the order --------------------------------------------------------------------------

    def line(self, now: float | None = None) -> _Line:
        now = time.time() if now is None else now
        queued = self.history.queued()
        if not queued and not self.policy.quotas:
            return _Line([], [], Shares({}, {}, {}), now)
        recent = self.history.recent(now - max(WEEK_S, 5 * self.policy.half_life_s))
        line = _Line(queued, recent, Shares({}, {}, {}), now)
        if self.policy.fair:
            for r in recent:
                u = job_user(r)
                line.used[u] = line.used.get(u, 0.0) + decayed_gpu_hours(run_intervals(r, now), now,
                                                                         self.policy.half_life_s)
                if r.get("state") not in TERMINAL and r.get("state") != QUEUED:
                    line.held[u] = line.held.get(u, 0) + job_gpus(r.get("spec") or {})
            self._order(line)
        return line

    def _order(self, line: _Line, start: int = 0) -> None:
        """Sort ``line.queued[start:]`` by fair share, from its usage and held GPUs."""
        half = self.policy.half_life_s
        usage = {u: projected_gpu_hours(line.used.get(u, 0.0), line.held.get(u, 0), half)
                 for u in line.used.keys() | line.held.keys()}
        line.shares = shares(self.policy, usage.keys() | {job_user(r) for r in line.queued}, usage)
        line.queued[start:] = sorted(line.queued[start:], key=self._key(line.shares))

    def _key(self, sh: Shares) -> Any:
        def key(rec: dict[str, Any]) -> tuple[Any, ...]:
            return (-job_priority(rec), *sh.key(job_user(rec)), float(rec["created"]), rec["job_id"])

        return key

    def _over_quota(self, line: _Line, user: str, gpus: int) -> str | None:
        if not self.policy.quotas:
            return None
        return quota_block(self.policy, user, gpus, line.recent, line.now)

    # -- submitting -------------------------------------------------------------------------

    def submit(self, spec: JobSpec, *, queue: bool = True, job_id: str | None = None, look: bool = True,
               user: str | None = None) -> JobView:
        """Start ``spec`` now if it fits, its owner's quotas allow it and nothing waits ahead of
        it; else, with ``queue``, record it as queued. Raises PlacementError for a job that
        cannot ever fit (or, without ``queue``, cannot start now: no room, or a quota), JobError
        for a bad host name or a failed start. ``user``: who owns it (default: this account)."""
        job_id = job_id or new_job_id(spec.name)
        self.jm.check_joined(user)  # a server's member who must join first: nothing recorded
        user = user if user is not None else local_user()
        if getattr(self.jm.ctl.inventory, "slurm", None) is not None:
            # A Slurm cluster: Slurm's queue, priorities and fair share decide when it runs
            # (tui/control/engines.py); rigdeck's own queue holds none of its jobs.
            return self.jm.launch(spec, job_id=job_id, look=look, user=user)
        self.jm.check_pins(spec)  # a pool pinned to hosts or labels the inventory lacks: never fits
        spec = self.jm.snapshot_code(spec)  # [code] sync: the files as they are now
        line = self.line()
        over = self._over_quota(line, user or "?", job_gpus(spec.to_dict()))
        if over is not None and not queue:
            raise PlacementError(f"not started: {over}")
        mine = self._key(line.shares)({"priority": spec.priority, "user": user, "created": time.time(),
                                      "job_id": job_id})
        ahead = [r for r in line.queued if self._key(line.shares)(r) < mine
                 and self._over_quota(line, job_user(r), job_gpus(r.get("spec") or {})) is None]
        if over is not None:
            waiting = over
        elif not ahead or not queue:
            try:
                return self.jm.launch(spec, job_id=job_id, look=look, user=user)
            except (PlacementError, JobError) as e:
                if not queue or not self._transient(e):
                    raise
                waiting = str(e)
        else:
            waiting = f"behind job {ahead[-1]['job_id']}"
        self._check_feasible(spec, user)
        self.history.create(job_id, spec.name, spec.to_dict(), state=QUEUED, user=user)
        self.history.update(job_id, priority=spec.priority, waiting=waiting)
        self.history.add_event(job_id, {"event": "queued", "waiting": waiting})
        if over is None and not ahead and queue:
            # At the head of the line and no room: make room now if preemption can.
            rec = self.history.get(job_id) or {}
            try:
                room = self._make_room(rec, spec, self.jm.capacity(self.candidates(spec)), self.line())
            except TransportError:
                room = None
            if room is not None:
                self._wait(rec, room)
        return self.jm.view(job_id, live=False)

    @staticmethod
    def _transient(e: Exception) -> bool:
        """A refusal that waiting mends: GPUs busy, or claimed on a host by another controller's
        job, a host down. Not bad input (unknown hosts), and not a host short of disk: that
        needs a person, and is said at once."""
        if isinstance(e, PlacementError):
            return True
        text = str(e)
        # The claim race is lost at the claim ("claimed by") or, a moment earlier, at the hosts'
        # preflight check ("GPU 1 on h1 is held by job ..."): either way the GPUs free up later.
        held = "claimed" in text or " is held by " in text
        return "nothing was started" in text and held and "min_free_mb" not in text

    def candidates(self, spec: JobSpec | dict[str, Any]) -> list[str]:
        """The hosts ``spec`` may run on: its own list, or every inventory host."""
        hosts = spec.get("hosts") if isinstance(spec, dict) else spec.hosts
        return list(hosts) if hosts else list(self.jm.ctl.inventory.names)

    def _check_feasible(self, spec: JobSpec, user: str | None = None) -> None:
        """PlacementError if ``spec`` could not fit even on idle hosts: it would wait forever.
        Only the hosts its owner's jobs may run on count: on a shared server, a person with
        accounts of their own has their hosts (``JobManager.for_owner``), so a job that fits only
        where they have none is refused now rather than left waiting."""
        jm = self.jm.for_owner(user)
        capacity = jm.capacity(list(spec.hosts) if spec.hosts else list(jm.ctl.inventory.names))
        try:
            Scheduler().reserve("feasibility", spec, _free_of_others(capacity))
        except PlacementError as e:
            raise PlacementError(f"{e} (it would not fit even on idle hosts, so it is not queued)") from None

    # -- the line ---------------------------------------------------------------------------

    def entries(self) -> list[QueueEntry]:
        line = self.line()
        out = []
        for i, rec in enumerate(line.queued, start=1):
            spec = rec.get("spec") or {}
            user = job_user(rec)
            out.append(QueueEntry(
                position=i, job_id=rec["job_id"], name=rec["name"], priority=int(rec.get("priority") or 0),
                queued_at=float(rec["created"]), waiting=rec.get("waiting") or "",
                hosts=tuple(spec.get("hosts") or self.jm.ctl.inventory.names), gpus=job_gpus(spec),
                user=user, fairshare=round(line.shares.factor.get(user, 1.0), 4) if self.policy.fair else None,
                preempted=int(rec.get("preempted") or 0)))
        return out

    def advance(self) -> list[str]:
        """Start waiting jobs that fit now, in order, up to the first that does not (a job over
        its quota waits without holding back the rest). Returns the ids started."""
        line = self.line()
        if self._finish_preemptions(line):
            line = self.line()  # a preempted job is back in line, its GPUs free
        started: list[str] = []
        blocked_by: str | None = None
        i = -1
        while i + 1 < len(line.queued):
            i += 1
            rec = line.queued[i]
            job_id = rec["job_id"]
            if blocked_by is not None:
                self._wait(rec, f"behind job {blocked_by}")
                continue
            spec = JobSpec.from_dict(rec["spec"])
            over = self._over_quota(line, job_user(rec), job_gpus(rec["spec"]))
            if over is not None:
                self._wait(rec, over)
                continue
            # Whether it fits is asked before the job is taken from the line: a job that does
            # not fit stays queued (and listed) throughout, instead of leaving the line for each
            # try.
            try:
                capacity = self.jm.capacity(self.candidates(spec))
            except TransportError as e:
                self._wait(rec, str(e))
                blocked_by = job_id
                continue
            problem = self.jm.scheduler.fits(spec, capacity)
            if problem is not None:
                self._wait(rec, self._make_room(rec, spec, capacity, line) or str(problem))
                blocked_by = job_id
                continue
            if self._start(rec, spec, capacity):
                started.append(job_id)
                line.recent.append(self.history.get(job_id) or rec)  # counts for the quotas at once
                if self.policy.fair:  # and for fair share: the rest of the line is ordered again
                    user = job_user(rec)
                    line.held[user] = line.held.get(user, 0) + job_gpus(rec["spec"])
                    self._order(line, i + 1)
            elif (self.history.get(job_id) or {}).get("state") == QUEUED:
                blocked_by = job_id
        return started

    def _start(self, rec: dict[str, Any], spec: JobSpec, capacity: list[HostCapacity]) -> bool:
        """Take one job from the line and start it; False when it stays queued (a lost claim
        race) or failed to start (recorded)."""
        job_id = rec["job_id"]
        if not self.history.take_queued(job_id):
            return False  # cancelled, or another controller took it
        try:
            self.jm.launch(spec, job_id=job_id, capacity=capacity)
        except (PlacementError, JobError) as e:
            rec_now = self.history.get(job_id) or {}
            if rec_now.get("state") == PENDING and self._transient(e):
                self.history.update(job_id, state=QUEUED)
                self._wait(rec, str(e))
                return False
            log.info("queued job %s failed to start: %s", job_id, e)
            if rec_now.get("state") == PENDING:  # refused before anything started
                self.history.update(job_id, state=FAILED, ended=time.time(),
                                    cause={"message": f"start failed: {e}"})
            return False
        except Exception:
            log.exception("queued job %s: start raised", job_id)
            self.history.update(job_id, state=FAILED, ended=time.time(),
                                cause={"message": "start failed: internal error (see the log)"})
            return False
        self.history.add_event(job_id, {"event": "dequeued", "waited_s": round(time.time() - rec["created"], 3)})
        return True

    def _wait(self, rec: dict[str, Any], waiting: str) -> None:
        if rec.get("waiting") != waiting:
            self.history.update(rec["job_id"], waiting=waiting)

    # -- preemption -------------------------------------------------------------------------

    def _make_room(self, rec: dict[str, Any], spec: JobSpec, capacity: list[HostCapacity],
                   line: _Line) -> str | None:
        """For the head of the line, which does not fit: stop the fewest running preemptible
        jobs of lower priority on its hosts whose GPUs would let it start (lowest priority first,
        then the newest: it loses the least). What it waits for then, or None when preemption
        cannot make room (or is off)."""
        if not self.policy.preemption:
            return None
        hosts = set(self.candidates(spec))
        on_hosts = [r for r in line.recent if hosts & {n["host"] for n in r.get("placement") or ()}]
        going = [r["job_id"] for r in on_hosts if r.get("state") == STOPPING and preempt_pending(r)]
        if going and self.jm.scheduler.fits(spec, capacity, without=going) is None:
            return f"preempting job {', '.join(going)} (it starts once they have stopped)"
        victims = sorted((r for r in on_hosts if r.get("state") == RUNNING and preemptible(r.get("spec") or {})
                          and job_priority(r) < spec.priority and r["job_id"] not in going),
                         key=lambda r: (job_priority(r), -float(r.get("started") or 0)))
        chosen: list[str] = []
        for v in victims:
            chosen.append(v["job_id"])
            if self.jm.scheduler.fits(spec, capacity, without=going + chosen) is None:
                break
        else:
            return None
        for v_id in list(chosen[:-1]):  # one chosen early may not be needed after all
            rest = [c for c in chosen if c != v_id]
            if self.jm.scheduler.fits(spec, capacity, without=going + rest) is None:
                chosen = rest
        for v_id in chosen:
            self._preempt(v_id, rec["job_id"])
        self.history.add_event(rec["job_id"], {"event": "preempting", "jobs": chosen})
        return f"preempting job {', '.join(going + chosen)} (it starts once they have stopped)"

    def _preempt(self, victim: str, for_job: str) -> None:
        """Stop ``victim`` through the ordinary stop (SIGTERM, its grace, then the gang stop) and
        mark it to go back to the queue once its hosts are done."""
        rec = self.history.get(victim) or {}
        log.info("preempting %s for %s", victim, for_job)
        self.jm.stop(victim, wait=False)
        self.history.update(victim, preempted=int(rec.get("preempted") or 0) + 1)
        self.history.add_event(victim, {"event": "preempted", "by": for_job})

    def _finish_preemptions(self, line: _Line) -> bool:
        """Look at the jobs being preempted: one whose hosts are done goes back to the queue
        (JobManager's gang rules do it), so its GPUs count as free for the next start. Whether
        any did."""
        back = False
        for rec in line.recent:
            if rec.get("state") != STOPPING or not preempt_pending(rec):
                continue
            try:
                self.jm.supervise_once(rec)
            except TransportError as e:
                log.info("preempted job %s: %s", rec["job_id"], e)
            back = back or (self.history.get(rec["job_id"]) or {}).get("state") == QUEUED
        return back
