"""The cluster map (view 8): its data shaping (tui/model/gpumap.py) and, driven by Textual's
pilot, the map over 512 hosts x 8 simulated GPUs at 200x60 (every cell on screen at once, the
cursor and the GPU it selects, the per-user counts, the colour modes) and over the 3-host
recorded cluster at 80x24. Expected values come from the fixture's own rules (``map_job``,
``map_foreign``, ``map_gpu``), not from the code under test."""

from __future__ import annotations

from collections import Counter
from typing import Any

from textual.pilot import Pilot

from tests.kit.pilot import static_text
from tests.ui_fixtures import (
    JOB,
    MAP_DOWN,
    MAP_GPUS,
    MAP_HOSTS,
    MAP_STALE,
    job_row,
    map_app,
    map_foreign,
    map_gpu,
    map_host,
    map_job,
    recorded_app,
)
from tui.app.shell import RigdeckApp
from tui.app.widgets.clustermap import (
    CURSOR_BLOCK,
    DOWN_GLYPH,
    FOREIGN_GLYPH,
    FREE_GLYPH,
    JOB_GLYPH,
    ClusterMap,
)
from tui.app.widgets.format import SPARK
from tui.model.gpumap import (
    FREE,
    Holder,
    assign_slots,
    grid_for,
    holder_of,
    live_placements,
    move,
)
from tui.model.hostviews import GpuClaim, GpuProcess, GpuView

CELL_GLYPHS = set(SPARK) | {FREE_GLYPH, FOREIGN_GLYPH, JOB_GLYPH, DOWN_GLYPH, CURSOR_BLOCK, "?"}
BIG = (200, 60)


# ---------------------------------------------------------------------------------------------
# The data shaping


def _gpu(host: str = "h1", index: int = 0, procs: tuple[GpuProcess, ...] = (),
         claim: GpuClaim | None = None) -> GpuView:
    return GpuView(host, index, f"u{index}", "Simulated GPU", True, 50.0, 100, 1000, 40.0, 100.0,
                   700.0, 1000, 0, procs, claim, False, ())


def test_holder_prefers_processes_then_claim_then_placement() -> None:
    placed = live_placements([
        job_row("placed", "running", ({"host": "h1", "gpus": [0, 1]},)),
        job_row("ended", "failed", ({"host": "h1", "gpus": [2]},)),
    ])
    assert placed == {("h1", 0): "placed", ("h1", 1): "placed"}
    ranked = _gpu(procs=(GpuProcess(1, "ann", 10, "run-a", 0),), claim=GpuClaim("run-b", "bo"))
    assert holder_of(ranked, placed) == Holder("run-a", "bo")  # the claim's user, the process's job
    assert holder_of(_gpu(claim=GpuClaim("run-b", "bo")), placed) == Holder("run-b", "bo")
    assert holder_of(_gpu(index=1), placed) == Holder("placed", None)
    assert holder_of(_gpu(index=2), placed) == FREE  # its job ended
    assert holder_of(_gpu(index=3, procs=(GpuProcess(7, "zed"),)), placed) == Holder(None, "zed", True)


def test_a_gpu_slurm_allocated_is_its_jobs_over_foreign_processes_and_placements() -> None:
    from tui.app.widgets.clustermap import SLURM_GLYPH, cell_look

    slurm = GpuClaim("12", "nobody", None, "slurm")
    placed = {("h1", 0): "placed"}
    held = Holder("slurm job 12", "nobody", False, True)
    assert holder_of(_gpu(claim=slurm), placed) == held  # not the placement's
    assert holder_of(_gpu(procs=(GpuProcess(7, "nobody"),), claim=slurm), {}) == held  # not foreign
    ours = _gpu(procs=(GpuProcess(1, "ann", 10, "run-a", 0),), claim=slurm)
    assert holder_of(ours, {}) == Holder("run-a", "nobody")  # rigdeck's own job on it comes first
    idle = GpuView("h1", 0, "u0", "Simulated GPU", True, 0.0, 0, 1000, 40.0, 100.0, 700.0, 1000, 0, (), slurm,
                   False, ())
    assert not held.free
    for mode in ("util", "memory", "job"):
        assert cell_look(idle, held, mode, 3, False)[0] == SLURM_GLYPH, mode
    assert cell_look(idle, held, "job", 3, False) == (SLURM_GLYPH, "job-3")
    assert cell_look(idle, held, "util", None, True) == (SLURM_GLYPH, "stale")


def test_job_colour_slots_are_stable_and_distinct() -> None:
    first = assign_slots({}, ["b", "a", "c", "a"], 4)
    assert sorted(first.values()) == [0, 1, 2] and first["a"] == 0  # new ones by id, lowest free
    later = assign_slots(first, ["c", "d", "b"], 4)  # a ended, d arrived
    assert later["c"] == first["c"] and later["b"] == first["b"]
    assert later["d"] not in (later["b"], later["c"])
    full = assign_slots(later, ["b", "c", "d", "e", "f"], 4)
    assert full["e"] != full["f"] or len({full["b"], full["c"], full["d"], full["e"]}) == 4
    assert assign_slots({}, ["x"] * 3, 4) == {"x": 0}


def test_grid_packs_512_hosts_into_200x60_and_gives_small_clusters_a_line_each() -> None:
    names = [map_host(i) for i in range(512)]
    g = grid_for(names, 8, 161, 54)
    assert g.cell == 1 and g.per_line == 10 and g.lines == 52
    assert g.per_line * g.block <= 161
    small = grid_for(["h1", "h2", "h3"], 4, 80, 20)
    assert small.per_line == 1 and small.cell == 3 and small.lines == 3
    assert g.at(g.cell_x(13, 5), 1) == (13, 5)
    assert g.at(g.place(13)[1], 1) == (13, None)  # the label


def test_cursor_moves_over_gpus_and_hosts() -> None:
    counts = [8, 8, 0, 8, 4]
    assert move((0, 7), "right", counts, 2) == (1, 0)  # on into the next host
    assert move((1, 0), "left", counts, 2) == (0, 7)
    assert move((0, 5), "down", counts, 2) == (2, 0)  # a host with no GPU: its one place
    assert move((1, 6), "down", counts, 2) == (3, 6)
    assert move((3, 6), "down", counts, 2) == (3, 6)  # nothing below
    assert move((3, 6), "up", counts, 2) == (1, 6)
    assert move((2, 0), "right", counts, 2) == (3, 0)
    assert move((4, 3), "right", counts, 2) == (4, 3)  # the last GPU of the last host


# ---------------------------------------------------------------------------------------------
# The app


async def open_map(app: RigdeckApp, pilot: Pilot[None]) -> ClusterMap:
    await pilot.pause()
    await pilot.press("8")
    m = app.query_one("#cluster-map", ClusterMap)
    for _ in range(60):
        await pilot.pause(0.05)
        if app.tabs.active == "map" and m.hosts and app.focused is m:
            break
    assert app.tabs.active == "map" and app.focused is m
    await pilot.pause()  # what the last layout posted (the legend's fit) is handled
    return m


def visible_lines(m: ClusterMap) -> list[str]:
    """The map's lines as drawn in its region on screen now."""
    return [m.render_line(y).text for y in range(m.size.height)]


async def test_map_shows_all_4096_gpus_in_200x60_without_scrolling() -> None:
    app = map_app()
    async with app.run_test(size=BIG) as pilot:
        m = await open_map(app, pilot)
        lines = visible_lines(m)
        assert m.max_scroll_y == 0 and m.scroll_y == 0
        cells = sum(1 for line in lines for ch in line if ch in CELL_GLYPHS)
        assert cells == MAP_HOSTS * MAP_GPUS == 4096
        text = "\n".join(lines)
        for i in range(MAP_HOSTS):
            assert text.count(map_host(i)) == 1, map_host(i)
        # Each host's eight cells follow its label; a down host's are crossed out.
        for i in (0, MAP_DOWN[0], MAP_STALE, MAP_HOSTS - 1):
            line = next(ln for ln in lines if map_host(i) in ln)
            at = line.index(map_host(i)) + len(map_host(i))
            drawn = line[at:].lstrip()[:MAP_GPUS]
            assert all(ch in CELL_GLYPHS for ch in drawn), (i, drawn)
            if i in MAP_DOWN:
                assert drawn == DOWN_GLYPH * MAP_GPUS
        legend = static_text(app, "#map-legend")
        assert f"{MAP_HOSTS} hosts" in legend and "4096 simulated GPUs" in legend
        assert "scrolls" not in legend


async def test_the_legend_follows_the_maps_own_size() -> None:
    """Whether the map all fits is said in the legend, and follows the map's size when only the
    map is laid out again (its side panel widened: the pane keeps its size). A legend drawn
    from the layout before said "(scrolls)" over a map that fitted (a fresh-clone run)."""
    app = map_app()
    async with app.run_test(size=BIG) as pilot:
        m = await open_map(app, pilot)
        assert m.max_scroll_y == 0 and "scrolls" not in static_text(app, "#map-legend")
        side = app.query_one("#map-side")
        side.styles.width = 150  # the map gets 50 columns: 512 hosts no longer fit
        await pilot.pause()
        await pilot.pause()
        assert m.grid.lines > m.size.height and "(scrolls)" in static_text(app, "#map-legend")
        side.styles.width = 38
        await pilot.pause()
        await pilot.pause()
        assert m.grid.lines <= m.size.height and "scrolls" not in static_text(app, "#map-legend")


async def test_cursor_and_selection_show_the_gpu_and_its_job() -> None:
    app = map_app()
    async with app.run_test(size=BIG) as pilot:
        m = await open_map(app, pilot)
        per_line = m.grid.per_line
        await pilot.press("right", "right", "right", "down")
        await pilot.pause()
        host_i, idx = per_line, 3  # the host under the first one, its GPU 3
        assert m.cursor == (host_i, idx)
        job, user = map_job(host_i, idx) or ("", "")
        assert job, "the fixture puts a job on this GPU"
        g = map_gpu(host_i, idx, 0)
        detail = static_text(app, "#map-detail")
        assert f"{map_host(host_i)} up · GPU 3 (simulated)" in detail
        assert f"util {g['utilization_pct']:.0f}%" in detail
        assert f"temp {g['temperature_c']:.0f}°C" in detail
        assert f"power {g['power_w']:.0f}/700W" in detail
        assert f"job {job} (llm-{int(job[-2:])}, running)" in detail
        assert f"user {user}" in detail
        # The cell under the cursor is drawn as the cursor, and only that one.
        glyph, style = m.cell_at(host_i, idx)
        assert style is not None and style.bgcolor is not None
        assert m.cell_at(host_i, idx + 1)[1].bgcolor != style.bgcolor  # type: ignore[union-attr]
        await pilot.press("enter")
        await pilot.pause()
        assert app.job_id == job and app.jobwatch.selected == job  # type: ignore[attr-defined]
        # A free GPU says so; a down host's GPU says its values are the last known.
        free = next(k for k in range(MAP_GPUS) if map_job(0, k) is None and not map_foreign(0, k))
        m.move_to(0, free)
        await pilot.pause()
        assert "free" in static_text(app, "#map-detail").splitlines()[-1]
        m.move_to(MAP_DOWN[0], 0)
        await pilot.pause()
        d = static_text(app, "#map-detail")
        assert f"{map_host(MAP_DOWN[0])} down" in d and "last known values" in d


def expected_users() -> tuple[dict[str, int], dict[str, Counter[str]], int]:
    """From the fixture's rules: GPUs per user, GPUs per user per job, free GPUs."""
    per_user: Counter[str] = Counter()
    per_job: dict[str, Counter[str]] = {}
    free = 0
    for i in range(MAP_HOSTS):
        for idx in range(MAP_GPUS):
            held = map_job(i, idx)
            foreign = map_foreign(i, idx)
            if held is not None:
                per_user[held[1]] += 1
                per_job.setdefault(held[1], Counter())[held[0]] += 1
            elif foreign is not None:
                per_user[foreign] += 1
            else:
                free += 1
    return dict(per_user), per_job, free


async def test_per_user_summary_counts() -> None:
    per_user, per_job, free = expected_users()
    app = map_app()
    async with app.run_test(size=BIG) as pilot:
        m = await open_map(app, pilot)
        s = m.summary
        assert {u.user: u.gpus for u in s.users} == per_user
        for u in s.users:
            assert dict(u.jobs) == dict(per_job.get(u.user, {})), u.user
        assert s.free == free and s.held == MAP_HOSTS * MAP_GPUS - free
        assert s.unreachable == (len(MAP_DOWN) + 1) * MAP_GPUS  # down and stale hosts
        assert [u.gpus for u in s.users] == sorted(per_user.values(), reverse=True)
        text = static_text(app, "#map-users")
        for user, n in per_user.items():
            assert f"{user} {n} GPUs" in text
        assert f"{per_user['frank']} outside any job" in " ".join(text.split())


async def test_colour_modes_change_what_is_drawn() -> None:
    app = map_app()
    async with app.run_test(size=BIG) as pilot:
        m = await open_map(app, pilot)

        def looks() -> dict[tuple[int, int], tuple[str, Any]]:
            return {(i, k): m.cell_at(i, k) for i in range(0, MAP_HOSTS, 7) for k in range(MAP_GPUS)}

        util = looks()
        assert "utilization" in static_text(app, "#map-legend")
        await pilot.press("m")
        await pilot.pause()
        memory = looks()
        assert "memory fill" in static_text(app, "#map-legend")
        await pilot.press("m")
        await pilot.pause()
        job = looks()
        assert "job" in static_text(app, "#map-legend")
        assert util != memory != job
        # Job colours: one per job, the same on every GPU of it, another for the next job.
        colours: dict[str, set[Any]] = {}
        for (i, k), (glyph, style) in job.items():
            held = map_job(i, k)
            if (i, k) == m.cursor or i in MAP_DOWN or i == MAP_STALE:
                continue
            if held is None:
                assert glyph == (FOREIGN_GLYPH if map_foreign(i, k) else FREE_GLYPH)
            else:
                assert glyph == JOB_GLYPH
                colours.setdefault(held[0], set()).add(style.color)
        assert all(len(c) == 1 for c in colours.values())
        firsts = [next(iter(c)) for c in colours.values()]
        assert len(set(firsts)) >= min(12, len(colours))
        await pilot.press("m")
        await pilot.pause()
        assert looks() == util  # back to utilization


async def test_map_redraws_only_the_hosts_that_changed() -> None:
    from tests.ui_fixtures import host_sample

    app = map_app()
    async with app.run_test(size=BIG) as pilot:
        m = await open_map(app, pilot)
        builds, renders = m.builds, m.renders
        app.refresh_views()
        await pilot.pause()
        assert (m.builds, m.renders) == (builds, renders)  # nothing changed: nothing done
        state = app.client.state
        gpus = [map_gpu(5, k, 37) for k in range(MAP_GPUS)]
        state.apply_sample(map_host(5), host_sample(5, 37, gpus), received_at=37.0)
        before = m.cell_at(5, 0)
        app.refresh_views()
        await pilot.pause()
        assert m.builds == builds + 1 and m.renders == renders + 1  # that host's block alone
        assert m.cell_at(5, 0) != before


async def test_small_cluster_map_at_80x24() -> None:
    app = recorded_app()
    async with app.run_test(size=(80, 24)) as pilot:
        m = await open_map(app, pilot)
        lines = [ln.rstrip() for ln in visible_lines(m) if ln.strip()]
        assert [ln.split()[0] for ln in lines] == ["h1", "h2", "h3"]  # a line each
        assert "down" in lines[2]
        assert m.grid.cell > 1  # room to spare: wider cells
        assert "8 simulated GPUs" in static_text(app, "#map-legend")
        await pilot.press("m", "m")  # job colours
        await pilot.pause()
        detail = static_text(app, "#map-detail")
        assert "h1 up · GPU 0 (simulated)" in detail and JOB in detail
        users = " ".join(static_text(app, "#map-users").split())
        assert "root 4 GPUs" in users and "bob 1 GPU" in users


def test_a_gap_is_drawn_in_a_runs_style_only_where_a_space_looks_plain_in_it() -> None:
    from rich.style import Style

    from tui.app.widgets.clustermap import _plain_space

    ground = Style(color="white", bgcolor="black")
    assert _plain_space(Style(color="green", bgcolor="black", bold=True), ground)  # colour, bold: no mark
    assert not _plain_space(Style(color="green", bgcolor="blue"), ground)  # another background shows
    assert not _plain_space(Style(color="green", bgcolor="black", reverse=True), ground)
    assert not _plain_space(Style(bgcolor="black", underline=True), ground)


def test_holders_kept_from_the_last_second_are_those_made_afresh() -> None:
    """A second of new numbers keeps every host's holders; a host whose GPU changed hands gets
    the holder made afresh, the others keep theirs (the same objects)."""
    from tests.ui_fixtures import host_sample, map_gpu, map_host, map_state
    from tui.model.gpumap import holders

    state = map_state(16)
    first = state.snapshot()
    held = holders(first, {})
    for i in range(16):  # new numbers, the same processes
        gpus = [map_gpu(i, idx, 1) for idx in range(8)]
        state.apply_sample(map_host(i), host_sample(i, 1, gpus), received_at=1.0)
    gpus = [map_gpu(3, idx, 1) for idx in range(8)]
    gpus[2]["processes"] = [{"pid": 1, "user": "zed", "job_id": "other-job", "rank": 0}]
    state.apply_sample(map_host(3), host_sample(3, 1, gpus), received_at=1.0)
    second = state.snapshot()
    kept = holders(second, {}, (first, held))
    assert kept == holders(second, {})
    assert kept[3][2].job_id == "other-job" and kept[3][2] != held[3][2]
    assert all(kept[i] is held[i] for i in range(16) if i != 3 and second[i].status == "up")
