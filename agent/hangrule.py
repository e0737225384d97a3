"""When a job is hung: the one rule, learned from the job itself, section by section.

A job's life is made of sections: its start-up (until the first step of an attempt), its steps,
and the sections its ranks say they are in (``runtime.section``: a checkpoint save, which
``runtime.Checkpointer`` marks on every rank, an evaluation). Each has its own pace, so each has
its own timeout: ``MULTIPLE`` times the longest interval the job itself took in that section,
at least ``FLOOR_S``. A section not seen often enough to learn from keeps the old defaults
(``DEFAULT_HANG_S``, and ``DEFAULT_STARTUP_S`` for the start-up), so a first slow save or a long
first step is never a hang. An explicit ``[health] hang_timeout`` (or ``startup_timeout``) wins
over anything learned.

**Quiet hangs, in seconds.** A hung data-parallel job is mostly asleep: the ranks that reached the
collective wait in it, the one that did not is blocked where it stopped. Where every process of
every rank (its children too) sleeps, using no CPU (``Idle``: at most ``QUIET_CPU_SHARE`` of a
core, none found running or in disk wait by two looks in a row), and no step has come for ``QUIET_MULTIPLE`` times
the job's typical step (the median of its recent step intervals, from the ranks' own record
times), at least ``QUIET_FLOOR_S``, the job is hung: ``Watch.quiet``. A slow step (compute, a
data loader's workers), a save, a rank starved of CPU all use CPU or run, so they are judged by
the rule above only; so is a collective that spins (NCCL's waits poll the GPU). Each job host
judges its own ranks: where they are the whole job it acts; otherwise it says so in its state
(``idle``) and the controller acts once every host of the job says so. An explicit
``hang_timeout`` turns it off.

The job host applies it to its own ranks (agent/jobhost.py) and the controller to what its
looks see (tui/model/health.py's ``ProgressWatch``): each feeds ``Watch`` what it observed, with
its own clock, and gets the same verdict and the same words. No I/O. Stdlib only, Python 3.9+.
"""
from __future__ import annotations

TYPE_CHECKING = False  # (mypy reads it as True) typing is not imported by a rank's or job's start
if TYPE_CHECKING:
    from typing import Dict, Iterable, Mapping, Optional, Tuple


STARTUP = "startup"
STEP = "step"
CHECKPOINT = "checkpoint"
EVAL = "eval"
SECTIONS = (STARTUP, STEP, CHECKPOINT, EVAL)
# When a rank is inside several (an evaluation that saves), the first named here is the one judged.
_PRECEDENCE = (CHECKPOINT, EVAL)

DEFAULT_HANG_S = 15 * 60.0  # a section not learned yet, with no hang_timeout
DEFAULT_STARTUP_S = 30 * 60.0  # the start-up, with no startup_timeout
MULTIPLE = 10.0  # a section's timeout: this many times the longest interval seen in it...
FLOOR_S = 15.0  # ...and at least this (a loaded machine pauses a process for seconds)
MIN_STEP_INTERVALS = 3  # step intervals seen before the steps' timeout is learned
QUIET_MULTIPLE = 10.0  # a quiet hang: no step for this many typical steps...
QUIET_FLOOR_S = 3.0  # ...and at least this, every rank asleep all along
QUIET_CPU_SHARE = 0.05  # asleep: a rank's processes used at most this share of one core
QUIET_SAY_SHARE = 0.5  # a job host of a job of several hosts says its ranks wait asleep at this share of it


def learned_timeout(longest: float) -> float:
    return max(FLOOR_S, MULTIPLE * longest)


def quiet_timeout(typical_step: float) -> float:
    return max(QUIET_FLOOR_S, QUIET_MULTIPLE * typical_step)


def typical(intervals: Iterable[float]) -> Optional[float]:
    """The median of the step intervals seen, once there are ``MIN_STEP_INTERVALS``."""
    seen = sorted(intervals)
    if len(seen) < MIN_STEP_INTERVALS:
        return None
    mid = len(seen) // 2
    return seen[mid] if len(seen) % 2 else (seen[mid - 1] + seen[mid]) / 2.0


class Idle:
    """Since when a set of ranks has been asleep, in one observer's clock. Fed a reading of each
    rank at every look: whether any process of it (the rank and its children) was running or in
    disk wait, and the CPU clock ticks all of them used so far. A rank is asleep from the last look
    that saw it use more than ``share`` of a core since the look before, or that found it running
    (or in disk wait) as the look before did. One look that finds it running is one moment: a
    sleeper woken by a timer or a signal (its stacks dumped) may wait for a core for a while on a
    loaded machine, using no more CPU than before; a rank that keeps running, or starved of CPU
    keeps waiting to, is found so by two looks in a row."""

    def __init__(self, share: float = QUIET_CPU_SHARE, hz: float = 100.0) -> None:
        self.share = share
        self.hz = hz
        # rank -> (asleep since, last look, ticks then, running then)
        self.refs = {}  # type: Dict[int, Tuple[float, float, int, bool]]

    def sample(self, now: float, readings: Mapping[int, Optional[Tuple[bool, int]]]) -> Optional[float]:
        """Since when every rank in ``readings`` has been asleep; None when any is awake, cannot be
        read (None), or there is none."""
        for rank in [r for r in self.refs if r not in readings]:
            del self.refs[rank]
        since = None  # type: Optional[float]
        awake = not readings
        for rank, got in readings.items():
            if got is None:
                self.refs.pop(rank, None)
                awake = True
                continue
            running, ticks = got
            ref = self.refs.get(rank)
            # a tick of slack: the clock's granularity, the look landing mid-tick; fewer ticks
            # than before: a child ended and its CPU left the count, so it is looked at afresh
            busy = ref is None or (running and ref[3]) or ticks < ref[2] or (
                ticks - ref[2] > self.share * (now - ref[1]) * self.hz + 1)
            start = now if busy or ref is None else ref[0]
            self.refs[rank] = (start, now, ticks, running)
            awake = awake or busy
            since = start if since is None else max(since, start)
        return None if awake else since

    def rebase(self, now: float, readings: Mapping[int, Optional[Tuple[bool, int]]]) -> None:
        """Take ``readings`` as the last look without judging it: the CPU an observer made the
        ranks use (their stacks, dumped on its signal) is not theirs. Each rank keeps its since."""
        for rank, got in readings.items():
            ref = self.refs.get(rank)
            if got is not None and ref is not None:
                self.refs[rank] = (ref[0], now, got[1], False)


class Verdict:
    """A hang: the section it is stuck in, for how long, and the timeout that judged it."""

    __slots__ = ("section", "stalled_s", "timeout_s", "last_step", "basis", "learned_from")

    def __init__(self, section: str, stalled_s: float, timeout_s: float, last_step: Optional[float],
                 basis: str, learned_from: Optional[float] = None) -> None:
        self.section = section
        self.stalled_s = stalled_s
        self.timeout_s = timeout_s
        self.last_step = last_step
        self.basis = basis  # "explicit" | "learned" | "default" | "quiet"
        self.learned_from = learned_from  # the interval the timeout was learned from (quiet: the typical step)

    def why(self) -> str:
        """The timeout and where it came from, e.g. ``step timeout 15 s, learned: 10 x the
        longest step seen (0.9 s), at least 15 s``."""
        if self.basis == "explicit":
            name = "startup_timeout" if self.section == STARTUP else "hang_timeout"
            return "%s %g s" % (name, self.timeout_s)
        what = {STARTUP: "first step", STEP: "step", CHECKPOINT: "checkpoint save", EVAL: "evaluation"}.get(
            self.section, self.section)
        if self.basis == "quiet":
            return ("quiet timeout %.0f s: every rank asleep, using no CPU; learned: %g x the typical step "
                    "(%.1f s), at least %g s" % (self.timeout_s, QUIET_MULTIPLE, self.learned_from or 0.0,
                                                  QUIET_FLOOR_S))
        if self.basis == "learned":
            return ("%s timeout %.0f s, learned: %g x the longest %s seen (%.1f s), at least %g s"
                    % (self.section, self.timeout_s, MULTIPLE, what, self.learned_from or 0.0, FLOOR_S))
        if self.section == STARTUP:
            return "startup timeout %.0f s, the default" % self.timeout_s
        return "%s timeout %.0f s, the default: no %s seen yet to learn from" % (self.section, self.timeout_s, what)

    def message(self) -> str:
        if self.section == STARTUP:
            return "hung: no rank reported a first step in %.0f s (%s)" % (self.stalled_s, self.why())
        after = " after step %g" % self.last_step if self.last_step is not None else ""
        if self.section == STEP and self.basis == "quiet":
            return "hung: no rank reported a step%s for %.0f s, every rank asleep (%s)" % (
                after, self.stalled_s, self.why())
        if self.section == STEP:
            return "hung: no rank reported a step%s for %.0f s (%s)" % (after, self.stalled_s, self.why())
        what = {CHECKPOINT: "a checkpoint save", EVAL: "an evaluation"}.get(self.section, "section %r" % self.section)
        return "hung: %s%s has not ended in %.0f s (%s)" % (what, after, self.stalled_s, self.why())

    def to_dict(self) -> Dict[str, object]:
        return {"section": self.section, "stalled_s": round(self.stalled_s, 3), "timeout_s": self.timeout_s,
                "last_step": self.last_step, "basis": self.basis, "learned_from": self.learned_from,
                "message": self.message()}


class Watch:
    """One attempt of a job as one observer sees it, in that observer's clock: the newest step,
    the sections some rank is inside, and what each section has taken so far."""

    def __init__(self, since: float, hang_timeout: Optional[float] = None,
                 startup_timeout: Optional[float] = None) -> None:
        self.since = since
        self.hang_timeout = hang_timeout  # explicit: wins over anything learned
        self.startup_timeout = startup_timeout
        self.last_step = None  # type: Optional[float]
        self.last_change = None  # type: Optional[float]  # a step moved or a section ended
        self.step_change = None  # type: Optional[float]  # a step moved
        self.step_longest = 0.0
        self.step_intervals = 0
        self.open = {}  # type: Dict[str, float]  # section -> when it was first seen open
        self.longest = {}  # type: Dict[str, float]  # section -> its longest run seen (one is enough)

    def observe(self, now: float, steps: Iterable[Optional[float]], inside: Iterable[str] = (),
                ended: Mapping[str, float] = {}) -> None:
        """What a look saw: each rank's newest step, the sections a rank is inside now, and the
        seconds the ranks said completed sections took (the longest of each, per name)."""
        for name, seconds in ended.items():
            self._learn(name, float(seconds))
        now_inside = set(inside)
        for name in list(self.open):
            if name not in now_inside:  # it ended since the last look
                self._learn(name, now - self.open.pop(name))
                self.last_change = now
        for name in now_inside:
            self.open.setdefault(name, now)
        newest = max((s for s in steps if s is not None), default=None)
        if newest is not None and (self.last_step is None or newest > self.last_step):
            if self.last_step is not None and self.last_change is not None:
                self.step_longest = max(self.step_longest, now - self.last_change)
                self.step_intervals += 1
            self.last_step, self.last_change = newest, now
            self.step_change = now

    def _learn(self, name: str, seconds: float) -> None:
        self.longest[name] = max(self.longest.get(name, 0.0), seconds)

    def section(self) -> str:
        for name in _PRECEDENCE:
            if name in self.open:
                return name
        if self.open:
            return sorted(self.open)[0]
        return STARTUP if self.last_step is None else STEP

    def timeout(self, section: str) -> "tuple[float, str, Optional[float]]":
        """(seconds, basis, the interval learned from) for ``section`` now."""
        if section == STARTUP:
            if self.startup_timeout is not None:
                return self.startup_timeout, "explicit", None
            return DEFAULT_STARTUP_S, "default", None
        if self.hang_timeout is not None:
            return self.hang_timeout, "explicit", None
        if section == STEP:
            if self.step_intervals >= MIN_STEP_INTERVALS:
                return learned_timeout(self.step_longest), "learned", self.step_longest
            return DEFAULT_HANG_S, "default", None
        if section in self.longest:
            return learned_timeout(self.longest[section]), "learned", self.longest[section]
        return DEFAULT_HANG_S, "default", None

    def judge(self, now: float, margin: float = 0.0) -> Optional[Verdict]:
        """The hang, if the section the job is in has outlasted its timeout (by ``margin`` more:
        the controller's backstop leaves the first word to the job hosts)."""
        section = self.section()
        if section == STARTUP:
            began = self.since
        elif section == STEP:
            began = self.last_change if self.last_change is not None else self.since
        else:
            began = self.open[section]
        timeout, basis, learned_from = self.timeout(section)
        stalled = now - began
        if stalled < timeout + margin:
            return None
        return Verdict(section, stalled, timeout, self.last_step, basis, learned_from)

    def quiet_since(self, now: float, asleep_since: Optional[float], typical_step: Optional[float],
                    step_age: Optional[float] = None) -> Optional[Tuple[float, float, float]]:
        """In the steps with every rank asleep since ``asleep_since`` (this watch's clock): (no
        step for, every rank asleep for, the quiet timeout); None otherwise, and always where the
        spec sets an explicit ``hang_timeout``. ``step_age``: how long ago the newest step was
        made, by its record's own time, where the observer has it (its looks see a step later);
        not where a section ended after that step (the steps' wait begins at its end)."""
        if self.hang_timeout is not None or asleep_since is None or typical_step is None:
            return None
        if self.section() != STEP or self.last_change is None:
            return None
        stalled = now - self.last_change
        if step_age is not None and self.last_change == self.step_change:
            stalled = max(stalled, step_age)
        # asleep since the step at the latest: a step's few milliseconds of CPU can fall inside
        # one clock tick, between two looks that read the same ticks
        return stalled, min(now - asleep_since, stalled), quiet_timeout(typical_step)

    def quiet(self, now: float, asleep_since: Optional[float], typical_step: Optional[float],
              step_age: Optional[float] = None) -> Optional[Verdict]:
        """A quiet hang (the module's doc): in the steps, no step for ``quiet_timeout`` of the
        typical step while every rank has been asleep since ``asleep_since`` (this watch's clock)
        for as long. Never where the spec sets an explicit ``hang_timeout``."""
        got = self.quiet_since(now, asleep_since, typical_step, step_age)
        if got is None:
            return None
        stalled, asleep, timeout = got
        if stalled < timeout or asleep < timeout:
            return None
        return Verdict(STEP, stalled, timeout, self.last_step, "quiet", typical_step)
