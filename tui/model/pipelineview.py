"""What the faces see of pipelines: frozen dataclasses the controller builds and the app, the CLI
and the server's wire (tui.model.wire) share."""

from __future__ import annotations

from dataclasses import dataclass

# A step's states. While its job runs, the job's own state ("queued", "starting", "running",
# "stopping"; "pending-job": Slurm holds its job queued, its nodes start it); before that
# "pending" (waiting for the steps it needs), "staging" (its inputs are being prepared),
# "waiting" (a retry's backoff); then one of STEP_FINAL.
STEP_FINAL = ("succeeded", "cached", "failed", "skipped", "stopped")
STEP_DONE = ("succeeded", "cached")  # what a dependent step needs of the steps it depends on
PIPELINE_FINAL = ("succeeded", "failed", "stopped")


@dataclass(frozen=True)
class StepRow:
    """One step of a pipeline."""

    name: str
    state: str
    kind: str  # "job" or "sweep"
    depends_on: tuple[str, ...] = ()
    depth: int = 0  # the longest chain of steps before it (0: needs none)
    job_id: str | None = None  # its current or last job; of a cached step, the job it reuses
    sweep_id: str | None = None  # a sweep step's sweep
    attempt: int = 0  # attempts made (0: not run yet)
    max_attempts: int = 1
    started: float | None = None
    ended: float | None = None
    reason: str | None = None  # why it failed, was skipped or stopped, or what it waits for
    when: str | None = None  # its condition, as written
    retry_at: float | None = None  # a retry's backoff ends then
    hosts: tuple[str, ...] = ()
    metrics: tuple[tuple[str, float], ...] = ()  # its final metrics (a sweep: its best trial's)
    # (kind, files, bytes): "output", "model", "checkpoints" as packed when it succeeded
    artifacts: tuple[tuple[str, int, int], ...] = ()
    inputs: tuple[tuple[str, str], ...] = ()  # (channel, "steps.X.output")
    continue_from: str | None = None
    cache_key: str | None = None
    cached_from: str | None = None  # a cached step: the pipeline whose run it reuses

    @property
    def cached(self) -> bool:
        return self.state == "cached"

    @property
    def duration(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended if self.ended is not None else self.started) - self.started


@dataclass(frozen=True)
class PipelineRow:
    """One pipeline, as the pipelines list shows it."""

    pipeline_id: str
    name: str
    state: str  # "running", "stopping", then PIPELINE_FINAL
    created: float
    ended: float | None = None
    reason: str | None = None  # of a failed one: the step and its cause
    steps: int = 0
    succeeded: int = 0
    cached: int = 0
    failed: int = 0
    skipped: int = 0
    running: int = 0  # staging, queued or running
    path: str | None = None  # the spec file it came from
    user: str | None = None  # its owner (who started it)

    @property
    def done(self) -> int:
        return self.succeeded + self.cached + self.failed + self.skipped


@dataclass(frozen=True)
class PipelineDetail:
    """One pipeline with its steps in dependency order (each after every step it needs; file
    order among those ready together)."""

    row: PipelineRow
    steps: tuple[StepRow, ...]

    def step(self, name: str) -> StepRow | None:
        for s in self.steps:
            if s.name == name:
                return s
        return None

    def tree(self) -> list[tuple[str, StepRow]]:
        """The steps as a tree for drawing: (prefix, step), each step under the last step it
        depends on (its place in the order), the others it needs named by the caller from
        ``depends_on``. Steps that need none are roots."""
        children: dict[str | None, list[StepRow]] = {}
        order = {s.name: i for i, s in enumerate(self.steps)}
        for s in self.steps:
            known = [d for d in s.depends_on if d in order]
            parent = max(known, key=lambda d: order[d]) if known else None
            children.setdefault(parent, []).append(s)
        out: list[tuple[str, StepRow]] = []

        def walk(parent: str | None, prefix: str) -> None:
            kids = children.get(parent, [])
            for i, s in enumerate(kids):
                last = i == len(kids) - 1
                if parent is None:
                    out.append(("", s))
                    walk(s.name, "")
                else:
                    out.append((prefix + ("└─ " if last else "├─ "), s))
                    walk(s.name, prefix + ("   " if last else "│  "))

        walk(None, "")
        return out
