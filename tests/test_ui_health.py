"""Training that heals itself, in the app (issue 36): an unhealthy GPU (an XID 79, simulated) and a
GPU drained by hand as the GPU view, the cluster map and the hosts view show them, and the Job view
of a job rigdeck moved off the failing GPU (its incidents panel, goodput in its head). Pilot tests
over recorded data (tests/ui_fixtures.py: ``healing_state``, ``healing_jobs``), each in the app's
process and through a server the app attaches to; then snapshots of those views.

Expected values come from the fixture's constants (the fault's words, the steps, the times), not
from the code under test."""

from __future__ import annotations

from typing import Any

import pytest
from textual.widgets import Static

from tests.kit.pilot import static_text, until
from tests.ui_fixtures import (
    FAULT_MESSAGE,
    FAULT_STEP,
    HAND_DRAIN,
    JOB,
    NOW,
    RESUME_STEP,
    RESUMED_AT,
    STOPPED_AT,
    T0,
    XID_REASON,
    healing_incident,
    healing_jobs,
    healing_state,
    recorded_app,
    settle,
    stop_servers,
)
from tui.app.shell import RigdeckApp
from tui.app.widgets.clustermap import DRAINED_GLYPH, UNHEALTHY_GLYPH, ClusterMap
from tui.app.widgets.tables import GpusTable, HostsTable

SIZE = (120, 36)


@pytest.fixture(params=["embedded", "server"])
def kind(request: pytest.FixtureRequest) -> Any:
    """Each test twice: the controller in the app's process, and a server the app attaches to
    (the health and the drains then come through the server's state mirror)."""
    yield request.param
    stop_servers()


def healing_app(kind: str = "embedded", incident: bool = True) -> RigdeckApp:
    app: RigdeckApp = recorded_app(kind=kind, state=healing_state(), jobs=healing_jobs(incident))
    return app


def gpu_row(app: RigdeckApp, host: str, index: int) -> str:
    g = app.client.state.gpu(host, index)
    assert g is not None
    return f"{host}/{g.uuid}"


# ---------------------------------------------------------------------------------------------
# GPUs: the GPU view, the map, the hosts view


async def test_gpu_view_marks_the_unhealthy_and_the_drained_gpu_and_says_why(kind: str) -> None:
    app = healing_app(kind)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("2")
        table = app.query_one("#gpus-table", GpusTable)
        await until(pilot, lambda: table.row_count == 12)
        sick, drained, healthy = gpu_row(app, "h1", 1), gpu_row(app, "h2", 2), gpu_row(app, "h1", 0)
        assert table.cell_text(sick, "gpu") == "1 sim ✗"
        assert table.cell_text(drained, "gpu") == "2 sim ⊘"
        assert table.cell_text(healthy, "gpu") == "0 sim"
        # The reason where the job would be (the cell is cut to its width on screen; not here).
        assert table.cell_text(sick, "job") == f"unhealthy: {XID_REASON}"
        assert table.cell_text(drained, "job") == HAND_DRAIN  # "drained by root: ...", not said twice
        assert table.cell_text(healthy, "job") == f"{JOB} r0"
        # Neither takes a rank of the job any more: its ranks run on h1 GPUs 0 and 2.
        assert table.cell_text(gpu_row(app, "h1", 2), "job") == f"{JOB} r1"


async def test_map_draws_them_apart_in_every_colour_mode_and_its_detail_says_why(kind: str) -> None:
    app = healing_app(kind)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("8")
        m = app.query_one("#cluster-map", ClusterMap)
        await until(pilot, lambda: app.tabs.active == "map" and len(m.hosts) == 3)
        legend = static_text(app, "#map-legend")
        assert f"{UNHEALTHY_GLYPH} 1 unhealthy" in legend and f"{DRAINED_GLYPH} 1 drained" in legend
        for mode in ("util", "memory", "job"):
            assert m.mode == mode
            assert m.cell_at(0, 1)[0] == UNHEALTHY_GLYPH, mode  # h1 GPU 1
            assert m.cell_at(1, 2)[0] == DRAINED_GLYPH, mode  # h2 GPU 2
            assert m.cell_at(0, 3)[0] not in (UNHEALTHY_GLYPH, DRAINED_GLYPH), mode  # h1 GPU 3: free
            await pilot.press("m")
            await pilot.pause()
        m.move_to(0, 1)
        await pilot.pause()
        detail = " ".join(static_text(app, "#map-detail").split())
        assert "h1 up · GPU 1 (simulated)" in detail and f"unhealthy: {XID_REASON}" in detail
        assert detail.endswith("free")  # its job left it
        m.move_to(1, 2)
        await pilot.pause()
        detail = " ".join(static_text(app, "#map-detail").split())
        assert "h2 up · GPU 2 (simulated)" in detail and f"drained: {HAND_DRAIN}" in detail


async def test_map_legend_names_no_unhealthy_or_drained_gpu_when_there_is_none() -> None:
    app = recorded_app()
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("8")
        await until(pilot, lambda: "GPUs" in static_text(app, "#map-legend"))
        legend = static_text(app, "#map-legend")
        assert "unhealthy" not in legend and "drained" not in legend


async def test_hosts_view_counts_them_and_its_detail_names_each(kind: str) -> None:
    app = healing_app(kind)
    async with app.run_test(size=SIZE) as pilot:
        table = app.query_one("#hosts-table", HostsTable)
        await until(pilot, lambda: table.row_count == 3 and table.cell_text("h1", "why") != "")
        assert [table.cell_text(h, "why") for h in ("h1", "h2", "h3")] == [
            "GPUs: 1 unhealthy", "GPUs: 1 drained", ""]
        assert [table.cell_text(h, "state") for h in ("h1", "h2", "h3")] == ["up", "up", "up"]
        assert table.cursor_key == "h1"
        detail = " ".join(static_text(app, "#host-detail").split())
        assert f"GPU 1 unhealthy: {XID_REASON}" in detail
        await pilot.press("down")
        await until(pilot, lambda: "drained" in static_text(app, "#host-detail"))
        detail = " ".join(static_text(app, "#host-detail").split())
        assert f"GPU 2 drained: {HAND_DRAIN}" in detail and "unhealthy" not in detail
        await pilot.press("down")
        await until(pilot, lambda: "h3" in static_text(app, "#host-detail"))
        assert "GPU " not in static_text(app, "#host-detail")  # all four healthy: nothing said


# ---------------------------------------------------------------------------------------------
# The Job view: the incidents panel and goodput


def expected_goodput() -> int:
    """From the fixture's steps: the first attempt's up to its checkpoint, then the second's, each
    0.45 s, over the wall time since the job first started (T0 + 1), in whole percent."""
    second = int((NOW - 1 - RESUMED_AT) / 0.45)
    counted = (RESUME_STEP + 1) + second
    return round(100 * counted * 0.45 / (NOW - (T0 + 1.0)))


async def test_job_view_shows_no_incidents_panel_and_no_goodput_while_nothing_failed(kind: str) -> None:
    app = healing_app(kind, incident=False)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        await until(pilot, lambda: JOB in static_text(app, "#job-head"))
        detail = app.jobwatch.detail(JOB)
        assert detail is not None and not detail.incidents and detail.row.restarts == 0
        assert detail.goodput is not None and detail.goodput.ratio is not None  # known, not worth a place
        head = static_text(app, "#job-head")
        assert "goodput" not in head and "restart" not in head
        assert not app.query_one("#job-incidents", Static).display


async def test_job_view_shows_the_incident_and_goodput_after_a_gpu_fault(kind: str) -> None:
    app = healing_app(kind)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        box = app.query_one("#job-incidents", Static)
        await until(pilot, lambda: box.display)
        assert box.display
        lines = static_text(app, "#job-incidents").splitlines()
        # The restart in its parts (detection, stop, start, first step); the steps lost are not in
        # the history's incident: the app reads them from the steps.
        assert " ".join(" ".join(lines).split()) == (
            f"incident gpu host h1 GPU 1 after step {FAULT_STEP}: detected in 3 s, "
            f"stop 2.0 s + start 2.0 s + first step 10 s = next first step {RESUMED_AT - STOPPED_AT:.0f} s after "
            f"detection, {FAULT_STEP - RESUME_STEP} step(s) lost — {FAULT_MESSAGE}")
        head = " ".join(static_text(app, "#job-head").split())
        assert "running after 1 restart(s) on h1[0,2] sim h2[0,1] sim" in head
        assert f"goodput {expected_goodput()}%" in head


async def test_job_view_shows_the_newest_four_incidents_and_counts_the_rest() -> None:
    from dataclasses import replace

    jobs = healing_jobs()
    first = healing_incident()
    track = jobs._tracks[JOB]
    track.incidents = tuple(replace(first, attempt=a, last_step=float(FAULT_STEP + 10 * a)) for a in range(6))
    app: RigdeckApp = recorded_app(state=healing_state(), jobs=jobs)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("4")
        box = app.query_one("#job-incidents", Static)
        await until(pilot, lambda: box.display)
        text = " ".join(static_text(app, "#job-incidents").split())
        assert text.startswith("2 earlier: rigdeck status shows every one")
        shown = [int(s.split()[0].rstrip(":")) for s in text.split("after step ")[1:]]
        assert shown == [FAULT_STEP + 10 * a for a in range(2, 6)]  # the newest four, oldest first


# ---------------------------------------------------------------------------------------------
# Snapshots (update with --snapshot-update after an intended change of the look; review the SVGs)


@pytest.mark.parametrize(
    "view, keys",
    [
        ("hosts", ()),
        ("gpus", ("2",)),
        ("job", ("4",)),
        ("map", ("8", "right")),  # the cursor on h1 GPU 1: its detail says why
    ],
)
def test_views_with_an_unhealthy_and_a_drained_gpu(snap_compare: Any, view: str, keys: tuple[str, ...]) -> None:
    assert snap_compare(healing_app(), terminal_size=SIZE, run_before=settle(*keys))
