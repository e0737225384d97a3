"""The Pipelines view (9), driven by Textual's pilot over recorded pipelines
(tests/pipeline_fixtures.py): the list, the steps as a tree in dependency order, enter on a
step (its job, or a sweep step's sweep), S (asks, then stops), r (retries a failed step), a
controller that fails or hangs; and a snapshot."""

from __future__ import annotations

import threading
from typing import Any

from textual.pilot import Pilot

from tests.kit.pilot import static_text, until
from tests.pipeline_fixtures import (
    FAILED_PIPELINE,
    PIPELINE,
    RecordedPipelines,
    pipeline_app,
    pipeline_client,
    running_pipeline,
)
from tests.ui_fixtures import JOB, NOW, OLD_SWEEP, SWEEP, T0, recorded_app
from tui.app.screens.dialogs import ConfirmSweepStop
from tui.app.shell import RigdeckApp
from tui.app.widgets.pipelines import (
    PipelinesTable,
    StepsTable,
    reason_text,
    step_rows,
)
from tui.app.widgets.sweeps import SweepsTable
from tui.model.pipelineview import StepRow

SIZE = (120, 36)


async def pipelines_shown(app: RigdeckApp, pilot: Pilot[None], rows: int = 2) -> None:
    await pilot.press("9")
    await until(pilot, lambda: app.pipelines_fetches and app.query_one("#steps-table").row_count
                and app.query_one("#pipelines-table").row_count == rows)
    await pilot.pause()


def messages(app: RigdeckApp) -> list[str]:
    return [str(n.message) for n in app._notifications]


async def test_pipelines_list_and_the_steps_tree_in_dependency_order() -> None:
    pipes = RecordedPipelines()
    app = pipeline_app(pipes)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        assert pipes.calls == 0  # nothing fetched while the view is hidden
        await pipelines_shown(app, pilot)
        assert app.tabs.active == "pipelines" and app.pipeline_id == PIPELINE
        table = app.query_one("#pipelines-table", PipelinesTable)
        assert table._order == [PIPELINE, FAILED_PIPELINE]
        cols = ("name", "state", "steps", "running", "cached", "failed", "skipped", "age")
        assert [table.cell_text(PIPELINE, c) for c in cols] == \
            ["steps-demo", "running", "2/5", "2", "0", "0", "1", "5m25s ago"]
        assert [table.cell_text(FAILED_PIPELINE, c) for c in cols] == \
            ["nightly", "failed", "3/3", "0", "1", "1", "1", "52m05s ago"]
        head = static_text(app, "#pipeline-head")
        assert "running" in head and "examples/pipeline-steps/pipeline.toml" in head
        assert "2 of 5 done" in head and "1 succeeded, 0 cached, 0 failed, 1 skipped" in head
        steps = app.query_one("#steps-table", StepsTable)
        # Dependency order, each step under the last step it needs; the others it needs named.
        assert steps._order == ["preprocess", "train", "evaluate", "tune", "register"]
        assert [steps.cell_text(k, "step") for k in steps._order] == [
            "preprocess",
            "├─ train",
            "│  └─ evaluate +preprocess",
            "├─ tune (sweep)",
            "└─ register",
        ]
        assert [steps.cell_text(k, "state") for k in steps._order] == \
            ["succeeded", "running", "pending", "running", "skipped"]
        assert steps.cell_text("preprocess", "hosts") == "h1,h2,h3"
        assert steps.cell_text("train", "hosts") == "h1,h2"
        assert steps.cell_text("train", "attempt") == "2/3"
        assert steps.cell_text("preprocess", "time") == "1m00s"
        assert steps.cell_text("train", "time") == "2m05s"  # running: to the app's clock
        assert steps.cell_text("evaluate", "time") == "-" and steps.cell_text("evaluate", "attempt") == "-"
        assert steps.cell_text("evaluate", "why") == "waits for train"
        assert "rows is 48000" in steps.cell_text("register", "why")
        # The step under the cursor, in full, under the table.
        assert steps.cursor_key == "preprocess"
        line = static_text(app, "#step-detail")
        assert "output 3 files 12.0 MB" in line and "rows=48000" in line and "needs no step" in line
        assert "job ticker-1009-084500-9f3c (enter opens it)" in line
        await pilot.press("enter")  # into the steps
        assert app.focused is steps
        await pilot.press("down", "down", "down", "down")
        assert steps.cursor_key == "register"
        line = static_text(app, "#step-detail")
        assert "when steps.preprocess.metrics.rows >= 1000000" in line and "needs preprocess" in line
        assert "when is false: steps.preprocess.metrics.rows is 48000" in line and "no job yet" in line
        # The failed pipeline: its cached step, its failed step and why.
        await pilot.press("shift+tab", "down")
        await until(pilot, lambda: steps._order == ["fetch", "train", "report"])
        assert app.pipeline_id == FAILED_PIPELINE
        assert [steps.cell_text(k, "step") for k in steps._order] == ["fetch", "└─ train", "   └─ report"]
        assert steps.cell_text("fetch", "state") == "cached"  # not "succeeded"
        assert steps.cell_text("fetch", "cache") == "hit"  # where from: the detail line
        assert steps.cell_text("train", "cache") == "-"
        assert steps.cell_text("train", "state") == "failed" and steps.cell_text("train", "attempt") == "3/3"
        assert steps.cell_text("train", "why") == "rank 3 on h2 killed by signal 9"
        assert steps.cell_text("train", "time") == "15m00s"
        head = static_text(app, "#pipeline-head")
        assert "step train failed: rank 3 on h2 killed by signal 9" in head and "1 cached" in head
        assert steps.cursor_key == "fetch"
        assert "cached: reuses nightly-pl9a4410" in static_text(app, "#step-detail")


async def test_cached_is_drawn_unlike_succeeded() -> None:
    app = pipeline_app()
    async with app.run_test(size=SIZE) as pilot:
        await pipelines_shown(app, pilot)
        table = app.query_one("#steps-table", StepsTable)
        pal = table.palette
        cached = table.render_cell("state", "cached", pal)
        succeeded = table.render_cell("state", "succeeded", pal)
        assert cached.style != succeeded.style and cached.style == pal["accent"]
        assert succeeded.style == pal["ok"]
        assert table.render_cell("state", "failed", pal).style == pal["crit"]


async def test_enter_on_a_step_opens_its_job_and_a_sweep_step_its_sweep() -> None:
    app = pipeline_app()
    async with app.run_test(size=SIZE) as pilot:
        await pipelines_shown(app, pilot)
        await pilot.press("enter", "down", "enter")  # train
        await pilot.pause()
        assert app.tabs.active == "job" and app.job_id == JOB
        assert JOB in static_text(app, "#job-head")
        # Back: the sweep step opens the Sweeps view on its sweep.
        await pilot.press("9")
        await pilot.pause()
        await pilot.press("enter")
        steps = app.query_one("#steps-table", StepsTable)
        steps.move_cursor(row=steps._order.index("tune"))
        await pilot.pause()
        await pilot.press("enter")
        await until(pilot, lambda: app.query_one("#sweeps-table", SweepsTable).cursor_key == SWEEP
                    and app.sweep_detail is not None)
        assert app.tabs.active == "sweeps" and app.sweep_id == SWEEP
        assert app.query_one("#sweeps-table", SweepsTable).cursor_key == SWEEP
        # A pending step has no job: it says so and stays.
        await pilot.press("9")
        await pilot.pause()
        await pilot.press("enter")
        steps.move_cursor(row=steps._order.index("evaluate"))
        before = app.job_id
        await pilot.press("enter")
        await pilot.pause()
        assert app.tabs.active == "pipelines" and app.job_id == before
        assert any("step evaluate has no job yet (pending)" in m for m in messages(app))


async def test_a_sweep_step_puts_the_sweeps_cursor_on_its_sweep() -> None:
    """Its sweep is not the newest, and the Sweeps view was seen before: the cursor moves to it
    and the view shows it, not the row the cursor was on."""
    from dataclasses import replace

    pipes = RecordedPipelines()
    d = pipes.details[PIPELINE]
    pipes.details[PIPELINE] = replace(d, steps=tuple(
        replace(s, sweep_id=OLD_SWEEP) if s.name == "tune" else s for s in d.steps))
    app = pipeline_app(pipes)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("7")
        sweeps = app.query_one("#sweeps-table", SweepsTable)
        await until(pilot, lambda: sweeps.row_count == 2 and app.sweep_detail is not None)
        assert sweeps.cursor_key == SWEEP
        await pipelines_shown(app, pilot)
        await pilot.press("enter")
        steps = app.query_one("#steps-table", StepsTable)
        steps.move_cursor(row=steps._order.index("tune"))
        await pilot.pause()
        await pilot.press("enter")
        await until(pilot, lambda: sweeps.cursor_key == OLD_SWEEP and app.sweep_detail is not None
                    and app.sweep_detail.row.sweep_id == OLD_SWEEP)
        assert app.tabs.active == "sweeps" and app.sweep_id == OLD_SWEEP
        assert sweeps.cursor_key == OLD_SWEEP
        assert OLD_SWEEP in static_text(app, "#sweep-head")


async def test_stop_asks_first_then_stops_the_pipeline() -> None:
    pipes = RecordedPipelines()
    app = pipeline_app(pipes)
    async with app.run_test(size=SIZE) as pilot:
        await pipelines_shown(app, pilot)
        await pilot.press("S")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmSweepStop)
        assert PIPELINE in static_text(app.screen, "#stop-title")
        body = static_text(app.screen, "#stop-body")
        assert f"train  running, job {JOB}" in body and f"tune  running, sweep {SWEEP}" in body
        assert "2 of 5 steps done" in body and "evaluate" not in body
        await pilot.press("n")
        await pilot.pause(0.3)
        assert not isinstance(app.screen, ConfirmSweepStop) and app.tabs.active == "pipelines"
        assert pipes.stopped == []
        await pilot.press("S")
        await pilot.pause()
        await pilot.press("y")
        await until(pilot, lambda: pipes.stopped)
        assert pipes.stopped == [PIPELINE]
        await until(pilot, lambda: any(f"pipeline {PIPELINE}: stopped" in m for m in messages(app)))
        assert any(f"pipeline {PIPELINE}: stopped" in m for m in messages(app))
        steps = app.query_one("#steps-table", StepsTable)
        await until(pilot, lambda: steps.cell_text("train", "state") == "stopped")
        assert steps.cell_text("train", "state") == "stopped"
        # A pipeline that has ended is not stopped again.
        await pilot.press("S")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmSweepStop)
        assert any("has already ended (stopped)" in m for m in messages(app))
        assert pipes.stopped == [PIPELINE]


async def test_retry_runs_a_failed_step_again_and_refuses_others() -> None:
    pipes = RecordedPipelines()
    app = pipeline_app(pipes)
    async with app.run_test(size=SIZE) as pilot:
        await pipelines_shown(app, pilot)
        await pilot.press("enter")  # the running pipeline's steps, cursor on preprocess
        await pilot.press("r")
        await pilot.pause()
        assert pipes.retried == []
        assert any("step preprocess is succeeded: only a failed or stopped step is retried" in m
                   for m in messages(app))
        await pilot.press("shift+tab", "down")
        steps = app.query_one("#steps-table", StepsTable)
        await until(pilot, lambda: steps._order == ["fetch", "train", "report"])
        await pilot.press("enter", "down")
        assert steps.cursor_key == "train"
        await pilot.press("r")
        await until(pilot, lambda: pipes.retried)
        assert pipes.retried == [(FAILED_PIPELINE, "train")]
        await until(pilot, lambda: steps.cell_text("train", "state") == "queued")
        assert steps.cell_text("train", "state") == "queued"
        assert app.query_one("#pipelines-table", PipelinesTable).cell_text(FAILED_PIPELINE, "state") == "running"


async def test_empty_state_and_keys_with_nothing_selected() -> None:
    app = pipeline_app(RecordedPipelines(empty=True))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("9")
        await until(pilot, lambda: app.pipelines_fetches)
        await pilot.pause()
        assert static_text(app, "#pipelines-status") == "no pipelines: rigdeck pipeline SPEC starts one"
        await pilot.press("S", "r")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmSweepStop)
        assert any("no pipeline selected" in m for m in messages(app))


async def test_an_error_is_shown_and_the_view_recovers() -> None:
    pipes = RecordedPipelines()
    pipes.error = RuntimeError("the pipeline store is locked")
    app = pipeline_app(pipes)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("9")
        await until(pilot, lambda: "locked" in static_text(app, "#pipelines-status"))
        assert "the pipeline store is locked" in static_text(app, "#pipelines-status")
        pipes.error = None
        await until(pilot, lambda: app.query_one("#pipelines-table").row_count == 2)
        assert "locked" not in static_text(app, "#pipelines-status")
        pipes.error = RuntimeError("the pipeline store is locked")
        await until(pilot, lambda: "locked" in static_text(app, "#pipelines-status"))
        assert "showing the last fetched" in static_text(app, "#pipelines-status")
        assert app.query_one("#pipelines-table").row_count == 2


async def test_a_hung_controller_does_not_freeze_the_app() -> None:
    """The controller never answers: the view says it is loading, the app keeps answering
    keys, and one fetch at a time waits (no pile of threads)."""
    gate = threading.Event()
    pipes = RecordedPipelines()
    client = pipeline_client(pipes)
    calls: list[int] = []

    def hang() -> list[Any]:
        calls.append(1)
        gate.wait(10)
        return pipes.rows()

    client.pipelines = hang  # type: ignore[method-assign]
    app = recorded_app(client=client)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("9")
            await pilot.pause(2.5)
            assert static_text(app, "#pipelines-status") == "loading pipelines…"
            assert len(calls) == 1
            await pilot.press("1")
            await pilot.pause()
            assert app.tabs.active == "hosts"
            await pilot.press("9")
            gate.set()
            await until(pilot, lambda: app.query_one("#pipelines-table").row_count == 2)
            assert app.query_one("#pipelines-table").row_count == 2
    finally:
        gate.set()


async def test_the_client_without_pipelines_is_an_error_not_a_crash() -> None:
    """Today's embedded client raises NotImplementedError for pipelines: shown, not raised."""
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("9")
        await until(pilot, lambda: app.pipelines_error)
        assert app.is_running and "pipelines:" in static_text(app, "#pipelines-status")


async def test_help_lists_the_pipelines_keys() -> None:
    app = pipeline_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        groups = dict(app.binding_groups())
        assert ("S", "Stop pipeline", "pipelines.stop") in groups["Pipelines view"]
        assert ("r", "Retry step", "pipelines.retry") in groups["Pipelines view"]
        assert ("9", "Pipelines", "view.pipelines") in groups["Everywhere"]


async def test_the_pipelines_keys_can_be_rebound(tmp_path: Any) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text('[pipelines]\nretry = "R"\n"stop" = "X"\n')
    pipes = RecordedPipelines()
    app = pipeline_app(pipes, keymap_file=keys)
    async with app.run_test(size=SIZE) as pilot:
        await pipelines_shown(app, pilot)
        assert app.keymap_problems == []
        await pilot.press("down", "enter", "down")  # the failed pipeline's train step
        steps = app.query_one("#steps-table", StepsTable)
        await until(pilot, lambda: steps.cursor_key == "train" and app.pipeline_id == FAILED_PIPELINE)
        await pilot.press("r")  # no longer bound
        await pilot.pause(0.3)
        assert pipes.retried == []
        await pilot.press("R")
        await until(pilot, lambda: pipes.retried)
        assert pipes.retried == [(FAILED_PIPELINE, "train")]
        await pilot.press("shift+tab", "up", "X")
        await until(pilot, lambda: isinstance(app.screen, ConfirmSweepStop))
        assert isinstance(app.screen, ConfirmSweepStop)


def test_reason_counts_down_to_a_retry() -> None:
    s = StepRow(name="train", state="waiting", kind="job", attempt=1, max_attempts=3,
                reason="attempt 1 failed: rank 0 on h1 exited with code 1", retry_at=NOW + 75)
    assert reason_text(s, NOW) == "attempt 1 failed: rank 0 on h1 exited with code 1; retry in 1m15s"
    assert reason_text(s, NOW + 100) == "attempt 1 failed: rank 0 on h1 exited with code 1; retry in 0s"
    from dataclasses import replace

    assert reason_text(replace(s, state="running"), NOW) == s.reason  # no longer waiting


def test_step_rows_follow_the_detail() -> None:
    d = running_pipeline()
    rows = dict(step_rows(d, T0 + 10))
    assert rows["train"][3] == 10  # seconds run so far
    assert rows["evaluate"][0] == ("│  └─ ", "evaluate", "job", ("preprocess",))


def _pipelines(*keys: str) -> Any:
    """Switch to the Pipelines view, wait for its fetch (a worker thread), then press ``keys``."""

    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        await pilot.pause()
        await pilot.press("9")
        for _ in range(100):
            await pilot.pause(0.05)
            if app.pipelines_fetches and app.query_one("#steps-table").row_count:
                break
        app.clear_notifications()
        await pilot.pause(0.3)  # the tables' first layout settles before a dialog covers them
        if keys:
            await pilot.press(*keys)
        await pilot.pause(0.2)
        for _ in range(100):  # no fetch lands between here and the capture
            if not app._pipelines_inflight:
                break
            await pilot.pause(0.05)
        app.clear_notifications()
        await pilot.pause()

    return run_before


def test_snapshot_pipelines_view(snap_compare: Any) -> None:
    """The running pipeline's tree, the cursor on train (attempt 2 of 3)."""
    assert snap_compare(pipeline_app(), terminal_size=(120, 36), run_before=_pipelines("enter", "down"))


def test_snapshot_failed_pipeline_with_a_cached_step(snap_compare: Any) -> None:
    assert snap_compare(pipeline_app(), terminal_size=(120, 36),
                        run_before=_pipelines("down", "enter", "down"))
