"""A shared queue's rules: who owns a job, how much GPU time each user and group has had,
their fair-share factors, quotas, and which running jobs a waiting one may preempt. Pure: the
queue (``tui/control/queue.py``) hands it job records and the time.

The config (a ``config.toml``'s ``[queue]``, ``[[group]]`` and ``[[quota]]`` tables: the
server's, or the user's own embedded; docs/server.md)::

    [queue]
    order = "fairshare"      # or "fifo": priority, then first come, as before fair share
    half_life_hours = 168    # past GPU time counts half after this long
    preemption = true        # a higher-priority job may stop preemptible ones
    shares = { alice = 2, bob = 1, vision = 3 }   # users' and groups' shares (default 1)

    [[group]]
    name = "vision"
    members = ["alice", "bob"]

    [[quota]]
    user = "alice"           # or group = "vision"
    gpus = 4                 # GPUs held at once
    gpu_hours = 500          # GPU-hours per rolling week (7 days)

Fair share follows Slurm's classic factor ``F = 2^(-U/S)``: ``U`` is the user's usage as a
fraction of everyone's, ``S`` the user's normalized share (a group member's: the group's share
among the top-level accounts times the member's share within the group). Like Slurm's fair
tree, the queue orders by the top-level account's factor first (a group, or a user in no group),
then by the user's own. The usage is the decayed GPU-hours *projected one half-life ahead* with
the GPUs each user holds now (``projected_gpu_hours``): Slurm recomputes its factors every few
minutes for jobs of hours, but here one round may start a dozen 20-second jobs, and ordering
them by past use alone gives every freed GPU to whoever was behind before any of them counted,
and the shares swing round by round (bench/fairshare.py measures them).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tui.model.fields import Bad, Check, ErrorFactory, boolean, checked, int_range, number, one_of, token
from tui.model.jobstate import QUEUED, TERMINAL
from tui.model.usage import attempts

__all__ = [
    "WEEK_S",
    "Group",
    "Quota",
    "QueuePolicy",
    "Shares",
    "decayed_gpu_hours",
    "job_gpus",
    "job_priority",
    "job_user",
    "parse_policy",
    "preempt_pending",
    "preemptible",
    "projected_gpu_hours",
    "quota_block",
    "run_intervals",
    "shares",
    "week_gpu_hours",
]

WEEK_S = 7 * 86400.0
ORDERS = ("fairshare", "fifo")
# Events that end one run of a job (its GPUs given back): a gang restart, a preempted job back in
# the queue. The job's own end is its record's ``ended``.


@dataclass(frozen=True)
class Group:
    name: str
    members: tuple[str, ...]


@dataclass(frozen=True)
class Quota:
    """A limit on a user's or a group's jobs: GPUs held at once, GPU-hours per rolling week."""

    kind: str  # "user" or "group"
    name: str
    gpus: int | None = None
    gpu_hours: float | None = None

    @property
    def label(self) -> str:
        return f"quota of {self.kind} {self.name}"


@dataclass(frozen=True)
class QueuePolicy:
    order: str = "fairshare"
    half_life_s: float = WEEK_S
    preemption: bool = True
    share_of: Mapping[str, float] = field(default_factory=dict)  # user or group -> share
    groups: tuple[Group, ...] = ()
    quotas: tuple[Quota, ...] = ()
    # The highest priority a member may give a job on a server (higher needs an admin): a
    # priority jumps the queue and may preempt others, so it is not the client's to choose.
    member_max_priority: int = 0

    @property
    def fair(self) -> bool:
        return self.order == "fairshare"

    def group_of(self, user: str) -> str | None:
        return next((g.name for g in self.groups if user in g.members), None)

    def quotas_of(self, user: str) -> list[Quota]:
        group = self.group_of(user)
        return [q for q in self.quotas if (q.kind == "user" and q.name == user)
                or (q.kind == "group" and q.name == group)]

    def members(self, quota: Quota) -> tuple[str, ...]:
        if quota.kind == "user":
            return (quota.name,)
        return next((g.members for g in self.groups if g.name == quota.name), ())


# ---------------------------------------------------------------------------------------------
# The config tables


def _shares(v: Any) -> dict[str, float]:
    if not isinstance(v, Mapping):
        raise Bad()
    out = {}
    for name, share in v.items():
        if not (isinstance(share, (int, float)) and not isinstance(share, bool) and math.isfinite(share)
                and share > 0):
            raise Bad("a number > 0 (the share of this user or group)", got=share, sub=name)
        out[str(name)] = float(share)
    return out


def _names(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not v:
        raise Bad()
    for i, name in enumerate(v):
        if not isinstance(name, str) or not name or any(c.isspace() for c in name):
            raise Bad("a user name (no whitespace)", got=name, sub=f"[{i}]")
    return tuple(dict.fromkeys(v))


_QUEUE_FIELDS: dict[str, Check] = {
    "order": Check('"fairshare" or "fifo" (priority, then first come)', one_of(ORDERS)),
    "half_life_hours": Check("a number of hours > 0 (past GPU time counts half after it)", number(positive=True)),
    "preemption": Check("true or false (a higher-priority job may stop preemptible ones)", boolean),
    "shares": Check("a table of shares, user or group name = a number > 0: { alice = 2, vision = 1 }", _shares),
    "member_max_priority": Check("an integer -1000..1000 (the highest priority a member may give a job; "
                                 "higher needs an admin)", int_range(-1000, 1000)),
}
_GROUP_FIELDS: dict[str, Check] = {
    "name": Check("a group name (a string without whitespace)", token),
    "members": Check('a non-empty list of user names: ["alice", "bob"]', _names),
}
_QUOTA_FIELDS: dict[str, Check] = {
    "user": Check("a user name (a string without whitespace)", token),
    "group": Check("the name of a [[group]] (a string without whitespace)", token),
    "gpus": Check("an integer >= 0 (GPUs held at once)", int_range(0)),
    "gpu_hours": Check("a number >= 0 (GPU-hours per rolling week)", number(positive=False)),
}


def _tables(data: Mapping[str, Any], key: str, error: ErrorFactory) -> list[Mapping[str, Any]]:
    raw = data.get(key, [])
    if not isinstance(raw, list) or not all(isinstance(t, Mapping) for t in raw):
        raise error(key, f"an array of tables ([[{key}]])", raw)
    return raw


def _under(prefix: str, error: ErrorFactory) -> ErrorFactory:
    def make(name: str, expected: str, got: Any) -> Exception:
        return error(prefix + name, expected, got)

    return make


def parse_policy(data: Mapping[str, Any], error: ErrorFactory) -> QueuePolicy:
    """The checked ``[queue]``, ``[[group]]`` and ``[[quota]]`` tables of a config file's
    decoded TOML; ``error(field, expected, got)`` makes the caller's error (naming its file)."""
    raw = data.get("queue", {})
    if not isinstance(raw, Mapping):
        raise error("queue", "a table ([queue])", raw)
    q = checked(raw, _QUEUE_FIELDS, _under("queue.", error))
    groups: list[Group] = []
    seen: dict[str, str] = {}
    for i, t in enumerate(_tables(data, "group", error)):
        g = checked(t, _GROUP_FIELDS, _under(f"group[{i}].", error))
        for need in ("name", "members"):
            if need not in g:
                raise error(f"group[{i}].{need}", f"{_GROUP_FIELDS[need].expected} (required)", None)
        if any(x.name == g["name"] for x in groups):
            raise error(f"group[{i}].name", "a name no other [[group]] has", g["name"])
        for user in g["members"]:
            if user in seen:
                raise error(f"group[{i}].members", f"users in one group each ({user!r} is in group "
                            f"{seen[user]!r} too: fair share's tree has one parent per user)", user)
            seen[user] = g["name"]
        groups.append(Group(g["name"], g["members"]))
    quotas = [_quota(i, t, groups, error) for i, t in enumerate(_tables(data, "quota", error))]
    return QueuePolicy(order=q.get("order", "fairshare"),
                       half_life_s=q.get("half_life_hours", WEEK_S / 3600) * 3600.0,
                       preemption=q.get("preemption", True), share_of=q.get("shares", {}),
                       groups=tuple(groups), quotas=tuple(quotas),
                       member_max_priority=q.get("member_max_priority", 0))


def _quota(i: int, t: Mapping[str, Any], groups: Sequence[Group], error: ErrorFactory) -> Quota:
    v = checked(t, _QUOTA_FIELDS, _under(f"quota[{i}].", error))
    if ("user" in v) == ("group" in v):
        raise error(f"quota[{i}]", 'exactly one of user = "NAME" or group = "NAME"', None)
    if "gpus" not in v and "gpu_hours" not in v:
        raise error(f"quota[{i}]", "a limit: gpus (at once) or gpu_hours (per rolling week), or both", None)
    if "group" in v and not any(g.name == v["group"] for g in groups):
        raise error(f"quota[{i}].group", f"the name of a [[group]] ({', '.join(g.name for g in groups) or 'none'})",
                    v["group"])
    kind = "user" if "user" in v else "group"
    return Quota(kind, v[kind], v.get("gpus"), v.get("gpu_hours"))


def policy_to_toml(p: QueuePolicy) -> dict[str, Any]:
    """The tables as TOML data (what ``rigdeck server setup`` copies to the server)."""
    out: dict[str, Any] = {"queue": {"order": p.order, "half_life_hours": p.half_life_s / 3600.0,
                                     "preemption": p.preemption, "shares": dict(p.share_of),
                                     "member_max_priority": p.member_max_priority}}
    if p.groups:
        out["group"] = [{"name": g.name, "members": list(g.members)} for g in p.groups]
    if p.quotas:
        out["quota"] = [{q.kind: q.name, **({"gpus": q.gpus} if q.gpus is not None else {}),
                         **({"gpu_hours": q.gpu_hours} if q.gpu_hours is not None else {})} for q in p.quotas]
    return out


# ---------------------------------------------------------------------------------------------
# Jobs: whose, how many GPUs, when they held them


def job_user(rec: Mapping[str, Any]) -> str:
    """Who owns the job: its record's ``user`` ("?" for a job recorded before owners were)."""
    user = rec.get("user")
    return str(user) if user else "?"


def job_priority(rec: Mapping[str, Any]) -> int:
    """The job's ``priority``, as its spec says (a job started at once has no queue column)."""
    return int((rec.get("spec") or {}).get("priority") or rec.get("priority") or 0)


def job_gpus(spec: Mapping[str, Any]) -> int:
    """GPUs the job needs in all (0: CPU processes only), from its spec's dict."""
    nodes = int(spec.get("nodes") or len(spec.get("hosts") or []) or 1)
    return nodes * int(spec.get("gpus_per_node") or 0) + sum(
        int(p.get("replicas") or 1) * int(p.get("gpus_per_replica") or 0) for p in spec.get("pools") or ())


def preemptible(spec: Mapping[str, Any]) -> bool:
    """Whether the job may be stopped for a higher-priority one: ``preemptible = true`` with a
    checkpoint dir to resume from, or ``"restart"`` (it may start over)."""
    p = spec.get("preemptible")
    return p == "restart" or (p is True and bool((spec.get("checkpoint") or {}).get("dir")))


def preempt_pending(rec: Mapping[str, Any]) -> bool:
    """Whether the job was stopped to make room and has not been stopped otherwise since: it
    goes back to the queue once its hosts are done with it."""
    last = None
    for e in rec.get("events") or ():
        if e.get("event") in ("started", "stop requested", "preempted"):
            last = e.get("event")
    return last == "preempted"


def run_intervals(rec: Mapping[str, Any], now: float) -> list[tuple[float, float, int]]:
    """(start, end, GPUs) of each run of the job that held GPUs: its attempts as
    ``tui.model.usage`` (the one owner of a job's GPU time) counts them."""
    return [(a.start, a.end, a.gpus) for a in attempts(rec, now) if a.gpus]


def decayed_gpu_hours(intervals: Iterable[tuple[float, float, int]], now: float, half_life_s: float) -> float:
    """GPU-hours with each moment's use weighted ``2^(-age/half_life)``."""
    k = math.log(2) / half_life_s
    total = 0.0
    for s, e, g in intervals:
        e = min(e, now)
        if e > s:
            total += g * (math.exp(-k * (now - e)) - math.exp(-k * (now - s))) / k
    return total / 3600.0


def projected_gpu_hours(decayed: float, held_gpus: int, half_life_s: float) -> float:
    """The decayed usage one half-life from now if the GPUs held now stay held: today's
    ``decayed`` halved, plus what ``held_gpus`` add meanwhile (each ``H / (2 ln 2)`` seconds once
    decayed). What fair share orders by: a GPU granted counts at once, not as its use accrues, so a
    round that frees several GPUs does not hand them all to the owner who was behind a moment ago
    (they were behind only until those GPUs were theirs)."""
    return decayed / 2.0 + held_gpus * half_life_s / (2.0 * math.log(2)) / 3600.0


def week_gpu_hours(intervals: Iterable[tuple[float, float, int]], now: float, at: float | None = None) -> float:
    """GPU-hours used (up to ``now``) in the rolling week ending at ``at`` (default ``now``)."""
    at = now if at is None else at
    lo = at - WEEK_S
    return sum(g * max(0.0, min(e, now) - max(s, lo)) for s, e, g in intervals) / 3600.0


def _frees_at(intervals: list[tuple[float, float, int]], limit: float, now: float) -> float:
    """When the week's usage (as used by ``now``) falls below ``limit``, as old use leaves it."""
    lo, hi = now, now + WEEK_S
    for _ in range(50):
        mid = (lo + hi) / 2
        if week_gpu_hours(intervals, now, mid) < limit:
            hi = mid
        else:
            lo = mid
    return hi


# ---------------------------------------------------------------------------------------------
# Fair share


@dataclass(frozen=True)
class Shares:
    """Each user's fair-share factor and the top-level account's (its group's, or its own)."""

    factor: Mapping[str, float]
    account_factor: Mapping[str, float]
    usage: Mapping[str, float]  # decayed GPU-hours

    def key(self, user: str) -> tuple[float, float]:
        """Sorts the better-served later: the top-level account's factor, then the user's."""
        return (-self.account_factor.get(user, 1.0), -self.factor.get(user, 1.0))


def _level(names: Iterable[str], usage: Mapping[str, float],
           share: Mapping[str, float]) -> dict[str, tuple[float, float]]:
    """Siblings' (normalized share, fraction of their usage)."""
    names = list(dict.fromkeys(names))
    total_share = sum(share.get(n, 1.0) for n in names) or 1.0
    total_use = sum(usage.get(n, 0.0) for n in names)
    return {n: (share.get(n, 1.0) / total_share, usage.get(n, 0.0) / total_use if total_use > 0 else 0.0)
            for n in names}


def shares(policy: QueuePolicy, users: Iterable[str], usage: Mapping[str, float]) -> Shares:
    """The factors of ``users`` (those with jobs queued, running or recently run), from their
    decayed ``usage``. Shares are normalized among the accounts present."""
    users = list(dict.fromkeys(users))
    account = {u: policy.group_of(u) or u for u in users}
    acc_use: dict[str, float] = {}
    for u in users:
        acc_use[account[u]] = acc_use.get(account[u], 0.0) + usage.get(u, 0.0)
    top = _level(account.values(), acc_use, policy.share_of)
    total = sum(usage.get(u, 0.0) for u in users)
    factor, acc_factor = {}, {}
    for u in users:
        s, frac = top[account[u]]
        acc_factor[u] = 2.0 ** (-frac / s)
        if account[u] != u:
            inner = _level([m for m in users if account[m] == account[u]], usage, policy.share_of)
            s = s * inner[u][0]
        factor[u] = 2.0 ** (-(usage.get(u, 0.0) / total if total > 0 else 0.0) / s)
    return Shares(factor, acc_factor, dict(usage))


# ---------------------------------------------------------------------------------------------
# Quotas


def _clock(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))


def quota_block(policy: QueuePolicy, user: str, gpus: int, recs: Sequence[Mapping[str, Any]],
                now: float) -> str | None:
    """Why a job of ``user`` needing ``gpus`` may not start now under a quota, naming the quota
    and when it frees; None when every quota allows it. ``recs``: the jobs that hold GPUs now
    or ran within the week."""
    for q in policy.quotas_of(user):
        members = set(policy.members(q))
        mine = [r for r in recs if job_user(r) in members]
        if q.gpus is not None:
            holding = [r for r in mine if r.get("state") not in TERMINAL and r.get("state") != QUEUED]
            held = sum(job_gpus(r.get("spec") or {}) for r in holding)
            if held + gpus > q.gpus:
                jobs = ", ".join(str(r["job_id"]) for r in holding) or "none"
                return (f"{q.label}: {q.gpus} GPUs at once; {held} held by {jobs}, this job needs {gpus}: "
                        "it starts when enough of them end")
        if q.gpu_hours is not None:
            spans = [i for r in mine for i in run_intervals(r, now)]
            used = week_gpu_hours(spans, now)
            if used >= q.gpu_hours:
                frees = _frees_at(spans, q.gpu_hours, now)
                return (f"{q.label}: {q.gpu_hours:g} GPU-hours per rolling week, {used:.2f} used: "
                        f"frees at {_clock(frees)} as older use leaves the week (later while its jobs run)")
    return None
