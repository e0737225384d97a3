"""The app's non-visual parts: job folding, checkpoint ownership, specs from the form, keymaps,
chart axes and series, the sweeps view's rows and text, and the diff table's bookkeeping."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from rich.style import Style
from textual.app import App, ComposeResult

from tests.ui_fixtures import (
    JOB,
    NOW,
    OLD_SWEEP,
    SWEEP,
    RecordedJobs,
    cluster_state,
    ddp_metrics,
    job_row,
    recorded_sweeps,
)
from tui.app.keys import load_keymap
from tui.app.widgets.chart import fmt_tick, render_chart, render_series, ticks
from tui.app.widgets.difftable import Col, DiffTable
from tui.app.widgets.format import Palette
from tui.app.widgets.sweeps import (
    best_text,
    curve_trials,
    fetch_sweeps,
    objective_text,
    stop_sweep_text,
    sweep_rows,
    trial_duration,
    trial_line,
    trial_rows,
)
from tui.app.widgets.tables import GpuFilter, GpusTable, Widths, gpu_rows, host_rows, jobs_running
from tui.control.jobwatch import (
    LogBuffer,
    MetricsFold,
    Owner,
    checkpoint_view,
    expected_owners,
    owner_summary,
)
from tui.model.jobspec import JobSpecError
from tui.model.specform import form_values, merge_form, spec_from_form
from tui.model.termsafe import log_lines, terminal_safe
from tui.model.tomlwrite import dumps


def test_loss_by_step_prefers_the_lowest_rank_and_rate_uses_its_times() -> None:
    fold = MetricsFold()
    fold.apply(
        [
            {"rank": 1, "step": 0, "loss": 2.0, "time": 10.0},
            {"rank": 0, "step": 0, "loss": 1.0, "time": 10.0},
        ],
        received_at=0.0,
    )
    fold.apply(
        [
            {"rank": 0, "step": s, "loss": 1.0 / (s + 1), "time": 10.0 + 0.5 * s}
            for s in range(1, 21)
        ],
        0.0,
    )
    assert fold.points[0] == (0, 1.0)
    assert fold.last == (20, pytest.approx(1 / 21))
    assert fold.step_rate() == pytest.approx(2.0)
    v = fold.version
    fold.apply([{"rank": 3, "step": 5, "loss": 9.0}], 0.0)  # a higher rank never overrides
    assert dict(fold.points)[5] == pytest.approx(1 / 6) and fold.version == v


def test_checkpoint_events_fold_into_owners_last_good_save_and_moves() -> None:
    fold = MetricsFold()
    fold.apply(ddp_metrics(), NOW)
    view = checkpoint_view({"checkpoint": {"owner": "host:h3/gpu:0", "dir": "/ck"}}, fold, [], [])
    assert [s.step for s in view.saves] == [50, 100, 150, 200, 240]
    assert [s.status for s in view.saves] == ["done", "done", "failed", "done", "writing"]
    assert view.failed == 1
    assert view.last_done is not None and view.last_done.step == 200
    assert view.last_done.speed_bps == pytest.approx(4_718_592 / 0.22)
    assert view.owners == (Owner(0, "h1", 0),)
    assert (
        len(view.moves) == 1
        and view.moves[0].from_.host == "h3"
        and "not in this run" in (view.moves[0].reason or "")
    )
    assert owner_summary(view) == "h1/gpu0 r0 (moved)"


@pytest.mark.parametrize(
    "policy, expect",
    [
        ("rank0", ["h1 0 r0"]),
        ("per-node", ["h1 0 r0", "h2 0 r2"]),
        ("all", ["h1 0 r0", "h1 1 r1", "h2 0 r2", "h2 1 r3"]),
        ("host:h2/gpu:1", ["h2 1 r3"]),
        ("host:h9/gpu:0", ["h1 0 r0"]),
    ],
)
def test_expected_owners_follow_the_policy(policy: str, expect: list[str]) -> None:
    placement = [
        {"host": "h1", "slots": 2, "gpus": [0, 1]},
        {"host": "h2", "slots": 2, "gpus": [0, 1]},
    ]
    owners, move = expected_owners(policy, [], placement)
    assert [f"{o.host} {o.gpu} r{o.rank}" for o in owners] == expect
    assert (move is not None) == (policy == "host:h9/gpu:0")


def test_log_buffer_keeps_absolute_indices_when_old_lines_drop() -> None:
    buf = LogBuffer(limit=10)
    buf.extend(("h1", 0, f"line {i}") for i in range(12))
    assert len(buf) == 12 and buf.base == 7
    assert buf.get(6) is None and buf.get(7) == ("h1", 0, "line 7")
    start, lines = buf.since(3)
    assert start == 7 and lines[0][2] == "line 7"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("step 3 loss=0.25\tok é", "step 3 loss=0.25\tok é"),  # nothing to do
        ("\x1b[31mERROR\x1b[0m disk full", "ERROR disk full"),  # colours dropped
        ("a\x1b[2J\x1b[Hb", "ab"),  # clear screen, cursor home
        ("x\x1b]52;c;cm0gLXJmIH4=\x1b\\y", "xy"),  # OSC 52: a clipboard write
        ("x\x1b]0;a title\x07y", "xy"),  # OSC 0 ended by BEL: the window title
        ("  3%|#\r 50%|#####\r100%|##########", "100%|##########"),  # a redrawn progress bar
        ("reset\x1bc!", "reset\ufffdc!"),  # ESC c (full reset): its ESC is defused
        ("bel\x07 nul\x00 del\x7f csi\x9b2J", "bel nul\ufffd del\ufffd csi\ufffd2J"),
    ],
)
def test_log_lines_are_made_safe_to_draw(raw: str, shown: str) -> None:
    assert terminal_safe(raw) == shown
    buf = LogBuffer()
    buf.extend([("h1", 0, raw)])
    assert buf.get(0) == ("h1", 0, shown)  # what every view and search of the buffer sees


def test_log_chunks_split_at_newlines_only() -> None:
    bar = "  0%|\r 50%|#####\r100%|##########"
    assert log_lines(f"epoch 1\n{bar}\nwindows\r\nno end") == ["epoch 1", bar, "windows", "no end"]
    assert log_lines("") == [] and log_lines("\n") == [""] and log_lines("a\n\nb\n") == ["a", "", "b"]
    assert terminal_safe(log_lines(bar + "\n")[0]) == "100%|##########"  # one line, its last state


def test_recorded_jobs_give_rows_with_rate_eta_and_owner() -> None:
    rows = RecordedJobs().snapshot().rows
    row = next(r for r in rows if r.job_id == JOB)
    assert (row.step, row.ranks_running, row.ranks_total, row.total_steps) == (240, 4, 4, 300)
    assert row.step_rate == pytest.approx(1 / 0.45)
    assert row.eta_s == pytest.approx(59 * 0.45)
    assert row.checkpoint_owner == "h1/gpu0 sim r0 (moved)"  # the placement's GPUs are simulated
    failed = next(r for r in rows if r.state == "failed")
    assert failed.cause and failed.cause["signal"] == 9 and failed.ranks_running == 0


def test_spec_form_round_trip_and_errors_name_the_field(tmp_path: Path) -> None:
    base = {
        "name": "ddp",
        "command": ["{python}", "train.py", "--steps", "30"],
        "nodes": 2,
        "env": {"OMP_NUM_THREADS": "1"},
        "checkpoint": {"owner": "rank0"},
    }
    values = form_values(base)
    assert values["command"] == "{python} train.py --steps 30"
    spec = spec_from_form(
        base, {**values, "total_steps": "30", "hosts": "h1, h2"}, tmp_path / "job.toml"
    )
    assert (
        spec.total_steps == 30
        and spec.hosts == ("h1", "h2")
        and dict(spec.env) == {"OMP_NUM_THREADS": "1"}
    )
    assert spec.workdir == str(tmp_path)
    with pytest.raises(JobSpecError) as e:
        spec_from_form(base, {**values, "nodes": "two"}, None)
    assert e.value.field == "nodes"
    with pytest.raises(JobSpecError) as e:
        spec_from_form(base, {**values, "checkpoint.owner": "gpu0"}, None)
    assert e.value.field == "checkpoint.owner"
    with pytest.raises(JobSpecError) as e:
        merge_form(base, {"command": "python 'unbalanced"})
    assert e.value.field == "command"
    assert "[env]" in dumps(merge_form(base, values))


def test_keymap_file_flat_grouped_and_problems(tmp_path: Path) -> None:
    path = tmp_path / "keys.toml"
    path.write_text('"job.launch" = "L"\n[logs]\nrank = "R, ctrl+r"\nfollow = 3\n[nope]\nx = "y"\n')
    keymap, problems = load_keymap(path, known={"job.launch", "logs.rank", "logs.follow"})
    assert keymap == {"job.launch": "L", "logs.rank": "R,ctrl+r"}
    assert any("logs.follow" in p for p in problems) and any("nope.x" in p for p in problems)
    assert load_keymap(tmp_path / "missing.toml") == ({}, [])
    path.write_text("= broken")
    assert load_keymap(path)[1][0].startswith(str(path))


def test_chart_has_axes_ticks_and_a_curve() -> None:
    lo, hi, values = ticks(0.37, 3.3, 4)
    assert lo <= 0.37 and hi >= 3.3 and len(values) >= 3
    points = [(s, 3.0 / (1 + s / 20)) for s in range(200)]
    strips = render_chart(points, 60, 12, x_max=299)
    text = [s.text for s in strips]
    assert len(text) == 12 and all(len(t) == 60 for t in text)
    assert any("┤" in t for t in text[:-2])  # y ticks
    assert "└" in text[-2] and "┬" in text[-2]  # x axis with ticks
    assert "0" in text[-1] and "300" in text[-1]  # x labels up to the total steps
    assert any(any(0x2800 < ord(c) <= 0x28FF for c in t) for t in text)  # the curve
    assert "waiting" in "".join(s.text for s in render_chart([], 40, 6, empty="waiting"))


def test_the_frame_timer_keeps_a_minute_of_stretches() -> None:
    from tui.app.frametimer import FrameTimer

    now = [100.0]
    timer = FrameTimer(clock=lambda: now[0])
    assert timer.longest_ms() == 0.0 and timer.slow() == 0
    timer.note(50.0)  # a stall, 100 s in
    now[0] = 105.0
    timer.note(5.0, "refresh")
    assert timer.longest_ms(10.0) == 50.0 and timer.slow() == 1 and timer.frames == 1
    now[0] = 112.0
    timer.note(7.0)
    assert timer.longest_ms(10.0) == 7.0 and timer.longest_ms() == 50.0
    now[0] = 161.0
    timer.note(1.0)  # the stall is over a minute old: gone
    assert timer.longest_ms() == 7.0 and timer.slow() == 0
    assert timer.text() == "frames ≤1 ms 10s · ≤7 ms 60s (frame) · 0 slow"
    timer.note(9.0, "gc")
    assert timer.longest_kind() == "gc"


def test_collections_wait_in_their_own_queue_until_the_ui_thread_reads() -> None:
    """A collector's pass is timed from whatever thread it runs on, the UI thread's own
    included while it reads the stretches: it waits in a queue of its own, taken in by the
    next read or note on the UI thread."""
    from tui.app.frametimer import FrameTimer

    now = [10.0]
    timer = FrameTimer(clock=lambda: now[0])
    timer.note(2.0)
    timer._on_gc("start", {})
    timer._on_gc("stop", {})
    assert len(timer._stretches) == 1 and len(timer._gc_passes) == 1  # not yet taken in
    assert [kind for _, _, kind in timer._recent(60.0)] == ["frame", "gc"]
    assert not timer._gc_passes


class _TableApp(App[None]):
    def compose(self) -> ComposeResult:
        t = DiffTable(id="t")
        yield t

    def on_mount(self) -> None:
        self.query_one(DiffTable).set_columns(
            [Col("k", "Key"), Col("v", "Value", 8), Col("w", "W", 8)]
        )


async def test_diff_table_changes_only_what_differs() -> None:
    app = _TableApp()
    async with app.run_test() as pilot:
        t = app.query_one(DiffTable)
        rows: list[tuple[str, tuple[Any, ...]]] = [(f"r{i}", (f"r{i}", i, "x")) for i in range(5)]
        s = t.apply(rows)
        assert (s.added, s.removed, s.cells, s.reordered) == (5, 0, 0, False)
        t.move_cursor(row=3)
        assert t.cursor_key == "r3"
        assert not t.apply(rows).changed  # the same rows: nothing at all
        rows[1] = ("r1", ("r1", 10, "x"))
        s = t.apply(rows)
        assert (s.cells, s.reordered) == (1, False)  # one cell of one row
        assert t.cell_text("r1", "v") == "10"
        s = t.apply([rows[4], rows[3], rows[0]])  # two gone, a new order
        assert (s.removed, s.reordered) == (2, True)
        assert [t.coordinate_to_cell_key((i, 0)).row_key.value for i in range(3)] == [
            "r4",
            "r3",
            "r0",
        ]
        assert t.cursor_key == "r3"  # the cursor stayed on its row
        await pilot.pause()


async def test_diff_table_diffs_the_rows_in_view_once_the_cursor_followed_its_row() -> None:
    """A new order that takes the cursor's row far down scrolls the table there (DataTable
    keeps the cursor in view): the rows made and diffed are those the frame shows then, not
    those in view before the move."""
    app = _TableApp()
    async with app.run_test() as pilot:
        t = app.query_one(DiffTable)
        made: list[str] = []

        def make_raw(src: tuple[str, int]) -> tuple[Any, ...]:
            made.append(src[0])
            return (src[0], src[1], "x")

        keys = [f"r{i}" for i in range(300)]
        t.apply_sources([(k, (k, 0)) for k in keys], make_raw, margin=0)
        await pilot.pause()
        assert t.cursor_key == "r0" and t.scroll_y == 0
        made.clear()
        order = keys[1:200] + ["r0"] + keys[200:]  # the cursor's row goes to row 199
        t.apply_sources([(k, (k, 1)) for k in order], make_raw, margin=0)
        assert t.cursor_key == "r0" and t.cursor_row == 199
        top = int(t.scroll_y)
        assert top > 150  # scrolled to the cursor
        in_view = order[top:top + t.size.height - 1]
        assert set(in_view) <= set(made)  # made now, before the frame draws them
        assert len(made) <= t.size.height + 1  # and nothing else
        await pilot.pause()


async def test_diff_table_keeps_drawn_lines_only_for_rows_near_the_view() -> None:
    """Scrolled through 600 rows, the table keeps its drawn lines and rows for about three
    screens around the view, not one for every row ever drawn (long-lived objects the
    collector's full passes would walk); rows scrolled back into view are drawn as before."""
    app = _TableApp()
    async with app.run_test(size=(60, 20)) as pilot:
        t = app.query_one(DiffTable)
        t.apply([(f"r{i}", (f"r{i}", i, "x")) for i in range(600)])
        await pilot.pause()
        height = t.size.height
        for row in range(0, 600, height // 2):
            t.move_cursor(row=row)
            await pilot.pause()
        assert t.scroll_y > 500
        assert 0 < len(t._strips) <= 3 * height + 4
        assert 0 < len(t._rows_rendered) <= 3 * height + 4
        assert min(t._strips) > 400 and "r0" not in t._rows_rendered  # the first screens forgotten
        t.move_cursor(row=0)
        await pilot.pause()
        assert t.scroll_y == 0 and t.cell_text("r3", "v") == "3"
        assert "r3" in app.export_screenshot()  # drawn again when back in view


async def test_diff_table_adds_many_new_rows_those_in_view_first_then_the_rest_frame_by_frame() -> None:
    """A filter letting many rows back in: the rows in view (and more, up to ``ADD_AT_ONCE``)
    are there, in place, when ``apply`` returns; the others come over the next frames, in the
    order asked for. An apply in the meantime takes over: what it asks for is what stays."""
    from tui.app.widgets.difftable import ADD_AT_ONCE

    def keys(t: DiffTable) -> list[str]:
        return [t.coordinate_to_cell_key((i, 0)).row_key.value for i in range(t.row_count)]

    app = _TableApp()
    async with app.run_test() as pilot:
        t = app.query_one(DiffTable)
        n = 3 * ADD_AT_ONCE + 17
        rows: list[tuple[str, tuple[Any, ...]]] = [(f"r{i}", (f"r{i}", i, "x")) for i in range(n)]
        s = t.apply(rows[:5])
        t.move_cursor(row=2)
        s = t.apply(rows)
        assert s.added == ADD_AT_ONCE and t.row_count == ADD_AT_ONCE + 5
        assert keys(t) == [k for k, _ in rows[: ADD_AT_ONCE + 5]]  # the first rows: all, in place
        assert t.cursor_key == "r2"
        for _ in range(20):
            await pilot.pause()
            if t.row_count == n:
                break
        assert keys(t) == [k for k, _ in rows] and t.cell_text(f"r{n - 1}", "v") == str(n - 1)
        t.apply(rows[:1])
        t.apply(rows[::-1])  # many new rows again, in another order: a part now, the rest later
        assert 0 < t.row_count < n
        t.apply(rows[:3])  # taken over before the rest came
        for _ in range(5):
            await pilot.pause()
        assert keys(t) == ["r0", "r1", "r2"]


async def test_diff_table_header_is_drawn_again_only_when_it_changes() -> None:
    """The header line kept across cell updates is the line DataTable draws afresh, wherever
    the cursor goes; new column labels draw it again."""
    from textual.widgets import DataTable

    app = _TableApp()
    async with app.run_test() as pilot:
        t = app.query_one(DiffTable)
        t.apply([(f"r{i}", (f"r{i}", i, "x")) for i in range(5)])
        await pilot.pause()

        def header() -> tuple[Any, Any]:
            args = (t._header_row_key, 0, t.rich_style, t.cursor_coordinate, t.hover_coordinate)
            t._row_render_cache.clear()
            return t._render_line_in_row(*args), DataTable._render_line_in_row(t, *args)

        kept, fresh = header()
        assert kept == fresh
        for tick in range(3):  # cell updates and cursor moves: the same line, not drawn again
            t.apply([(f"r{i}", (f"r{i}", i + tick, "y")) for i in range(5)])
            t.move_cursor(row=tick + 1)
            again, fresh = header()
            assert again is kept and again == fresh
        t.set_columns([Col("k", "Key"), Col("v", "Other", 8), Col("w", "W", 8)])
        t.apply([(f"r{i}", (f"r{i}", i, "x")) for i in range(5)])
        await pilot.pause()
        changed, fresh = header()
        assert changed == fresh and changed != kept
        assert "Other" in "".join(seg.text for seg in changed[1][1])


async def test_diff_table_header_follows_widths_its_columns_gain_when_idle() -> None:
    """DataTable widens a column in its idle pass without counting an update; the header drawn
    before that pass is not the one kept after it (a loaded machine drew the sweeps list's
    header narrow for good, its rows wide)."""
    from textual.widgets import DataTable

    app = _TableApp()
    async with app.run_test() as pilot:
        t = app.query_one(DiffTable)
        t.apply([(f"r{i}", (f"r{i}", i, "x")) for i in range(5)])
        await pilot.pause()
        args = (t._header_row_key, 0, t.rich_style, t.cursor_coordinate, t.hover_coordinate)
        t._header_drawn = None  # drawn now, by DataTable, into its caches too
        before = t._render_line_in_row(*args)
        t.ordered_columns[0].content_width += 12  # as DataTable's _update_dimensions does
        after = t._render_line_in_row(*args)
        t._row_render_cache.clear()
        t._cell_render_cache.clear()
        fresh = DataTable._render_line_in_row(t, *args)
        assert after == fresh and after != before
        assert t._render_line_in_row(*args) is after  # kept again from here on


async def test_diff_table_rows_follow_widths_their_columns_gain_when_idle() -> None:
    """The same for the rows: a frame drawn between new rows and the idle pass that measures
    them draws the auto-width column at its label's width; the next frame draws it at the width
    measured (a loaded machine drew the sweeps' trials with their parameters cut at the width
    of "Parameters", for good, in fresh-clone run 2)."""
    app = _TableApp()
    async with app.run_test() as pilot:
        t = app.query_one(DiffTable)
        t.apply([(f"r{i}", (f"r{i}", i, "x")) for i in range(5)])
        await pilot.pause()

        def row0() -> str:
            t._frame_values = t._read_frame_values()  # as render_lines reads it, once a frame
            try:
                strip = t._render_line_in_row(t._row_key("r0"), 0, t.rich_style, t.cursor_coordinate,
                                              t.hover_coordinate)
            finally:
                t._frame_values = None
            return "".join(seg.text for seg in strip[1][0])

        before = row0()
        t.ordered_columns[0].content_width += 12  # as the idle pass does for a wider cell
        after = row0()
        assert len(after.rstrip()) == len(before.rstrip()) + 12, (before, after)  # the cells after it moved


class _GpusApp(App[None]):
    """A GPU table 12 lines high: rows 10.. are out of view."""

    CSS = "GpusTable { height: 12; }"

    def compose(self) -> ComposeResult:
        yield GpusTable()


def _gpu_table(app: _GpusApp) -> tuple[GpusTable, Widths]:
    """The app's GPU table with the columns for a 140-wide terminal."""
    table = app.query_one(GpusTable)
    w = Widths.for_width(140)
    table.set_columns(table.columns_for(w))
    return table, w


def _state_with(gpus_per_host: list[int], tick: int, state: Any = None) -> Any:
    from tests.ui_fixtures import gpu_sample, host_sample
    from tui.model.state import ClusterState

    state = state or ClusterState([(f"h{i}", f"10.0.0.{i}") for i in (1, 2, 3)])
    for i, n in enumerate(gpus_per_host, start=1):
        gpus = [gpu_sample(i, idx, tick, JOB if idx == 0 else None, idx) for idx in range(n)]
        state.apply_sample(f"h{i}", host_sample(i, tick, gpus), received_at=float(tick))
    return state


async def test_gpu_table_follows_samples_in_view_out_of_view_and_new_gpus() -> None:
    app = _GpusApp()
    async with app.run_test(size=(140, 30)) as pilot:
        table, w = _gpu_table(app)
        state = _state_with([8, 8, 8], tick=0)

        def show(flt: GpuFilter | None = None, sort: str = "host") -> None:
            table.apply_snapshot(state.snapshot(), w, flt or GpuFilter(), sort)

        def expected(key: str) -> tuple[Any, ...]:
            return dict(gpu_rows(state.snapshot(), w))[key]

        show()
        assert table.row_count == 24
        in_view, out_of_view = "h1/SIM-00000001-1", "h3/SIM-00000003-7"
        state.set_agent("h3", {"agent_version": "x"})  # not a GPU change
        for tick in (1, 2, 3):  # the same GPUs: the rows stay, their values follow
            _state_with([8, 8, 8], tick=tick, state=state)
            show()
            assert table.raw(in_view) == expected(in_view)
            assert table.raw(out_of_view) == expected(out_of_view)  # brought up to date on demand
        # h3 goes stale: every one of its rows shows it, including those out of view.
        from tui.model.state import HostStatus

        state.set_status("h3", HostStatus.STALE, "no telemetry for 3.0s")
        show()
        assert table.raw(out_of_view) == expected(out_of_view)
        assert table.raw(out_of_view)[-1][-1] is True  # the sparkline's stale flag
        # h2 gains a GPU (a new layout): the row appears in place.
        _state_with([8, 9, 8], tick=4, state=state)
        show()
        assert table.row_count == 25
        order = [table.coordinate_to_cell_key((i, 0)).row_key.value for i in range(25)]
        assert order[16] == "h2/SIM-00000002-8"
        assert table.raw("h2/SIM-00000002-8") == expected("h2/SIM-00000002-8")
        # A filter or another order still works, and going back to the default does too.
        show(GpuFilter("busy"))
        assert table.row_count == len(gpu_rows(state.snapshot(), w, GpuFilter("busy")))
        show(sort="util")
        utils = [table.raw(k)[2][0] for k in table._order]
        assert utils == sorted(utils, reverse=True)
        show()
        assert table._order == [k for k, _ in gpu_rows(state.snapshot(), w)]
        await pilot.pause()


async def test_gpu_table_reads_live_gpus_from_a_hosts_only_snapshot() -> None:
    app = _GpusApp()
    async with app.run_test(size=(140, 30)) as pilot:
        table, w = _gpu_table(app)
        state = _state_with([8, 8, 8], tick=0)
        full = state.snapshot()
        hosts = state.snapshot(gpus=False)
        assert all(h.gpus is None for h in hosts) and all(h.gpus is not None for h in full)
        assert [h.gpu_count for h in hosts] == [len(h.gpus or ()) for h in full] == [8, 8, 8]
        assert [h.gpus_busy for h in hosts] == [
            sum(1 for g in h.gpus or () if g.processes) for h in full
        ]
        assert hosts[0].gpu_model == (full[0].gpus or ())[0].name

        def show() -> None:
            table.apply_state(state, state.snapshot(gpus=False), w, GpuFilter(), "host")

        show()
        for tick in (1, 2):
            _state_with([8, 8, 8], tick=tick, state=state)
            show()
            now = dict(gpu_rows(state.snapshot(), w))
            for key in ("h1/SIM-00000001-1", "h3/SIM-00000003-7"):
                assert table.raw(key) == now[key]
        _state_with([8, 8, 7], tick=3, state=state)  # h3 lost a GPU: its row goes
        show()
        assert table.row_count == 23 and "h3/SIM-00000003-7" not in table._order
        await pilot.pause()


@pytest.mark.parametrize("sort", ["host", "util", "memory", "temp", "job"])
@pytest.mark.parametrize("flt", [GpuFilter(), GpuFilter("busy"), GpuFilter("idle", "h1"), GpuFilter(text="job:"),
                                 GpuFilter(text="job-1"), GpuFilter("busy", "h2 job-2"), GpuFilter(text="idle h1")])
@pytest.mark.parametrize("hosts_only", [False, True])
def test_the_kept_gpu_order_is_the_order_made_afresh(sort: str, flt: GpuFilter, hosts_only: bool) -> None:
    """Tick after tick, some hosts sending new samples (a few, or every one), a host going
    stale: the order kept from tick to tick shows the rows ``gpu_entries`` makes from scratch,
    with the same sources; also when it is given the hosts-only snapshot and reads the GPUs
    from the state (as the app does, keeping no second of samples)."""
    import random

    from tui.app.widgets.tables import GpuOrder, gpu_entries
    from tui.model.state import ClusterState, HostStatus

    rng = random.Random(7)
    hosts = [f"h{i}" for i in range(12)]
    state = ClusterState([(h, f"10.0.0.{i}") for i, h in enumerate(hosts)])

    def send(i: int, tick: int) -> None:
        gpus = [{"index": g, "uuid": f"U{i}-{g}", "name": "H100", "utilization_pct": rng.choice([0, 5, 50, 99]),
                 "memory_used_mb": rng.choice([0, 100, 4000]), "memory_total_mb": 8000,
                 "temperature_c": rng.choice([30.0, 55.5]),
                 "processes": [{"pid": 1, "user": "u", "job_id": f"job-{rng.randrange(3)}", "rank": g}]
                 if rng.random() < 0.5 else []}
                for g in range(4)]
        state.apply_sample(hosts[i], {"gpus": gpus, "host": {}}, received_at=float(tick))

    order = GpuOrder()
    for tick in range(12):
        which = range(12) if tick % 4 == 0 else rng.sample(range(12), 2)
        for i in which:
            send(i, tick)
        if tick == 6:
            state.set_status("h3", HostStatus.STALE, "quiet")
        only = state.snapshot(gpus=False)
        snap = state.snapshot()
        fresh = gpu_entries(snap, flt, sort)
        if hosts_only:
            got = order.update(snap, flt, sort, only, lambda hi, gi: state.gpu(hosts[hi], gi))
        else:
            got = order.update(snap, flt, sort)
        assert got == [k for k, _ in fresh]
        for key, src in fresh:
            assert order.source(key) == src


def test_gpu_rows_filter_and_sort() -> None:
    snap = cluster_state().snapshot()
    w = Widths.for_width(120)
    assert len(gpu_rows(snap, w)) == 8  # h3 is down and never reported GPUs
    busy = gpu_rows(snap, w, GpuFilter("busy"))
    assert len(busy) == 5 and all(
        not k.endswith(("-2", "-3")) or k == "h2/SIM-00000002-3" for k, _ in busy
    )
    assert len(gpu_rows(snap, w, GpuFilter("idle"))) == 3
    assert {k.split("/")[0] for k, _ in gpu_rows(snap, w, GpuFilter(text="host:h2"))} == {"h2"}
    assert len(gpu_rows(snap, w, GpuFilter(text=f"job:{JOB[:6]}"))) == 4
    by_util = gpu_rows(snap, w, sort="util")
    utils = [raw[2][0] for _, raw in by_util]
    assert utils == sorted(utils, reverse=True)
    hosts = host_rows(snap, w)
    assert [r[1][1] for r in hosts] == ["up", "up", "down"]
    assert "press t to trust" in hosts[2][1][-1][0]


@pytest.mark.parametrize(
    "cell",
    [
        "",
        "0%",
        "h1",
        "88°C",
        "512W/700W",
        " ▁▂▃▄▅▆▇█",
        "exactly-ten",
        "much too long for this cell",
        "tab\there",
    ],
)
@pytest.mark.parametrize("style", [None, "bold red", "dim"])
@pytest.mark.parametrize("pad", [0, 1])
def test_plain_cell_segments_match_the_general_rendering(
    cell: str, style: str | None, pad: int
) -> None:
    from rich.console import Console
    from rich.style import Style
    from rich.text import Text

    from tui.app.widgets.difftable import _plain_segments, cell_segments

    console = Console(width=80, color_system="truecolor")
    pre, post = Style(bgcolor="grey11"), Style(italic=True)
    inner = 11
    text = Text(cell, style=style or "")
    fast = _plain_segments(text, console, pad, inner, pre, post)
    slow = cell_segments(text, console, pad, inner, pre, post)
    if fast is None:  # only cells the fast path cannot draw exactly are left to rich
        assert len(cell) > inner or "\t" in cell
        return

    def chars(segments: list[Any]) -> list[tuple[str, Any]]:  # what the terminal shows
        return [(ch, s.style) for s in segments for ch in s.text]

    assert chars(fast) == chars(slow)
    assert len(chars(fast)) == inner + 2 * pad


def _spanned_cells() -> list[Any]:
    """Cells with spans as the tables make them: bars, power, simulated marks, and odd ones."""
    from rich.style import Style
    from rich.text import Text

    from tui.app.widgets.format import bar_cell, marked_simulated, power_cell

    palette = Palette(7, {"ok": Style(color="green"), "warn": Style(color="yellow", bold=True),
                          "crit": Style(color="red"), "muted": Style(dim=True),
                          "bar-empty": Style(color="grey30")})
    overlapping = Text("abcdef", style="italic")
    overlapping.stylize("red", 0, 4)
    overlapping.stylize("bold", 2, 6)
    gap = Text("abcdef", style="underline")
    gap.stylize("blue", 2, 3)
    return [
        bar_cell(42.0, 5, "ok", " 42%", palette),
        bar_cell(100.0, 10, "warn", " 1.2G/80G", palette),
        bar_cell(0.0, 5, "muted", "   0%", palette),
        power_cell(650, 700.0, palette),
        power_cell(100, 700.0, palette),
        marked_simulated("3", True, palette),
        overlapping,
        gap,
        Text("ab\tc", spans=[]),
    ]


@pytest.mark.parametrize("pad", [0, 1])
@pytest.mark.parametrize("inner", [4, 11, 24])
def test_spanned_cell_segments_match_the_general_rendering(pad: int, inner: int) -> None:
    from rich.console import Console
    from rich.style import Style

    from tui.app.widgets.difftable import _plain_segments, cell_segments

    console = Console(width=80, color_system="truecolor")
    pre, post = Style(bgcolor="grey11"), Style(italic=True)

    def chars(segments: list[Any]) -> list[tuple[str, Any]]:  # what the terminal shows
        return [(ch, s.style) for s in segments for ch in s.text]

    drawn = 0
    for text in _spanned_cells():
        fast = _plain_segments(text, console, pad, inner, pre, post)
        slow = cell_segments(text, console, pad, inner, pre, post)
        if fast is None:  # left to rich: too wide, a tab, or spans over each other
            assert text.cell_len > inner or "\t" in text.plain or text.plain == "abcdef" and text.style == "italic"
            continue
        drawn += 1
        assert chars(fast) == chars(slow), text
        assert len(chars(fast)) == inner + 2 * pad
    assert drawn >= (6 if inner >= 11 else 0)


def test_the_pieces_of_a_long_log_line_are_one_line_in_the_log_view() -> None:
    from tui.control.jobwatch import LINE_SHOWN
    from tui.control.reader import LineJoiner

    joiner = LineJoiner(keep=LINE_SHOWN)  # as JobWatch's reader joins them
    key = ("h1", 0)
    chunks = [("first\n", False), ("a" * 3000, True), ("b" * 3000, True), ("c" * 10 + "\nnext\n", False)]
    lines = [line for text, partial in chunks for line in joiner.feed(key, text, partial)]
    assert lines == ["first", ("a" * 3000 + "b" * 3000)[:LINE_SHOWN] + " [... 1914 more characters]", "next"]
    assert joiner.pending == {}
    # A short line in two pieces is joined whole, with nothing cut.
    pieces = [("loss=0.", True), ("5 done\n", False)]
    assert [ln for text, partial in pieces for ln in joiner.feed(key, text, partial)] == ["loss=0.5 done"]


def test_a_gpu_claimed_on_its_host_shows_the_claiming_job_until_its_ranks_run() -> None:
    from tui.app.widgets.tables import gpu_job_label
    from tui.model.hostviews import GpuView

    def gpu(sample: dict[str, Any]) -> GpuView:
        return GpuView.from_sample("h1", 0, "GPU-0", "H100", sample, False, ())

    claimed = {"processes": [], "claim": {"job_id": "ddp-1", "user": "ana", "since": 1.0}}
    assert gpu(claimed).busy and gpu_job_label(gpu(claimed)) == ("ddp-1 claimed (ana)", "job")
    running = {**claimed, "processes": [{"job_id": "ddp-1", "rank": 0, "pid": 5}]}
    assert gpu_job_label(gpu(running)) == ("ddp-1 r0", "job")
    idle = gpu({"processes": [], "claim": None})
    assert not idle.busy and gpu_job_label(idle) == ("-", "idle")


def test_chart_ticks_of_a_two_and_a_half_step_and_of_whole_numbers() -> None:
    lo, hi, values = ticks(0.0, 0.41, 2)
    assert values == [0.0, 0.25, 0.5]
    assert [fmt_tick(v, 0.25) for v in values] == ["0", "0.25", "0.50"]
    assert [fmt_tick(v, 2.5) for v in (2.5, 5.0, 7.5)] == ["2.5", "5.0", "7.5"]
    assert ticks(1, 4, 12, min_step=1.0)[2] == [1.0, 2.0, 3.0, 4.0]  # trial numbers: no 1.5
    assert ticks(1, 12, 5, min_step=1.0)[2] == [0.0, 5.0, 10.0, 15.0]  # nor 2.5


def _cells(strips: list[Any]) -> list[list[tuple[str, Any]]]:
    """Each strip as (character, style) per cell."""
    return [[(c, seg.style) for seg in strip for c in seg.text] for strip in strips]


def test_chart_draws_several_series_the_first_on_top_and_steps() -> None:
    first, second = Style(color="red"), Style(color="blue")
    a = [(s, 1.0) for s in range(50)]
    b = [(s, 1.0 + s / 49) for s in range(50)]

    def dots(strips: list[Any]) -> dict[tuple[int, int], Any]:
        return {(r, i): st for r, row in enumerate(_cells(strips)) for i, (c, st) in enumerate(row)
                if 0x2800 < ord(c) <= 0x28FF}

    ab = dots(render_series([a, b], 60, 12, lines=[first, second]))
    ba = dots(render_series([b, a], 60, 12, lines=[first, second]))
    assert set(ab.values()) == {first, second} and set(ab) == set(ba)
    shared = [k for k in ab if ab[k] == ba[k]]  # where both pass: the first series' style
    assert shared and all(ab[k] == first for k in shared)
    # One series is the one-series chart.
    one = [st.text for st in render_series([a], 60, 12)]
    assert one == [st.text for st in render_chart(a, 60, 12)]
    # Steps: across at the first level, straight down at the next point, across again.
    stair = dots(render_series([[(1, 2.0), (5, 1.0), (10, 1.0)]], 40, 10, steps=True))
    rows_at = {}
    for r, c in stair:
        rows_at.setdefault(c, set()).add(r)
    drop = [c for c, rs in rows_at.items() if len(rs) >= 4]
    assert len(drop) == 1  # one column holds the whole drop: no diagonal
    assert "empty" in "".join(st.text for st in render_series([[], []], 40, 6, empty="empty"))


def test_sweep_rows_and_trial_rows() -> None:
    sweeps = recorded_sweeps()
    rows = dict(sweep_rows([sweeps[SWEEP].row, sweeps[OLD_SWEEP].row]))
    assert list(rows) == [SWEEP, OLD_SWEEP]
    assert rows[SWEEP] == (SWEEP, "running", "bayesian+median", "10/16", (2, 0), 2, 1, "val_loss ↓",
                           "0.008938 (#9)")
    assert rows[OLD_SWEEP][4] is None and rows[OLD_SWEEP][2] == "grid"
    detail = sweeps[SWEEP]
    trials = trial_rows(detail, NOW)
    assert [k for k, _ in trials][:3] == ["9", "3", "5"]
    by = dict(trials)
    assert by["9"] == ((9, 1), "completed", ("0.008938", False), "30", "-", 40,
                       "lr=0.0093 width=136 optimizer=adamw")
    assert by["12"][2] == ("0.7451", True) and by["12"][5] == 159  # running: so far, muted
    assert by["6"][4] == "9" and by["10"][2] == ("-", False)


def test_sweep_text_helpers() -> None:
    assert objective_text(None) == "-" and objective_text(0.0123456789) == "0.012346"
    assert objective_text(float("nan")) == "nan" and objective_text(3.2e7) == "3.200e+07"
    detail = recorded_sweeps()[SWEEP]
    t = {t.number: t for t in detail.trials}
    assert trial_duration(t[9], NOW) == 40.0 and trial_duration(t[12], NOW) == NOW - t[12].started
    assert best_text(detail.row) == "0.008938 (#9)"
    assert best_text(dataclasses.replace(detail.row, best_trial=None)) == "-"
    assert [x.number for x in curve_trials(detail)] == [9, 3, 5]
    assert [x.number for x in curve_trials(detail, extra=6)] == [9, 3, 5, 6]
    assert [x.number for x in curve_trials(detail, extra=10)] == [9, 3, 5]  # no curve: not drawn
    line = trial_line(t[10])
    assert "trial 10" in line and "$error" in line and "exited with code 1" in line
    assert "pruned at step 9" in trial_line(t[6]) and trial_line(None) == ""
    body = stop_sweep_text(detail.row)
    assert "2 trial(s) running, 0 queued; 10 of 16 done" in body and "best: trial 9" in body


def test_fetch_sweeps_picks_the_newest_and_reports_errors() -> None:
    sweeps = recorded_sweeps()

    class Client:
        fail: Exception | None = None
        fail_detail: Exception | None = None

        def sweeps(self) -> list[Any]:
            if self.fail:
                raise self.fail
            return [d.row for d in sweeps.values()]

        def sweep_detail(self, ref: str) -> Any:
            if self.fail_detail:
                raise self.fail_detail
            return sweeps[ref]

    c = Client()
    f = fetch_sweeps(c, None)
    assert f.selected == SWEEP and f.detail is sweeps[SWEEP] and f.error is None and len(f.rows or ()) == 2
    assert fetch_sweeps(c, OLD_SWEEP).detail is sweeps[OLD_SWEEP]
    assert fetch_sweeps(c, "gone-sw000000").selected == SWEEP  # a sweep no longer listed
    c.fail_detail = TimeoutError()
    f = fetch_sweeps(c, OLD_SWEEP)
    assert f.rows is not None and f.detail is None and f.error == f"sweep {OLD_SWEEP}: TimeoutError"
    c.fail = ConnectionError("server h1: link down")
    f = fetch_sweeps(c, OLD_SWEEP)
    assert f.rows is None and f.selected == OLD_SWEEP and f.error == "sweeps: server h1: link down"


def test_jobs_running_counts_what_holds_hosts_not_what_waits() -> None:
    states = ["queued", "queued", "pending", "starting", "running", "stopping", "succeeded", "failed", "stopped"]
    # the summary said "9 running · 8 queued" for 1 and 8
    assert jobs_running([job_row(f"j{i}", s) for i, s in enumerate(states)]) == 3


def test_a_strip_divided_whole_is_not_kept_in_itself() -> None:
    """The app's ``Strip.divide`` gives a strip cut at its own length as itself without
    caching that list in the strip (a cycle only the garbage collector could free); other cuts
    divide as Textual's does."""
    import gc

    from rich.segment import Segment
    from textual.strip import Strip

    from tui.app import stripcycle
    from tui.app.textualpatch import REPLACED

    stripcycle.install()
    strip = Strip([Segment("abc"), Segment("defg", Style(bold=True))])
    assert strip.divide([7]) == [strip] and strip.divide([7, 9]) == [strip]
    assert not gc.get_referrers(strip)  # nothing of its own holds it
    parts = strip.divide([2, 5, 7])
    assert [p.text for p in parts] == ["ab", "cde", "fg"]
    textuals = getattr(Strip.divide, REPLACED)  # what the app's divide replaced
    assert textuals(Strip(list(strip)), [2, 5, 7]) == parts


def test_an_lru_cache_cleared_or_discarded_frees_its_entries_without_the_collector() -> None:
    """Textual's ``LRUCache`` keeps entries in a ring; the app's ``clear`` and ``discard`` cut
    it (tui/app/cycles.py), so what was cached goes by reference count, not a collector pass;
    the cache works as before."""
    import gc
    import weakref

    from textual.cache import LRUCache

    from tui.app import cycles

    class Value:
        pass

    cycles.install()
    gc.disable()
    try:
        cache: LRUCache[int, Value] = LRUCache(3)
        values = [Value() for _ in range(5)]
        for i, v in enumerate(values):
            cache[i] = v
        assert cache.get(1) is None and cache.get(4) is values[4] and cache.get(2) is values[2]
        refs = [weakref.ref(v) for v in values]
        del values, v
        cache.clear()
        assert not cache and all(r() is None for r in refs)  # freed by reference count alone
        one = Value()
        ref = weakref.ref(one)
        cache[7] = one
        del one
        cache.discard(7)  # the ring's only entry linked to itself
        assert ref() is None and 7 not in cache
        cache[8] = Value()
        cache[9] = Value()
        cache.discard(8)
        assert cache.get(9) is not None and cache.get(8) is None
    finally:
        gc.enable()


def test_a_strip_crop_extended_whole_is_not_kept_in_itself() -> None:
    """``Strip.crop_extend`` over the whole strip gives the strip itself without keeping it in
    its own cache; a crop or an extension is Textual's, cached as before."""
    import gc

    from rich.segment import Segment
    from textual.strip import Strip

    from tui.app import stripcycle
    from tui.app.textualpatch import REPLACED

    stripcycle.install()
    strip = Strip([Segment("abc"), Segment("defg", Style(bold=True))])
    assert strip.crop_extend(0, 7, None) is strip
    assert not gc.get_referrers(strip)  # nothing of its own holds it
    assert strip.crop_extend(1, 5, None).text == "bcde"
    assert strip.crop_extend(0, 9, None).text == "abcdefg  "
    assert strip.crop_extend(1, 5, None) is strip.crop_extend(1, 5, None)  # still cached
    textuals = getattr(Strip.crop_extend, REPLACED)  # what the app's crop_extend replaced
    assert textuals(Strip(list(strip)), 0, 7, None).text == "abcdefg"


async def test_a_static_keeps_its_size_right_without_a_layout_per_update() -> None:
    """``update_static``: a new text of the same height is shown; one of another height lays
    the widget out again at its new height."""
    from textual.widgets import Static

    from tui.app.widgets.statictext import update_static

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield Static("one line", id="s")

    app = One()
    async with app.run_test(size=(40, 10)) as pilot:
        s = app.query_one("#s", Static)
        await pilot.pause()
        assert update_static(s, "another") and not update_static(s, "another")
        await pilot.pause()
        assert s.size.height == 1 and "another" in str(s.render())
        update_static(s, "three\nlines\nnow")
        await pilot.pause()
        assert s.size.height == 3
        update_static(s, "back to one")
        await pilot.pause()
        assert s.size.height == 1 and "back to one" in str(s.render())


def test_merge_runs_joins_neighbours_of_one_style_and_keeps_the_text() -> None:
    from rich.segment import Segment
    from rich.style import Style

    from tui.app.widgets.format import merge_runs

    a, b = Style(bold=True), Style(italic=True)
    segs = [Segment(" x ", a), Segment("y", a), Segment("z", b), Segment(" ", a), Segment("w", a)]
    out = merge_runs(segs)
    assert [(s.text, s.style) for s in out] == [(" x y", a), ("z", b), (" w", a)]
    assert "".join(s.text for s in out) == "".join(s.text for s in segs)
    assert merge_runs([]) == []


def _passes() -> tuple[list[int], Any]:
    """The generations of the collector's passes from now on, and the callback to remove."""
    import gc

    seen: list[int] = []

    def cb(phase: str, info: dict[str, Any]) -> None:
        if phase == "stop":
            seen.append(info["generation"])

    gc.callbacks.append(cb)
    return seen, cb


def test_the_collector_runs_its_passes_between_frames(monkeypatch: pytest.MonkeyPatch) -> None:
    """``between_frames`` runs a young pass once ``YOUNG`` objects were made since the last
    (nothing before), one over the middle generation after ``MIDDLE`` of them (then a freeze of
    what outlived it), and a full one
    (then a freeze) soon after the cluster grew and once a minute after that; the collector
    itself never starts a full pass, and is left as it was after."""
    import gc

    from tui.app import collector as col

    clock = [1000.0]
    monkeypatch.setattr(col.time, "monotonic", lambda: clock[0])
    before = gc.get_threshold()
    tuning = col.CollectorTuning(memory=lambda: 100.0)
    tuning.start()
    seen, cb = _passes()
    try:
        assert gc.get_threshold() == (col.NET, col.MIDDLE, col.NEVER)
        gc.collect(1)
        seen.clear()
        tuning.between_frames()
        assert seen == []  # nothing made yet
        kept = [[i] for i in range(col.YOUNG + 100)]
        tuning.between_frames()
        assert seen == [0]
        for _ in range(col.MIDDLE - 1):
            gc.collect(0)
        seen.clear()
        frozen = gc.get_freeze_count()
        tuning.between_frames()
        assert seen == [1]
        # what outlived the middle pass is frozen with it: no later pass walks it
        assert gc.get_freeze_count() >= frozen + len(kept) and not gc.get_objects(2)
        tuning.cluster(8)  # hosts came up: a full pass in a moment, not at once
        seen.clear()
        tuning.between_frames()
        assert 2 not in seen
        clock[0] += 2.5
        tuning.between_frames()
        assert seen[-1] == 2 and gc.get_freeze_count() >= len(kept)
        seen.clear()
        clock[0] += col.FULL_S - 1
        tuning.between_frames()
        assert 2 not in seen
        clock[0] += 2
        tuning.between_frames()
        assert seen[-1] == 2  # a minute after the last
    finally:
        gc.callbacks.remove(cb)
        tuning.stop()
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0


def test_the_collector_frees_frozen_garbage_once_memory_has_grown() -> None:
    """Garbage frozen with the app (a cycle that died after the freeze) stays until memory
    has grown by ``GROWTH_MB`` since the last full pass; then one pass over everything frees
    it, and the next growth is counted from there."""
    import gc
    import weakref

    from tui.app import collector as col

    class Node:
        other: Any = None

    memory = [100.0]
    a, b = Node(), Node()
    a.other, b.other = b, a
    gone = weakref.ref(a)
    tuning = col.CollectorTuning(memory=lambda: memory[0])
    tuning.start()  # freezes the cycle with everything else
    try:
        del a, b
        gc.collect()
        assert gone() is not None  # frozen: no pass walks it
        memory[0] += col.GROWTH_MB - 1
        tuning.check_memory()
        assert gone() is not None and tuning.full_passes == 0
        memory[0] += 2
        tuning.check_memory()
        assert gone() is None and tuning.full_passes == 1
        tuning.check_memory()
        assert tuning.full_passes == 1  # counted from the last full pass
    finally:
        tuning.stop()


def test_the_frame_log_names_each_collector_pass_and_each_slow_stretch(tmp_path: Path) -> None:
    """``RIGDECK_FRAME_LOG``: each collector pass with its generation and what it freed, each
    stretch over ``LOG_OVER_MS`` with its kind and where it fell; short ones are left out."""
    import gc

    from tui.app.frametimer import LOG_OVER_MS, FrameTimer

    log = tmp_path / "frames.log"
    timer = FrameTimer()
    timer.log_to(str(log), lambda: "gpus sort=util")
    timer.watch_collector()
    try:
        timer.note(LOG_OVER_MS + 5, "refresh")
        timer.note(LOG_OVER_MS - 5, "frame")
        gc.collect(0)
    finally:
        timer.stop()
    lines = log.read_text().splitlines()
    assert any(line.endswith(f"refresh {LOG_OVER_MS + 5:.1f} ms in gpus sort=util") for line in lines)
    assert not any(" frame " in line for line in lines)
    assert any(" gc0 " in line and " collected " in line for line in lines)


def test_one_table_gives_every_state_its_colour_in_tables_and_heads() -> None:
    """A state looks the same wherever the app shows it: the tables' level and the heads' markup
    both come from format.state_level, and no view or widget keeps a table of its own."""
    import re
    from pathlib import Path

    from tui.app.widgets.format import LEVEL_MARKUP, state_level, state_markup

    for state, lvl in {"running": "ok", "succeeded": "ok", "completed": "ok", "failed": "crit",
                       "stopped": "muted", "queued": "muted", "starting": "warn", "unknown": "warn",
                       "up": "ok", "stale": "warn", "down": "crit", "cached": "accent"}.items():
        assert state_level(state) == lvl, state
        assert state_markup(state) == LEVEL_MARKUP[lvl], state
    app = Path(__file__).resolve().parent.parent / "tui" / "app"
    own = [f"{p.relative_to(app)}: {m.group(0)}" for p in app.rglob("*.py") if p.name != "format.py"
           for m in re.finditer(r'"(running|failed|stopped|up|down)": *"(\$[a-z-]+|ok|warn|crit|muted)"',
                                p.read_text())]
    assert own == [], own
