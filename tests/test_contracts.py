"""Contracts a user or a script relies on: every command's ``--json`` keys and types (as
docs/contracts.md lists them), a ``sim`` marker wherever a simulated GPU is shown, rank strings
made safe in ``rigdeck metrics``, and MASTER_ADDR on the route the other hosts use."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests._require import require
from tui.controller import HostReport
from tui.history import History
from tui.jobs import JobManager, JobView
from tui.scheduler import NodeAssignment

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ROOT / "tests" / "jobscripts" / "hostile_metrics.py"
NONE = type(None)
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # anything but tab and newline

# -- sim markers ------------------------------------------------------------------------------


def _mixed_view() -> JobView:
    """h1's GPUs simulated, h2's real."""
    placement = [
        {"host": "h1", "address": "10.0.0.1", "slots": 2, "gpus": [0, 1], "cpus": 8,
         "instance_type": "rigdeck.sim-gpu-4", "simulated": True},
        {"host": "h2", "address": "10.0.0.2", "slots": 2, "gpus": [2, 3], "cpus": 8,
         "instance_type": "rigdeck.gpu-4xh100", "simulated": False},
    ]
    ranks = [{"rank": i, "host": h, "local_rank": i % 2, "gpu": g, "pid": 100 + i, "state": "running",
              "exit_code": None, "signal": None}
             for i, (h, g) in enumerate([("h1", 0), ("h1", 1), ("h2", 2), ("h2", 3)])]
    return JobView(job_id="j-1", name="j", state="running", spec={}, placement=placement, ranks=ranks)


def test_status_text_marks_only_the_simulated_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli import _print_job

    _print_job(_mixed_view())
    lines = capsys.readouterr().out.splitlines()
    assert "placement h1[2 gpus 0,1] sim, h2[2 gpus 2,3]" in lines
    gpu_cells = {ln.split()[0]: ln.split()[3:5] for ln in lines if ln[:1].isdigit()}
    assert gpu_cells == {"0": ["0", "sim"], "1": ["1", "sim"], "2": ["2", "102"], "3": ["3", "103"]}


def test_job_view_placement_and_ranks_mark_only_the_simulated_gpus() -> None:
    from tui.app import placement_markup
    from tui.widgets.format import PLAIN, placement_text
    from tui.widgets.tables import RanksTable, rank_rows

    v = _mixed_view()
    assert placement_text(v.placement) == "h1[0,1] sim h2[2,3]"
    assert placement_markup(v.placement) == "h1[0,1][$text-muted] sim[/] h2[2,3]"
    rows = dict(rank_rows(v.ranks, v.placement))
    assert [rows[k][3] for k in ("0", "1", "2", "3")] == [(0, True), (1, True), (2, False), (3, False)]
    table = RanksTable()
    cells = [table.render_cell("gpu", rows[k][3], PLAIN).plain for k in ("0", "2")]
    assert cells == ["0 sim", "2"]
    no_gpu = {**v.ranks[0], "gpu": None}
    assert dict(rank_rows([no_gpu], v.placement))["0"][3] == (None, False)  # no GPU: nothing simulated


def test_summary_counts_only_the_simulated_gpus() -> None:
    from tui.app import summarize

    sim = {"status": "up", "gpus": [{"simulated": True, "processes": []}] * 4}
    real = {"status": "up", "gpus": [{"simulated": False, "processes": []}] * 4}
    assert summarize([sim, real])["simulated"] == 4
    assert summarize([real])["simulated"] == 0
    assert summarize([sim, sim])["simulated"] == 8


async def test_app_marks_simulated_gpus_in_the_job_view_the_stop_dialog_and_the_summary() -> None:
    from textual.widgets import Static

    from tests.ui_fixtures import (
        JOB,
        NOW,
        FakeController,
        FakeMonitor,
        RecordedJobs,
        cluster_state,
        gpu_sample,
        host_sample,
        recorded_app,
    )
    from tui.app import RigdeckApp
    from tui.widgets.tables import RanksTable

    app = recorded_app()  # every GPU simulated
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.press("4")
        await pilot.pause()
        head = str(app.query_one("#job-head", Static).render())
        assert f"{JOB}  running  on h1[0,1] sim h2[0,1] sim" in head
        ranks = app.query_one("#ranks-table", RanksTable)
        assert [ranks.cell_text(k, "gpu") for k in ("0", "1", "2", "3")] == ["0 sim", "1 sim", "0 sim", "1 sim"]
        assert "8 total (sim)" in str(app.query_one("#summary", Static).render())
        await pilot.press("3", "s")
        await pilot.pause()
        body = str(app.screen.query_one("#stop-body", Static).render())
        assert "h1: ranks 0, 1 on GPUs 0, 1 sim" in body

    state = cluster_state()  # then h2 reports real GPUs
    real = [{**gpu_sample(2, idx, 30), "simulated": False, "name": "NVIDIA H100"} for idx in range(4)]
    state.apply_sample("h2", {**host_sample(2, 30, real), "gpu_source": "nvml", "simulated": False},
                       received_at=30.0)
    app = RigdeckApp(FakeController(), monitor=FakeMonitor(state), jobs=RecordedJobs(),  # type: ignore[arg-type]
                     clock=lambda: NOW, keymap_file=Path("/nonexistent/keys.toml"))
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        summary = str(app.query_one("#summary", Static).render())
        assert "8 total (4 sim)" in summary, summary


# -- metrics text ---------------------------------------------------------------------------


def test_metrics_text_prints_rank_strings_through_terminal_safe(capsys: pytest.CaptureFixture[str]) -> None:
    from tui.cli import _print_metrics

    _print_metrics([
        {"host": "h1", "rank": 0, "step": "\x1b[2J3", "loss": "\x1b]52;c;ZXZpbA==\x070.5"},
        {"host": "h1", "rank": "\x1bc0", "event": "\x1b]0;title\x07checkpoint\x07",
         "status": "do\x08ne\x1b[?1049h", "step": "\x9b5"},
    ])
    out = capsys.readouterr().out
    assert not CONTROL.search(out), repr(out)
    assert "step 3" in out and "loss 0.5" in out and "checkpoint" in out and "title" not in out
