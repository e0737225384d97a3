"""Snapshots of every main view and dialog over recorded data (fixed clock, no randomness).

Update after an intended change of the look with ``pytest tests/test_ui_snapshots.py
--snapshot-update`` and review the SVGs in tests/__snapshots__/.
"""

from __future__ import annotations

from typing import Any

import pytest
from textual.pilot import Pilot

from tests.ui_fixtures import pool_jobs, recorded_app, settle, signal_jobs, stage_jobs


@pytest.mark.parametrize(
    "view, keys",
    [
        ("hosts", ()),
        ("gpus", ("2",)),
        ("jobs", ("3",)),
        ("job", ("4",)),
        ("checkpoints", ("5",)),
        ("logs", ("6",)),
    ],
)
def test_main_views(snap_compare: Any, view: str, keys: tuple[str, ...]) -> None:
    assert snap_compare(recorded_app(), terminal_size=(120, 36), run_before=settle(*keys))


@pytest.mark.parametrize("view, keys", [("hosts", ()), ("gpus", ("2",)), ("job", ("4",))])
def test_views_at_80x24(snap_compare: Any, view: str, keys: tuple[str, ...]) -> None:
    assert snap_compare(recorded_app(), terminal_size=(80, 24), run_before=settle(*keys))


def test_job_view_with_signals(snap_compare: Any) -> None:
    assert snap_compare(recorded_app(jobs=signal_jobs()), terminal_size=(120, 36), run_before=settle("4"))


def test_job_view_with_stages(snap_compare: Any) -> None:
    """A [model_parallel] job: its plan and stages, expected vs measured (tests/ui_fixtures.py)."""
    assert snap_compare(recorded_app(jobs=stage_jobs()), terminal_size=(120, 40), run_before=settle("4"))


def test_job_view_with_pools(snap_compare: Any) -> None:
    """A job made of worker pools: its pools, the Reduction Server sizing line and an evaluator
    killed while training went on (tests/ui_fixtures.py pool_jobs)."""
    assert snap_compare(recorded_app(jobs=pool_jobs()), terminal_size=(120, 40), run_before=settle("4"))


def test_wide_gpu_view(snap_compare: Any) -> None:
    assert snap_compare(recorded_app(), terminal_size=(170, 30), run_before=settle("2"))


@pytest.mark.parametrize(
    "dialog, keys",
    [
        ("launch", ("l",)),
        ("stop", ("3", "s")),
        ("hostkey", ("down", "down", "t")),
        ("help", ("question_mark",)),
    ],
)
def test_dialogs(snap_compare: Any, dialog: str, keys: tuple[str, ...]) -> None:
    assert snap_compare(recorded_app(), terminal_size=(120, 36), run_before=settle(*keys))


def _sweeps(*keys: str) -> Any:
    """Switch to the Sweeps view, wait for its fetch (a worker thread) and two more after it (the
    view redrawn with the same data twice: a loaded machine once drew the snapshot between a
    table's new rows and its new column widths), then press ``keys``."""

    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        await pilot.pause()
        await pilot.press("7")
        for _ in range(400):  # up to 20 s: the fetch is a worker thread, slow on a loaded machine
            await pilot.pause(0.05)
            if app.sweeps_fetches and app.query_one("#trials-table").row_count:
                break
        seen = app.sweeps_fetches
        for _ in range(400):  # about one a second
            if app.sweeps_fetches >= seen + 2:
                break
            await pilot.pause(0.05)
        await settle(*keys)(pilot)

    return run_before


@pytest.mark.parametrize(
    "view, keys",
    [
        ("sweeps", ()),
        ("stop-trial", ("enter", *["down"] * 7, "s")),
        ("stop-sweep", ("S",)),
    ],
)
def test_sweeps_view(snap_compare: Any, view: str, keys: tuple[str, ...]) -> None:
    assert snap_compare(recorded_app(), terminal_size=(120, 36), run_before=_sweeps(*keys))


def test_cluster_map_512x8(snap_compare: Any) -> None:
    """Every GPU of 512 hosts x 8 (simulated) on one 200x60 screen, the cursor moved."""
    from tests.ui_fixtures import map_app

    assert snap_compare(map_app(), terminal_size=(200, 60),
                        run_before=settle("8", "right", "right", "down"))


@pytest.mark.parametrize("mode, keys", [("util", ("8",)), ("job", ("8", "down", "m", "m"))])
def test_cluster_map_small(snap_compare: Any, mode: str, keys: tuple[str, ...]) -> None:
    assert snap_compare(recorded_app(), terminal_size=(120, 36), run_before=settle(*keys))


def test_usage_view(snap_compare: Any) -> None:
    """Three people's GPU hours per week (tests/ui_fixtures.py usage_records), and their sums."""

    async def run_before(pilot: Pilot[Any]) -> None:
        app = pilot.app
        await pilot.pause()
        await pilot.press("u")
        for _ in range(400):  # the read is a worker thread, slow on a loaded machine
            await pilot.pause(0.05)
            if app.views["usage"].usage_reads:
                break
        await pilot.pause()
        app.clear_notifications()
        await pilot.pause()

    assert snap_compare(recorded_app(), terminal_size=(120, 36), run_before=run_before)
