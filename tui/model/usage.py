"""GPU time: what each job used, and what each person, group and job used over a span.

The one owner of "a job's GPU time" (the queue's fair share and quotas read it too): each
attempt of a job (each ``started`` event in its history record) holds its GPUs from that event
until the attempt ends (the next ``restart``, ``requeued`` (a preempted job's gang stop done,
its GPUs given back) or ``started`` event, else the record's ``ended``, else now for a job
still running), and costs ``gpus x (end - start)``. The attempt's GPUs are the ``gpus`` its
``started`` event recorded (the placement's count), or, for records from before that, the
record's placement. ``rigdeck usage`` and the app's Usage view sum exactly these figures.

Pure: records in, figures out (``tui.control.service`` reads the history and the goodputs).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tui.model.jobstate import TERMINAL

__all__ = ["BY", "NO_GROUP", "UNKNOWN_USER", "Attempt", "UsageReport", "UsageRow", "attempts", "gpu_seconds",
           "parse_since", "placement_gpus", "recent_weeks", "report_lines", "usage_report", "week_of", "weekly_bars"]

BY = ("user", "group", "job")
UNKNOWN_USER = "(unknown)"  # a job recorded before owners were
NO_GROUP = "(no group)"
ATTEMPT_ENDS = ("restart", "requeued", "started")
WEEK_S = 7 * 86400.0


@dataclass(frozen=True)
class Attempt:
    start: float
    end: float
    gpus: int

    @property
    def gpu_seconds(self) -> float:
        return self.gpus * max(0.0, self.end - self.start)


def placement_gpus(placement: Iterable[Mapping[str, Any]] | None) -> int:
    """GPUs a placement holds: each node's GPU list."""
    return sum(len(n.get("gpus") or ()) for n in placement or ())


def attempts(rec: Mapping[str, Any], now: float) -> list[Attempt]:
    """The job's attempts, oldest first (see the module docstring)."""
    events = [e for e in rec.get("events") or [] if isinstance(e.get("time"), (int, float))]
    out = []
    for i, e in enumerate(events):
        if e.get("event") != "started":
            continue
        start = float(e["time"])
        end = next((float(x["time"]) for x in events[i + 1:] if x.get("event") in ATTEMPT_ENDS), None)
        if end is None:
            if rec.get("ended") is not None:
                end = float(rec["ended"])
            elif rec.get("state") in TERMINAL:
                end = float(events[-1]["time"])
            else:
                end = now
        gpus = e.get("gpus")
        n = int(gpus) if isinstance(gpus, int) else placement_gpus(rec.get("placement"))
        out.append(Attempt(start, max(start, end), n))
    return out


def gpu_seconds(rec: Mapping[str, Any], now: float, since: float | None = None) -> float:
    """The job's GPU time (its attempts' after ``since``)."""
    total = 0.0
    for a in attempts(rec, now):
        start = a.start if since is None else max(a.start, since)
        total += a.gpus * max(0.0, a.end - start)
    return total


def week_of(t: float) -> str:
    """The ISO week ``t`` (epoch seconds, UTC) falls in: ``2026-W48``."""
    year, week, _ = _dt.datetime.fromtimestamp(t, _dt.timezone.utc).isocalendar()
    return f"{year}-W{week:02d}"


def _week_start(t: float) -> float:
    d = _dt.datetime.fromtimestamp(t, _dt.timezone.utc)
    monday = (d - _dt.timedelta(days=d.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
    return monday.timestamp()


def _by_week(rec: Mapping[str, Any], now: float, since: float | None) -> dict[str, float]:
    """The job's GPU seconds in each week its attempts span."""
    out: dict[str, float] = {}
    for a in attempts(rec, now):
        t = a.start if since is None else max(a.start, since)
        while t < a.end:
            edge = min(a.end, _week_start(t) + WEEK_S)
            out[week_of(t)] = out.get(week_of(t), 0.0) + a.gpus * (edge - t)
            t = edge
    return out


@dataclass(frozen=True)
class UsageRow:
    """One person's (group's, job's) figures: GPU hours, jobs, preemptions, goodput (the jobs'
    goodput weighted by their GPU time, over the jobs that report steps; None: none does)."""

    key: str
    gpu_hours: float
    jobs: int
    preempted: int
    goodput: float | None = None


@dataclass(frozen=True)
class UsageReport:
    """``rigdeck usage``: rows by ``by``, the most GPU hours first; ``weeks``: each row key's
    GPU hours per ISO week (the Usage view's bars). ``source``: Slurm's accounting (``sacct on
    h1``) where it answered, every user's jobs; None: the jobs rigdeck launched."""

    by: str
    since: float | None
    now: float
    rows: tuple[UsageRow, ...] = ()
    weeks: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str | None = None  # None: the jobs rigdeck launched; else whose accounting it is
    note: str | None = None  # why the figures are not Slurm's, on a Slurm cluster

    @property
    def gpu_hours(self) -> float:
        return sum(r.gpu_hours for r in self.rows)


def _keys(rec: Mapping[str, Any], by: str, groups: Mapping[str, Sequence[str]]) -> list[str]:
    user = rec.get("user") or UNKNOWN_USER
    if by == "user":
        return [user]
    if by == "group":
        return list(groups.get(user) or ()) or [NO_GROUP]
    return [str(rec.get("job_id"))]


def usage_report(records: Iterable[Mapping[str, Any]], *, by: str = "user", since: float | None = None,
                 now: float, groups: Mapping[str, Sequence[str]] | None = None,
                 goodputs: Mapping[str, float | None] | None = None) -> UsageReport:
    """The figures of ``records`` (history records) by ``by`` (user, group, job) after ``since``.
    ``groups``: user -> the groups they are in (a person in two groups counts in both);
    ``goodputs``: job id -> its goodput ratio, where known."""
    if by not in BY:
        raise ValueError(f"--by: expected one of {', '.join(BY)}, got {by!r}")
    acc: dict[str, list[float]] = {}  # key -> [gpu s, jobs, preempted, goodput x s, s with goodput]
    weeks: dict[str, dict[str, float]] = {}
    for rec in records:
        secs = gpu_seconds(rec, now, since)
        if secs <= 0 and (since is not None and float(rec.get("created") or 0) < since):
            continue
        preempted = sum(1 for e in rec.get("events") or [] if e.get("event") == "preempted")
        ratio = (goodputs or {}).get(str(rec.get("job_id")))
        per_week = _by_week(rec, now, since)
        for key in _keys(rec, by, groups or {}):
            a = acc.setdefault(key, [0.0, 0, 0, 0.0, 0.0])
            a[0] += secs
            a[1] += 1
            a[2] += preempted
            if ratio is not None and secs > 0:
                a[3] += ratio * secs
                a[4] += secs
            w = weeks.setdefault(key, {})
            for week, s in per_week.items():
                w[week] = w.get(week, 0.0) + s / 3600.0
    rows = tuple(sorted((UsageRow(key=k, gpu_hours=a[0] / 3600.0, jobs=int(a[1]), preempted=int(a[2]),
                                  goodput=(a[3] / a[4]) if a[4] > 0 else None) for k, a in acc.items()),
                        key=lambda r: (-r.gpu_hours, r.key)))
    return UsageReport(by=by, since=since, now=now, rows=rows, weeks=weeks)


def parse_since(text: str, now: float) -> float:
    """``--since``: ``YYYY-MM-DD`` or ``YYYY-MM-DDTHH:MM`` (local time), or ``Nd`` (N days
    before ``now``), as epoch seconds; ValueError saying what was expected."""
    t = (text or "").strip()
    if t.endswith("d") and t[:-1].isdigit():
        return now - int(t[:-1]) * 86400.0
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M"):
        try:
            return _dt.datetime.strptime(t, fmt).timestamp()
        except ValueError:
            continue
    raise ValueError(f"--since: expected a date (YYYY-MM-DD or YYYY-MM-DDTHH:MM) or a number of days "
                     f"back (7d), got {text!r}")


def report_lines(report: UsageReport) -> list[str]:
    """``rigdeck usage``'s table: a row per key, then the total."""
    span = "all time" if report.since is None else "since " + _dt.datetime.fromtimestamp(
        report.since).strftime("%Y-%m-%d %H:%M")
    where = [f"from Slurm's accounting ({report.source}): every user's Slurm jobs"] if report.source else []
    where += [f"({report.note})"] if report.note else []
    if not report.rows:
        return where + [f"no GPU time recorded ({span})"]
    head = report.by.upper()
    width = max(len(head), 5, *(len(r.key) for r in report.rows))
    out = where + [f"GPU hours by {report.by}, {span}",
           f"{head:<{width}}  {'GPU-HOURS':>9}  {'JOBS':>5}  {'PREEMPTED':>9}  {'GOODPUT':>7}"]
    for r in report.rows:
        good = f"{r.goodput:.0%}" if r.goodput is not None else "-"
        out.append(f"{r.key:<{width}}  {r.gpu_hours:>9.3f}  {r.jobs:>5}  {r.preempted:>9}  {good:>7}")
    out.append(f"{'total':<{width}}  {report.gpu_hours:>9.3f}  {sum(r.jobs for r in report.rows):>5}  "
               f"{sum(r.preempted for r in report.rows):>9}")
    return out


def recent_weeks(now: float, count: int) -> list[str]:
    """The ISO weeks of the ``count`` weeks up to ``now``'s, oldest first."""
    start = _week_start(now)
    return [week_of(start - i * WEEK_S + 3600.0) for i in range(count - 1, -1, -1)]


def weekly_bars(report: UsageReport, weeks: Sequence[str]) -> list[tuple[str, str, float]]:
    """(key, week, GPU hours) for each row of ``report`` and each of ``weeks`` (0 where none):
    the Usage view's bars, the most GPU hours first."""
    return [(r.key, w, report.weeks.get(r.key, {}).get(w, 0.0)) for r in report.rows for w in weeks]
