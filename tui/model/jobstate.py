"""The states of a job, defined once for the whole workstation side.

A job's state is recorded in the job history and shown in every face. Its lifecycle:

``pending``
    Recorded, not yet placed on hosts (the launch is checking and reserving).
``queued``
    Waiting in the job queue (``tui/control/queue.py``) for hosts or GPUs to free up; its
    ``waiting`` says for what. Leaves the line as ``pending`` (started) or ``stopped`` (cancelled).
``starting``
    Placed; the hosts are starting its ranks (a gang restart goes through ``starting`` again).
``running``
    Every host says its ranks run.
``restarting``
    Between a failed gang and its next start. Reserved: a gang restart records ``starting``
    today.
``stopping``
    A stop was asked for, or one rank failed and the rest of the gang is being stopped.
``succeeded`` (terminal)
    Every rank exited with status 0.
``failed`` (terminal)
    A rank failed (or the job could not start) and no restart remains.
``stopped`` (terminal)
    Stopped before it finished: by a user, by ``max_runtime``, or by a host.

``unknown`` is not a recorded state: it is what a job's state reads as while one of its hosts
cannot be reached (never guessed, never written to the history).

The agent keeps its own copy of the terminal states (``agent/jobhost.py``): it runs on the hosts
and never imports ``tui``.

Sweeps and their trials, pipelines and their steps go through the same lifecycle words and use
these names for them (a trial or a step shows its job's state while the job runs); the states
only they have (a sweep's ``completed``, a trial's ``pruned``, a step's ``cached`` and
``skipped``) are named in ``tui.model.sweepview`` and ``tui.model.pipelineview``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "ACTIVE",
    "FAILED",
    "PENDING",
    "QUEUED",
    "RESTARTING",
    "RUNNING",
    "STARTING",
    "STATES",
    "STOPPED",
    "STOPPING",
    "SUCCEEDED",
    "TERMINAL",
    "UNKNOWN",
]

PENDING = "pending"
QUEUED = "queued"
STARTING = "starting"
RUNNING = "running"
RESTARTING = "restarting"
STOPPING = "stopping"
SUCCEEDED = "succeeded"
FAILED = "failed"
STOPPED = "stopped"
UNKNOWN = "unknown"

# Not yet ended: the job holds (or waits for) its hosts.
ACTIVE: tuple[str, ...] = (PENDING, QUEUED, STARTING, RUNNING, RESTARTING, STOPPING)
# Ended for good: the job's hosts are free and its state no longer changes.
TERMINAL: tuple[str, ...] = (SUCCEEDED, FAILED, STOPPED)
# Every state a job's record can hold, in lifecycle order.
STATES: tuple[str, ...] = ACTIVE + TERMINAL


def describe_cause(cause: Mapping[str, Any], *, restart_error: bool = True) -> str:
    """One line for a failure cause: rank, host, signal or exit code, message."""
    parts = []
    if cause.get("pool"):  # a worker pool's replica: "worker 1 on h2 (rank 2)"
        parts.append(f"{cause['pool']}" + (f" {cause['replica']}" if cause.get("replica") is not None else ""))
        if cause.get("host"):
            parts.append(f"on {cause['host']}")
        if cause.get("rank") is not None:
            parts.append(f"(rank {cause['rank']})")
    else:
        if cause.get("rank") is not None:
            parts.append(f"rank {cause['rank']}")
        if cause.get("host"):
            parts.append(f"on {cause['host']}")
    if cause.get("signal"):
        parts.append(f"killed by signal {cause['signal']}")
    elif cause.get("exit_code") is not None:
        parts.append(f"exited {cause['exit_code']}")
    if cause.get("message"):
        parts.append(str(cause["message"]))
    if restart_error and cause.get("restart_error"):
        parts.append(f"(no restart: {cause['restart_error']})")
    return " ".join(parts)
