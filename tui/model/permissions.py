"""Who may do what to whose work, on a shared server: the rules, in one place.

A person is a *member* or an *admin* (``rigdeck server add-user NAME [--admin]``). A member
stops, retries and reprioritises only their own work (the jobs, sweeps and pipelines recorded as
theirs); an admin anyone's. Draining hosts and changing quotas are for admins only. Reading
(jobs, queue, logs, metrics, usage) is everyone's: each person sees every job.

The controller API declares which rule guards each method (``tui.control.api``: a method's
``guard``); the server applies it with the session's person (``tui.control.server``). Without a
server the person at the keyboard owns the controller, so nothing is checked. A refusal names
the owner and the rule, e.g. ``refused: job 'x' belongs to alice; members may stop only their own
jobs (bob is a member)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "ADMIN", "DOCTOR", "DRAIN", "GC", "HIDDEN", "MEMBER", "QUOTA", "RECONNECT", "REPRIORITISE_JOB",
    "RETRY_JOB", "RETRY_PIPELINE", "STOP_JOB", "STOP_PIPELINE", "STOP_SWEEP", "STOP_TRIAL", "UNDRAIN",
    "Actor", "Guard", "PermissionDenied", "check", "env_for", "priority_refusal", "refusal",
]

ADMIN = "admin"
MEMBER = "member"


@dataclass(frozen=True)
class Actor:
    """The person a request comes from, as the server knows them."""

    name: str
    admin: bool = False

    @property
    def role(self) -> str:
        return ADMIN if self.admin else MEMBER


@dataclass(frozen=True)
class Guard:
    """What a method asks of its caller: to own the ``kind`` ("job", "sweep", "pipeline") its
    ``param`` names, or (``kind`` = "admin") to be an admin. ``verb`` is the rule's words."""

    kind: str
    verb: str
    param: str = "ref"

    @property
    def admin_only(self) -> bool:
        return self.kind == ADMIN


STOP_JOB = Guard("job", "stop")
RETRY_JOB = Guard("job", "retry")
REPRIORITISE_JOB = Guard("job", "reprioritise")
STOP_SWEEP = Guard("sweep", "stop")
STOP_TRIAL = Guard("sweep", "stop trials of")
STOP_PIPELINE = Guard("pipeline", "stop")
RETRY_PIPELINE = Guard("pipeline", "retry steps of")
DRAIN = Guard(ADMIN, "draining hosts", param="targets")
UNDRAIN = Guard(ADMIN, "undraining hosts", param="targets")
QUOTA = Guard(ADMIN, "changing quotas", param="")
# Work that runs as the server's account on every host, outside anyone's quota, or that reaches
# every host: an admin's.
DOCTOR = Guard(ADMIN, "running the doctor", param="")
GC = Guard(ADMIN, "removing what ended jobs left on the hosts", param="")
RECONNECT = Guard(ADMIN, "reconnecting the server's links", param="")


class PermissionDenied(Exception):
    """A request the rules refuse; the message names the owner and the rule."""


def refusal(actor: Actor, guard: Guard, *, ref: str = "", owner: str | None = None) -> str | None:
    """Why ``actor`` may not do what ``guard`` guards to the work ``ref`` (owned by ``owner``;
    None: no owner recorded, as for work from before owners were), or None when they may."""
    if actor.admin:
        return None
    if guard.admin_only:
        return f"refused: {guard.verb} is for admins only ({actor.name} is a {MEMBER})"
    if owner is not None and owner == actor.name:
        return None
    whose = f"belongs to {owner}" if owner else "has no recorded owner"
    return (f"refused: {guard.kind} {ref!r} {whose}; {MEMBER}s may {guard.verb} only their own "
            f"{guard.kind}s ({actor.name} is a {MEMBER})")


def join_refusal(actor: Actor, joined: bool, as_account: str | None) -> str | None:
    """Why ``actor``'s job may not run (they have not joined with accounts of their own, and
    the server runs no member's job as the hosts' account: ``[server] members_need_join``), or
    None when it may: an admin's (trusted with that account, as the doctor and the links run as
    it), a joined person's (their own accounts). ``as_account``: the account a job of theirs would
    run as, when it is the server's own (None: the operator said members must join)."""
    if actor.admin or joined:
        return None
    why = (f"a {MEMBER}'s job would run as {as_account}, the account the server itself runs as (it holds "
           "the server's key and users.json)" if as_account else
           "this server runs no member's job as its hosts' account ([server] members_need_join = true)")
    return (f"refused: {actor.name} has not joined: {why}; run `rigdeck server join` (with access of your "
            f"own to the hosts) so that your jobs run as your own account, or ask an admin "
            f"({actor.name} is a {MEMBER})")


def priority_refusal(actor: Actor, priority: int, member_max: int) -> str | None:
    """Why ``actor`` may not give a job ``priority`` (a member above ``member_max``: a priority
    jumps the queue and may preempt others' jobs), or None when they may."""
    if actor.admin or priority <= member_max:
        return None
    return (f"refused: priority {priority} is above {member_max}, the highest a {MEMBER} may give "
            f"({actor.name} is a {MEMBER}; an admin may set it higher)")


def env_for(actor: Actor | None, owner: str | None, spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` as ``actor`` may see it: a job's ``[env]`` values (and each pool's) are its
    owner's and admins'; anyone else sees the names with the values hidden. ``actor`` None: the
    person at the keyboard of their own controller, who sees everything."""
    if actor is None or actor.admin or (owner is not None and owner == actor.name):
        return spec
    out = dict(spec)
    if out.get("env"):
        out["env"] = {k: HIDDEN for k in out["env"]}
    if out.get("pools"):
        out["pools"] = [{**p, "env": {k: HIDDEN for k in p["env"]}} if isinstance(p, dict) and p.get("env") else p
                        for p in out["pools"]]
    return out


HIDDEN = "(hidden: the owner's)"


def check(actor: Actor, guard: Guard, *, ref: str = "", owner: str | None = None) -> None:
    """PermissionDenied with ``refusal``'s words when the rules refuse."""
    why = refusal(actor, guard, ref=ref, owner=owner)
    if why is not None:
        raise PermissionDenied(why)
