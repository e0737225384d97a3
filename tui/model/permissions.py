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

__all__ = [
    "ADMIN", "DRAIN", "MEMBER", "QUOTA", "REPRIORITISE_JOB", "RETRY_JOB", "RETRY_PIPELINE", "STOP_JOB",
    "STOP_PIPELINE", "STOP_SWEEP", "STOP_TRIAL", "UNDRAIN", "Actor", "Guard", "PermissionDenied", "check",
    "refusal",
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


def check(actor: Actor, guard: Guard, *, ref: str = "", owner: str | None = None) -> None:
    """PermissionDenied with ``refusal``'s words when the rules refuse."""
    why = refusal(actor, guard, ref=ref, owner=owner)
    if why is not None:
        raise PermissionDenied(why)
