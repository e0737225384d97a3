"""The job queue: a job that does not fit now waits, in history, and starts when it fits.

Order: higher ``priority`` first, first come first within one priority, strictly: a job never
jumps ahead of an earlier one of the same or higher priority that is still waiting (no job starves
behind a stream of smaller ones). A job that could never fit (more GPUs than the candidate hosts
have at all) is refused at once, as before; only "not now" waits.

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
from tui.model.identity import local_user
from tui.model.jobspec import JobSpec
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


def _free_of_others(capacity: list[HostCapacity]) -> list[HostCapacity]:
    """The hosts as they would be with nothing else running: every host up, every GPU free."""
    return [dataclasses.replace(c, up=True, status="up", foreign_busy=(), foreign_users=(), job_busy=(),
                                claimed=()) for c in capacity]


class JobQueue:
    def __init__(self, manager: JobManager):
        self.jm = manager
        self.history = manager.history

    # -- submitting -------------------------------------------------------------------------

    def submit(self, spec: JobSpec, *, queue: bool = True, job_id: str | None = None, look: bool = True,
               user: str | None = None) -> JobView:
        """Start ``spec`` now if it fits and nothing of equal or higher priority waits; else,
        with ``queue``, record it as queued. Raises PlacementError for a job that cannot ever fit
        (or, without ``queue``, does not fit now), JobError for a bad host name or a failed start.
        ``user``: the job's owner, stored as its record's ``user`` (default: the local account)."""
        user = user or local_user()
        job_id = job_id or new_job_id(spec.name)
        self.jm.check_pins(spec)  # a pool pinned to hosts or labels the inventory lacks: never fits
        spec = self.jm.snapshot_code(spec)  # [code] sync: the files as they are now
        ahead = [r for r in self.history.queued() if int(r.get("priority") or 0) >= spec.priority]
        if not ahead or not queue:
            try:
                return self.jm.launch(spec, job_id=job_id, look=look, user=user)
            except (PlacementError, JobError) as e:
                if not queue or not self._transient(e):
                    raise
                waiting = str(e)
        else:
            waiting = f"behind job {ahead[-1]['job_id']}"
        self._check_feasible(spec)
        self.history.create(job_id, spec.name, spec.to_dict(), state="queued")
        self.history.update(job_id, priority=spec.priority, waiting=waiting, user=user)
        self.history.add_event(job_id, {"event": "queued", "waiting": waiting})
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

    def _check_feasible(self, spec: JobSpec) -> None:
        """PlacementError if ``spec`` could not fit even on idle hosts: it would wait forever."""
        capacity = self.jm.capacity(self.candidates(spec))
        try:
            Scheduler().reserve("feasibility", spec, _free_of_others(capacity))
        except PlacementError as e:
            raise PlacementError(f"{e} (it would not fit even on idle hosts, so it is not queued)") from None

    # -- the line ---------------------------------------------------------------------------

    def entries(self) -> list[QueueEntry]:
        out = []
        for i, rec in enumerate(self.history.queued(), start=1):
            spec = rec.get("spec") or {}
            nodes = int(spec.get("nodes") or len(spec.get("hosts") or []) or 1)
            gpus = nodes * int(spec.get("gpus_per_node") or 0) + sum(
                int(p.get("replicas") or 1) * int(p.get("gpus_per_replica") or 0) for p in spec.get("pools") or ())
            out.append(QueueEntry(
                position=i, job_id=rec["job_id"], name=rec["name"], priority=int(rec.get("priority") or 0),
                queued_at=float(rec["created"]), waiting=rec.get("waiting") or "",
                hosts=tuple(spec.get("hosts") or self.jm.ctl.inventory.names), gpus=gpus))
        return out

    def advance(self) -> list[str]:
        """Start waiting jobs that fit now, in order, up to the first that does not. Returns the
        ids started."""
        started: list[str] = []
        blocked_by: str | None = None
        for rec in self.history.queued():
            job_id = rec["job_id"]
            if blocked_by is not None:
                self._wait(rec, f"behind job {blocked_by}")
                continue
            spec = JobSpec.from_dict(rec["spec"])
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
                self._wait(rec, str(problem))
                blocked_by = job_id
                continue
            if not self.history.take_queued(job_id):
                continue  # cancelled, or another controller took it
            try:
                self.jm.launch(spec, job_id=job_id, capacity=capacity)
            except (PlacementError, JobError) as e:
                rec_now = self.history.get(job_id) or {}
                if rec_now.get("state") == "pending" and self._transient(e):
                    self.history.update(job_id, state="queued")
                    self._wait(rec, str(e))
                    blocked_by = job_id
                    continue
                log.info("queued job %s failed to start: %s", job_id, e)
                if rec_now.get("state") == "pending":  # refused before anything started
                    self.history.update(job_id, state="failed", ended=time.time(),
                                        cause={"message": f"start failed: {e}"})
                continue
            except Exception:
                log.exception("queued job %s: start raised", job_id)
                self.history.update(job_id, state="failed", ended=time.time(),
                                    cause={"message": "start failed: internal error (see the log)"})
                continue
            self.history.add_event(job_id, {"event": "dequeued", "waited_s": round(time.time() - rec["created"], 3)})
            started.append(job_id)
        return started

    def _wait(self, rec: dict[str, Any], waiting: str) -> None:
        if rec.get("waiting") != waiting:
            self.history.update(rec["job_id"], waiting=waiting)
