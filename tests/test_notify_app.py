"""The app's side of notifications: a job that fails while the app watches makes a toast and
rings the terminal bell, embedded and attached to a server alike; ``app = false`` in
``[notify]`` keeps the app quiet, and a job already ended when the app opened is no news."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.ui_fixtures import JOB, RecordedJobs, recorded_app, stop_servers
from tui.model.jobview import JobsSnapshot
from tui.model.userconfig import NotifyConfig


@pytest.fixture(params=["embedded", "server"])
def kind(request: pytest.FixtureRequest) -> Any:
    yield request.param
    stop_servers()


def _fail(jobs: RecordedJobs) -> None:
    snap = jobs._snapshot
    rows = tuple(dataclasses.replace(r, state="failed", cause={"rank": 1, "host": "h2", "signal": 9})
                 if r.job_id == JOB else r for r in snap.rows)
    jobs._snapshot = JobsSnapshot(rows, snap.version + 1)


async def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, config: str) -> tuple[list[str], int]:
    cfg = tmp_path / "config.toml"
    cfg.write_text(config)
    monkeypatch.setenv("RIGDECK_CONFIG", str(cfg))
    jobs = RecordedJobs()
    app = recorded_app(jobs=jobs, kind=kind)
    toasts: list[str] = []
    bells = [0]
    real_notify = app.notify

    def notify(message: str, **kw: Any) -> None:
        toasts.append(f"{kw.get('title')}|{kw.get('severity')}|{message}")
        real_notify(message, **kw)

    def bell() -> None:
        bells[0] += 1

    app.notify = notify  # type: ignore[method-assign]
    app.bell = bell  # type: ignore[method-assign]
    async with app.run_test(size=(120, 36)) as pilot:
        for _ in range(60):  # the first look: the recorded jobs as they are
            await pilot.pause(0.05)
            if app.jobs_snapshot.rows:
                break
        assert app.jobs_snapshot.rows
        assert not [t for t in toasts if t.startswith("job ")]  # an ended job is no news
        _fail(jobs)
        for _ in range(80):
            await pilot.pause(0.05)
            if any(r.job_id == JOB and r.state == "failed" for r in app.jobs_snapshot.rows):
                break
        await pilot.pause(0.1)
    return [t for t in toasts if t.startswith("job ")], bells[0]


async def test_a_failed_job_makes_a_toast_and_rings_the_bell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             kind: str) -> None:
    toasts, bells = await _run(tmp_path, monkeypatch, kind, '[notify]\non = ["failed"]\n')
    assert toasts == [f"job failed|error|job {JOB} failed: rank 1 on h2 killed by signal 9"], toasts
    assert bells == 1


async def test_app_false_keeps_the_app_quiet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    toasts, bells = await _run(tmp_path, monkeypatch, "embedded", '[notify]\non = ["failed"]\napp = false\n')
    assert toasts == [] and bells == 0


def test_nothing_polled_yet_is_no_first_look() -> None:
    from tui.app.notices import JobNotices

    jobs = RecordedJobs()
    n = JobNotices(NotifyConfig(on=("failed", "succeeded")))
    assert n.feed(JobsSnapshot((), 0), 1.0) == []  # the poller has not looked yet
    assert n.feed(jobs._snapshot, 2.0) == []  # the first real look: jobs already ended are no news
    _fail(jobs)
    assert [e.summary() for e in n.feed(jobs._snapshot, 3.0)] == [f"job {JOB} failed: rank 1 on h2 killed by signal 9"]
