"""The app's patches of Textual's internals (tui/app/textualpatch.py and its users): each is put
in place where its target is as expected, and where the target is gone or takes other
parameters the app keeps Textual's own behaviour, says so once in the log, and runs."""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from typing import Any

import pytest
from rich.segment import Segment
from textual.app import App, ComposeResult
from textual.cache import LRUCache
from textual.css.stylesheet import Stylesheet
from textual.screen import Screen
from textual.strip import Strip
from textual.widgets import DataTable

from tui.app import cycles, frametimer, stripcycle, textualpatch
from tui.app.frametimer import TimedScreen, default_screen
from tui.app.shell import SEES_CLOSING
from tui.app.textualpatch import REPLACED, Need, Probe, patch, usable
from tui.app.widgets.difftable import FAST, Col, DiffTable

LOGGER = "tui.app.textualpatch"


@pytest.fixture(autouse=True)
def fresh_log(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Each test starts with nothing said yet (the log says each feature once per process)."""
    monkeypatch.setattr(textualpatch, "_told", set())
    caplog.set_level(logging.WARNING, logger=LOGGER)


def said(caplog: pytest.LogCaptureFixture, feature: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and feature in r.getMessage()]


def textuals(owner: type, name: str) -> Callable[..., Any]:
    """Textual's own ``owner.name``, whether or not the app has replaced it already (an app
    started earlier in this process patches the classes)."""
    current = getattr(owner, name)
    return getattr(current, REPLACED, current)


def with_extra_parameter(original: Callable[..., Any]) -> Callable[..., Any]:
    """Textual's method as a release that gave it one more parameter would have it: it still
    works, the parameters the app's replacement was written for are not these."""

    def changed(self: Any, *args: Any, extra: Any = None, **kwargs: Any) -> Any:
        return original(self, *args, **kwargs)

    return changed


def left_to_collector(make: Callable[[], object]) -> int:
    """How many objects ``make()`` leaves that only the garbage collector frees (in cycles):
    what the patches of stripcycle and cycles are for."""
    gc.collect()
    gc.disable()
    try:
        make()
        return gc.collect()
    finally:
        gc.enable()


def whole_cut(name: str) -> Callable[[], object]:
    """A strip cut whole by ``Strip.name``, then dropped."""
    if name == "divide":
        return lambda: Strip([Segment("abcd")], 4).divide([4])
    return lambda: Strip([Segment("abcd")], 4).crop_extend(0, 4, None)


def cleared_cache() -> object:
    cache: LRUCache[int, list[int]] = LRUCache(4)
    cache.set(1, [1])
    cache.clear()
    return None


# -- the helper -------------------------------------------------------------------------------


class Scratch:
    def step(self, x: int) -> int:
        return x + 1


def test_patch_replaces_a_target_as_expected_once() -> None:
    class Target(Scratch):
        def step(self, x: int) -> int:
            return x + 1

    def doubled(step: Callable[..., int]) -> Callable[..., int]:
        return lambda self, x: 2 * step(self, x)

    assert patch(Target, "step", ("self", "x"), doubled, "doubling")
    assert patch(Target, "step", ("self", "x"), doubled, "doubling")  # already there: not twice
    assert Target().step(1) == 4


@pytest.mark.parametrize("change", ["gone", "renamed", "parameters"])
def test_patch_leaves_a_changed_target_and_says_so_once(change: str, caplog: pytest.LogCaptureFixture) -> None:
    class Target:
        def step(self, x: int) -> int:
            return x + 1

    if change == "gone":
        del Target.step
    elif change == "renamed":
        Target.next_step = Target.step  # type: ignore[attr-defined]
        del Target.step
    else:
        Target.step = lambda self, x, y=0: x + 1  # type: ignore[method-assign,assignment,misc]
    before = getattr(Target, "step", None)
    for _ in range(3):  # the app starts more than once in a process
        assert not patch(Target, "step", ("self", "x"), lambda f: lambda self, x: 0, "stepping")
    assert getattr(Target, "step", None) is before  # Textual's own, untouched
    [line] = said(caplog, "stepping")
    assert "Target.step" in line and ("not there" if change != "parameters" else "takes") in line


def test_usable_checks_instances_dotted_paths_and_probes(caplog: pytest.LogCaptureFixture) -> None:
    thing = Scratch()
    thing.state = 1  # type: ignore[attr-defined]
    assert usable("fine", [Need(thing, "state"), Need("textual.strip.Strip", "divide", ("self", "cuts"))])
    assert not usable("gone", [Need(thing, "other"), Need("textual._nowhere.Thing", "x")])
    [line] = said(caplog, "gone")
    assert "Scratch().other is not there" in line and "textual._nowhere.Thing is not there" in line
    assert not usable("probed", [Probe("a ring of lists", lambda: False)])
    assert not usable("raised", [Probe("a ring of lists", lambda: 1 / 0 > 0)])
    assert len(said(caplog, "probed")) == 1 and "ZeroDivisionError" in said(caplog, "raised")[0]


# -- stripcycle --------------------------------------------------------------------------------


def test_strip_patches_in_place_where_textual_is_as_expected() -> None:
    stripcycle.install()
    for name in ("divide", "crop_extend"):
        assert getattr(getattr(Strip, name), REPLACED, None) is not None
        assert left_to_collector(whole_cut(name)) == 0  # freed by reference count


@pytest.mark.parametrize("name", ["divide", "crop_extend"])
def test_strip_patch_degrades_to_textuals(
    name: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    own = with_extra_parameter(textuals(Strip, name))
    monkeypatch.setattr(Strip, name, own)
    stripcycle.install()
    stripcycle.install()
    assert getattr(Strip, name) is own
    [line] = said(caplog, stripcycle.FEATURE)
    assert f"Strip.{name} takes" in line
    assert left_to_collector(whole_cut(name)) > 0  # Textual's: the strip kept in its own cache
    monkeypatch.delattr(Strip, name)
    monkeypatch.setattr(textualpatch, "_told", set())
    stripcycle.install()
    assert not hasattr(Strip, name)  # nothing of the app's put where Textual has nothing
    assert f"Strip.{name} is not there" in said(caplog, stripcycle.FEATURE)[-1]


# -- cycles ------------------------------------------------------------------------------------

CYCLES = [
    ("textual._compositor.Compositor", "_arrange_root", cycles.ARRANGE),
    (Stylesheet, "_process_component_classes", cycles.COMPONENTS),
    (LRUCache, "clear", cycles.LRU),
    (LRUCache, "discard", cycles.LRU),
]


def _owner(owner: object) -> type:
    found = textualpatch.resolve(owner)
    assert isinstance(found, type)
    return found


def test_cycle_patches_in_place_where_textual_is_as_expected() -> None:
    cycles.install()
    for owner, name, _ in CYCLES:
        assert getattr(getattr(_owner(owner), name), REPLACED, None) is not None, name
    assert left_to_collector(cleared_cache) == 0  # the ring cut


@pytest.mark.parametrize(("owner", "name", "feature"), CYCLES)
@pytest.mark.parametrize("change", ["gone", "parameters"])
def test_cycle_patch_degrades_to_textuals(
    owner: object, name: str, feature: str, change: str,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    cls = _owner(owner)
    if change == "gone":
        monkeypatch.delattr(cls, name)
    else:
        monkeypatch.setattr(cls, name, with_extra_parameter(textuals(cls, name)))
    before = getattr(cls, name, None)
    cycles.install()
    cycles.install()
    assert getattr(cls, name, None) is before
    [line] = said(caplog, feature)
    assert f"{cls.__qualname__}.{name}" in line


def test_lru_patch_degrades_when_entries_are_kept_otherwise(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A Textual whose LRUCache is not a ring of lists: the replacements (which cut the ring
    with list.clear) stay out, and Textual's clear keeps working."""
    for name in ("clear", "discard"):
        monkeypatch.setattr(LRUCache, name, textuals(LRUCache, name))
    monkeypatch.setattr(cycles, "_lru_links_are_lists", lambda: False)
    cycles.install()
    assert getattr(LRUCache.clear, REPLACED, None) is None
    assert getattr(LRUCache.discard, REPLACED, None) is None
    assert len(said(caplog, cycles.LRU)) == 1
    assert left_to_collector(cleared_cache) > 0  # Textual's clear: each entry left a ring


# -- the frame timer's screen ------------------------------------------------------------------


def test_the_default_screen_is_timed_where_screen_updates_as_expected() -> None:
    assert isinstance(default_screen(), TimedScreen)


@pytest.mark.parametrize("change", ["gone", "parameters"])
async def test_the_default_screen_degrades_to_textuals(
    change: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    if change == "gone":
        monkeypatch.delattr(Screen, "_on_timer_update")
        assert type(default_screen()) is Screen
        return
    monkeypatch.setattr(Screen, "_on_timer_update", with_extra_parameter(Screen._on_timer_update))

    class Timed(App[None]):
        frame_timer = frametimer.FrameTimer()

        def get_default_screen(self) -> Screen[Any]:
            return default_screen()

        def compose(self) -> ComposeResult:
            yield DataTable()

    app = Timed()
    async with app.run_test() as pilot:
        await pilot.pause()
        assert type(app.screen) is Screen
    assert app.frame_timer.frames == 0  # Textual's own screen: its updates untimed
    [line] = said(caplog, frametimer.TIMED)
    assert "Screen._on_timer_update takes" in line


# -- DiffTable -------------------------------------------------------------------------------


class _Tables(App[None]):
    def compose(self) -> ComposeResult:
        yield DiffTable(id="a")
        yield DiffTable(id="b")

    def on_mount(self) -> None:
        for t in self.query(DiffTable):
            t.set_columns([Col("k", "Key"), Col("v", "Value", 8)])


async def test_diff_table_keeps_datatables_ways_where_its_internals_changed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """DataTable's row drawing with another parameter (as in a release that changed it): both
    tables draw, order and update their rows DataTable's own way, the log says so once."""
    monkeypatch.setattr(
        DataTable, "_render_line_in_row", with_extra_parameter(DataTable._render_line_in_row)
    )
    app = _Tables()
    async with app.run_test(size=(60, 20)) as pilot:
        t = app.query_one("#a", DiffTable)
        rows: list[tuple[str, tuple[Any, ...]]] = [(f"r{i}", (f"r{i}", i)) for i in range(5)]
        s = t.apply(rows)
        assert (s.added, s.removed, s.reordered) == (5, 0, False)
        t.move_cursor(row=3)
        rows[1] = ("r1", ("r1", 10))
        s = t.apply(rows)
        assert (s.cells, s.reordered) == (1, False)
        assert str(t.get_cell("r1", "v")) == "10"  # stored through update_cell
        s = t.apply([rows[4], rows[3], rows[0]])
        assert (s.removed, s.reordered) == (2, True)
        assert [t.coordinate_to_cell_key((i, 0)).row_key.value for i in range(3)] == ["r4", "r3", "r0"]
        assert t.cursor_key == "r3"  # the cursor stayed on its row
        await pilot.pause()
        shown = [t.render_line(y).text for y in range(4)]
        assert [line.split()[:2] for line in shown] == [["Key", "Value"], ["r4", "4"], ["r3", "3"], ["r0", "0"]]
        assert t._strips == {} and t._rows_rendered == {}  # the fast drawing never ran
    [line] = said(caplog, FAST)
    assert "DataTable._render_line_in_row takes" in line


async def test_diff_table_draws_fast_where_datatable_is_as_expected(caplog: pytest.LogCaptureFixture) -> None:
    app = _Tables()
    async with app.run_test(size=(60, 20)) as pilot:
        t = app.query_one("#a", DiffTable)
        t.apply([(f"r{i}", (f"r{i}", i)) for i in range(5)])
        await pilot.pause()
        assert t.render_line(5).text.split()[:2] == ["r4", "4"]
        assert "r4" in t._rows_rendered  # drawn from its own cache of rows
    assert said(caplog, FAST) == []


# -- the whole app -----------------------------------------------------------------------------

EVERY_TARGET = [(Strip, "divide"), (Strip, "crop_extend"), *((_owner(o), n) for o, n, _ in CYCLES),
                (Screen, "_on_timer_update"), (DataTable, "_render_line_in_row")]
EVERY_FEATURE = [stripcycle.FEATURE, cycles.ARRANGE, cycles.COMPONENTS, cycles.LRU, frametimer.TIMED, FAST]


async def test_the_app_runs_on_textuals_own_where_every_target_changed(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every patched or overridden method of Textual's with another parameter at once: the app
    starts, shows, filters and sorts the recorded cluster's GPUs, and stops; the log names each
    feature it goes without once."""
    from tests.ui_fixtures import recorded_app
    from tui.app.widgets.tables import GpusTable

    for owner, name in EVERY_TARGET:
        monkeypatch.setattr(owner, name, with_extra_parameter(textuals(owner, name)))
    app = recorded_app()
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.press("2")
        await pilot.pause()
        table = app.query_one("#gpus-table", GpusTable)
        assert table.row_count == 8 and not table._fast_paths
        await pilot.press("b")  # busy GPUs only: four ranks and bob's process
        await pilot.pause()
        assert table.row_count == 5
        await pilot.press("b", "b", "o")  # idle, all again, then sorted by utilization
        await pilot.pause()
        utils = [int(table.cell_text(k, "util").split()[-1].rstrip("%")) for k in table._order]
        assert utils == sorted(utils, reverse=True) and table.row_count == 8
        first = table.render_line(1).text  # the first row, as DataTable draws it
        assert first.split()[0] == table.cell_text(table._order[0], "host") and f"{utils[0]}%" in first
    for owner, name in EVERY_TARGET:  # nothing of the app's put in their place
        assert getattr(getattr(owner, name), REPLACED, None) is None
    for feature in EVERY_FEATURE:
        assert len(said(caplog, feature)) == 1, feature
    assert said(caplog, SEES_CLOSING) == []  # the screen's private flags are all there
