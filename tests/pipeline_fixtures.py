"""Recorded pipelines for the Pipelines view's and the pipeline CLI's tests: PipelineDetail
objects as the controller builds them (tui.model.pipelineview), no network, no clocks.

- PIPELINE (running): preprocess on 3 hosts succeeded; train on 2 running, attempt 2 of 3;
  evaluate pending (needs train and preprocess); tune, a sweep step, running; register
  skipped by its ``when``.
- FAILED_PIPELINE: fetch cached (reused from an earlier run), train failed after 3 attempts,
  report skipped because of it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.ui_fixtures import FAILED_JOB, JOB, OLD_JOB, SWEEP, T0
from tui.model.pipelineview import PipelineDetail, PipelineRow, StepRow

PIPELINE = "steps-demo-pl5c2e91"
FAILED_PIPELINE = "nightly-pl0b7d33"
EARLIER = "nightly-pl9a4410"  # the run whose fetch step FAILED_PIPELINE reuses

WHEN = "steps.preprocess.metrics.rows >= 1000000"


def _row(pipeline_id: str, name: str, state: str, created: float, steps: tuple[StepRow, ...],
         ended: float | None = None, reason: str | None = None, path: str | None = None) -> PipelineRow:
    def n(*states: str) -> int:
        return sum(1 for s in steps if s.state in states)

    return PipelineRow(
        pipeline_id=pipeline_id, name=name, state=state, created=created, ended=ended, reason=reason,
        steps=len(steps), succeeded=n("succeeded"), cached=n("cached"), failed=n("failed"),
        skipped=n("skipped"), running=n("staging", "queued", "starting", "running"), path=path,
    )


def running_pipeline() -> PipelineDetail:
    created = T0 - 200
    steps = (
        StepRow(
            name="preprocess", state="succeeded", kind="job", job_id=OLD_JOB, attempt=1,
            max_attempts=2, started=created + 1, ended=created + 61, hosts=("h1", "h2", "h3"),
            metrics=(("rows", 48000.0),), artifacts=(("output", 3, 12_582_912),),
            cache_key="c0ffee01",
        ),
        StepRow(
            name="train", state="running", kind="job", depends_on=("preprocess",), depth=1,
            job_id=JOB, attempt=2, max_attempts=3, started=T0, hosts=("h1", "h2"),
            inputs=(("train", "steps.preprocess.output"),),
            reason="attempt 1: host h3 lost (retried: on = [\"failed\", \"host_lost\"])",
        ),
        StepRow(
            name="tune", state="running", kind="sweep", depends_on=("preprocess",), depth=1,
            sweep_id=SWEEP, attempt=1, max_attempts=1, started=created + 70, hosts=("h1", "h2"),
        ),
        StepRow(
            name="evaluate", state="pending", kind="job", depends_on=("train", "preprocess"),
            depth=2, max_attempts=1, reason="waits for train",
            inputs=(("model", "steps.train.model"), ("test", "steps.preprocess.output")),
        ),
        StepRow(
            name="register", state="skipped", kind="job", depends_on=("preprocess",), depth=1,
            when=WHEN, reason="when is false: steps.preprocess.metrics.rows is 48000",
        ),
    )
    return PipelineDetail(_row(PIPELINE, "steps-demo", "running", created, steps,
                               path="examples/pipeline-steps/pipeline.toml"), steps)


def failed_pipeline() -> PipelineDetail:
    created = T0 - 3000
    steps = (
        StepRow(
            name="fetch", state="cached", kind="job", job_id=OLD_JOB, max_attempts=1,
            hosts=("h1",), cached_from=EARLIER, cache_key="9d1e44aa",
            artifacts=(("output", 12, 1_048_576),),
        ),
        StepRow(
            name="train", state="failed", kind="job", depends_on=("fetch",), depth=1,
            job_id=FAILED_JOB, attempt=3, max_attempts=3, started=created + 5,
            ended=created + 905, hosts=("h1", "h2"),
            reason="rank 3 on h2 killed by signal 9",
        ),
        StepRow(
            name="report", state="skipped", kind="job", depends_on=("train",), depth=2,
            reason="needs train, which failed",
        ),
    )
    return PipelineDetail(
        _row(FAILED_PIPELINE, "nightly", "failed", created, steps, ended=created + 906,
             reason="step train failed: rank 3 on h2 killed by signal 9"),
        steps,
    )


def recorded_pipelines() -> dict[str, PipelineDetail]:
    """Newest first."""
    return {PIPELINE: running_pipeline(), FAILED_PIPELINE: failed_pipeline()}


class UnknownPipeline(Exception):
    """What the stand-in raises for a pipeline it does not have (the controller's own error
    type is not ours to name here)."""


class RecordedPipelines:
    """Stands in for the controller's pipelines: recorded details; stops and retries are
    recorded (and change the detail as the controller would say they did)."""

    def __init__(self, empty: bool = False):
        self.details: dict[str, PipelineDetail] = {} if empty else recorded_pipelines()
        self.stopped: list[str] = []
        self.retried: list[tuple[str, str]] = []
        self.started: list[Any] = []
        self.error: Exception | None = None
        self.calls = 0

    def _check(self) -> None:
        self.calls += 1
        if self.error is not None:
            raise self.error

    def rows(self) -> list[PipelineRow]:
        self._check()
        return [d.row for d in self.details.values()]

    def detail(self, ref: str) -> PipelineDetail:
        self._check()
        if ref in self.details:
            return self.details[ref]
        hits = [k for k in self.details if k.startswith(ref)]
        if len(hits) == 1:
            return self.details[hits[0]]
        raise UnknownPipeline(f"no pipeline {ref!r} (rigdeck pipelines lists them)")

    def stop(self, ref: str, user: str | None = None) -> PipelineDetail:
        d = self.detail(ref)
        self.stopped.append(d.row.pipeline_id)
        steps = tuple(replace(s, state="stopped", reason="stopped by the operator", ended=T0 + 125)
                      if s.state in ("running", "queued", "staging") else
                      replace(s, state="skipped", reason="the pipeline was stopped")
                      if s.state == "pending" else s for s in d.steps)
        new = PipelineDetail(replace(d.row, state="stopped", ended=T0 + 125, running=0), steps)
        self.details[d.row.pipeline_id] = new
        return new

    def retry(self, ref: str, step: str) -> PipelineDetail:
        d = self.detail(ref)
        self.retried.append((d.row.pipeline_id, step))
        steps = tuple(replace(s, state="queued", attempt=s.attempt, reason=None) if s.name == step
                      else s for s in d.steps)
        new = PipelineDetail(replace(d.row, state="running", ended=None, reason=None,
                                     failed=d.row.failed - 1, running=d.row.running + 1), steps)
        self.details[d.row.pipeline_id] = new
        return new


def pipeline_client(pipes: RecordedPipelines | None = None, **kw: Any) -> Any:
    """An InProcessClient over the recorded cluster, jobs and sweeps (tests/ui_fixtures.py)
    whose pipeline calls answer from ``pipes``."""
    from tests.ui_fixtures import (
        FakeController,
        FakeMonitor,
        RecordedJobs,
        RecordedSweeps,
        cluster_state,
        recorded_service,
    )
    from tui.client import InProcessClient

    rec: RecordedPipelines = pipes if pipes is not None else RecordedPipelines()

    class PipelineClient(InProcessClient):
        recorded = rec

        def pipeline(self, spec: Any) -> PipelineDetail:
            rec.started.append(spec)
            return rec.detail(PIPELINE)

        def pipelines(self) -> list[PipelineRow]:
            return rec.rows()

        def pipeline_detail(self, ref: str) -> PipelineDetail:
            return rec.detail(ref)

        def pipeline_stop(self, ref: str) -> PipelineDetail:
            return rec.stop(ref)

        def pipeline_retry(self, ref: str, step: str) -> PipelineDetail:
            return rec.retry(ref, step)

    service = recorded_service(kw.pop("controller", None) or FakeController(),
                               FakeMonitor(cluster_state()), kw.pop("jobs", None) or RecordedJobs(),
                               kw.pop("sweeps", None) or RecordedSweeps())
    return PipelineClient(service=service)


def pipeline_app(pipes: RecordedPipelines | None = None, **kw: Any) -> Any:
    """The app over the recorded data (its clock fixed at NOW) with ``pipes`` as its pipelines."""
    from tests.ui_fixtures import recorded_app

    return recorded_app(client=pipeline_client(pipes), **kw)
