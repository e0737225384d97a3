"""What the faces show about jobs: plain, immutable views, and the job source they read.

The controller builds these (``tui.control.jobwatch``); the app and the CLI only read them, in
their own process or decoded from a server's answers (``tui.model.wire``). A job's log lines
are kept in a ``LogBuffer``, made safe to draw as they arrive.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from tui.model.diagnose import Signal
from tui.model.jobspec import JobSpec
from tui.model.jobstate import TERMINAL
from tui.model.poolview import PoolsView
from tui.model.processingview import ProcessingView
from tui.model.stages import StagesView
from tui.model.termsafe import terminal_safe

LOG_LIMIT = 200_000  # lines kept per job; the oldest half goes when it is reached

# ---------------------------------------------------------------------------------------------
# Plain data the app renders


@dataclass(frozen=True)
class Owner:
    """A checkpoint writer: a rank on a host's GPU (``gpu`` is the local rank without GPUs)."""

    rank: int | None
    host: str | None
    gpu: int | None

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> Owner:
        d = d or {}
        return cls(d.get("rank"), d.get("host"), d.get("gpu"))

    def label(self) -> str:
        where = f"{self.host or '?'}/gpu{self.gpu}" if self.gpu is not None else (self.host or "?")
        return where if self.rank is None else f"{where} r{self.rank}"


@dataclass(frozen=True)
class CheckpointSave:
    step: int
    status: str  # writing | done | failed
    owner: Owner
    bytes: int | None = None
    seconds: float | None = None
    time: float | None = None
    path: str | None = None
    error: str | None = None

    @property
    def speed_bps(self) -> float | None:
        if self.bytes and self.seconds and self.seconds > 0:
            return self.bytes / self.seconds
        return None


@dataclass(frozen=True)
class OwnerMove:
    time: float | None
    policy: str | None
    from_: Owner
    to: Owner
    reason: str | None


@dataclass(frozen=True)
class CheckpointView:
    """Who owns a job's checkpoints and what they wrote."""

    policy: str
    directory: str | None
    owners: tuple[Owner, ...]  # current owners: from saves when any, else from the policy
    last_done: CheckpointSave | None
    saves: tuple[CheckpointSave, ...]  # one per (step, owner), in the order they started
    moves: tuple[OwnerMove, ...]
    failed: int


@dataclass(frozen=True)
class JobRow:
    """One line of the jobs table (and the head of the job view)."""

    job_id: str
    name: str
    state: str
    placement: tuple[dict[str, Any], ...]
    ranks_running: int
    ranks_total: int
    step: int | None
    loss: float | None
    step_rate: float | None  # steps per second
    total_steps: int | None
    created: float | None
    started: float | None
    ended: float | None
    restarts: int
    checkpoint_owner: str
    cause: dict[str, Any] | None
    unreachable: tuple[str, ...] = ()  # placement hosts that did not answer the last round

    @property
    def eta_s(self) -> float | None:
        if self.total_steps is None or self.step is None or not self.step_rate:
            return None
        if self.state in TERMINAL:
            return None
        return max(0.0, (self.total_steps - (self.step + 1)) / self.step_rate)

    def runtime_s(self, now: float) -> float | None:
        if self.started is None:
            return None
        return max(0.0, (self.ended if self.ended is not None else now) - self.started)


@dataclass(frozen=True)
class JobDetail:
    row: JobRow
    spec: dict[str, Any]
    ranks: tuple[dict[str, Any], ...]
    points: tuple[tuple[int, float], ...]  # (step, loss), steps ascending
    points_version: int
    checkpoints: CheckpointView
    events: tuple[dict[str, Any], ...]
    logs: LogBuffer
    signals: tuple[Signal, ...] = ()  # live bottleneck signals, worst first (tui.model.diagnose)
    stages: StagesView | None = None  # a [model_parallel] job's plan and stages (tui.model.stages)
    pools: PoolsView | None = None  # a job made of worker pools: its pools (tui.model.poolview)
    processing: ProcessingView | None = None  # a processing job: inputs and outputs (tui.model.processingview)


@dataclass(frozen=True)
class JobsSnapshot:
    rows: tuple[JobRow, ...]
    version: int
    error: str | None = None
    polled_at: float | None = None

    def row(self, job_id: str) -> JobRow | None:
        return next((r for r in self.rows if r.job_id == job_id), None)


@dataclass(frozen=True)
class StopPlan:
    """What stopping a job touches, for the confirmation dialog."""

    job_id: str
    state: str
    hosts: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...]  # (host, ranks, GPUs)
    grace_s: float
    pools: tuple[tuple[str, int, tuple[str, ...]], ...] = ()  # a pool job's: (role, replicas, hosts)

    @property
    def rank_count(self) -> int:
        return sum(len(r) for _, r, _ in self.hosts)


# ---------------------------------------------------------------------------------------------
# Logs


class LogBuffer:
    """A job's log lines as (host, rank, text), append-only; old lines drop off past ``limit``.

    Indices are absolute: line ``i`` stays line ``i`` while it is kept (``base`` is the index of
    the oldest one kept), so a view can cache by index.
    """

    def __init__(self, limit: int = LOG_LIMIT):
        self._lock = threading.Lock()
        self._lines: list[tuple[str, int, str]] = []
        self.base = 0
        self.limit = limit
        self.ranks: set[int] = set()

    def __len__(self) -> int:
        return self.base + len(self._lines)

    def extend(self, lines: Iterable[tuple[str, int, str]]) -> None:
        """Add lines, made safe to draw (``terminal_safe``): views and searches see that text."""
        new = [(host, rank, terminal_safe(text)) for host, rank, text in lines]
        if not new:
            return
        with self._lock:
            self._lines.extend(new)
            self.ranks.update(r for _, r, _ in new)
            if len(self._lines) > self.limit:
                drop = len(self._lines) - self.limit // 2
                del self._lines[:drop]
                self.base += drop

    def get(self, index: int) -> tuple[str, int, str] | None:
        i = index - self.base
        if 0 <= i < len(self._lines):
            return self._lines[i]
        return None

    def since(self, index: int) -> tuple[int, list[tuple[str, int, str]]]:
        """(first index returned, lines from ``index`` on) — what a view has not seen yet."""
        with self._lock:
            start = max(index, self.base)
            return start, self._lines[start - self.base :]

class JobSource(Protocol):
    """What the app needs from a job watcher (``JobWatch``, or a recorded stand-in in tests)."""

    def start(self) -> Any: ...
    def stop(self) -> None: ...
    def snapshot(self) -> JobsSnapshot: ...
    def detail(self, job_id: str) -> JobDetail | None: ...
    def select(self, job_id: str | None) -> None: ...
    def kick(self) -> None: ...
    def stop_plan(self, job_id: str) -> StopPlan: ...
    def launch(self, spec: JobSpec) -> str: ...
    def stop_job(self, job_id: str) -> str: ...
    def inventory_hosts(self) -> list[str]: ...
