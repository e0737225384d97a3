"""The key bar (tui/app/widgets/keybar.py): it shows the focused widget's keys, follows the focus
without mounting or removing a widget, runs a clicked key, cuts what does not fit at a whole
key, and in the app follows the view keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.color import Color
from textual.pilot import Pilot
from textual.style import Style
from textual.widget import Widget

from tests.ui_fixtures import recorded_app
from tui.app.widgets.keybar import KeyBar


class Pane(Widget, can_focus=True):
    DEFAULT_CSS = "Pane { height: 3; }"


class Left(Pane):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "app.hit('a')", "Alpha"),
        Binding("x", "app.hit('x')", "Off"),
        Binding("z", "app.hit('z')", "Hidden", show=False),
    ]


class Right(Pane):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("b", "app.hit('b')", "Beta"),
        Binding("B", "app.hit('b')", "Beta again"),  # the same action: only the first is shown
    ]


class BarApp(App[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("q", "hit('q')", "Quit")]

    def __init__(self) -> None:
        super().__init__()
        self.hits: list[str] = []
        self.bells = 0

    def compose(self) -> ComposeResult:
        yield Left(id="left")
        yield Right(id="right")
        yield KeyBar()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return None if parameters == ("x",) else True  # x: shown, but disabled

    def action_hit(self, what: str) -> None:
        self.hits.append(what)

    def bell(self) -> None:
        self.bells += 1


async def settle(pilot: Pilot[Any], cond: Callable[[], object]) -> None:
    for _ in range(100):
        await pilot.pause(0.02)
        if cond():
            return


async def until_shown(pilot: Pilot[Any], bar: KeyBar, word: str) -> None:
    await settle(pilot, lambda: word in bar.text)


async def left_focused(app: BarApp, pilot: Pilot[Any]) -> KeyBar:
    """The app's key bar once the left pane has the focus and the bar shows its keys."""
    bar = app.query_one(KeyBar)
    app.query_one(Left).focus()
    await until_shown(pilot, bar, "Alpha")
    return bar


def span_of(bar: KeyBar, key: str) -> tuple[int, int]:
    for start, end, item in bar.spans:
        if item.key == key:
            return start, end
    raise AssertionError(f"{key!r} not on the bar: {bar.text!r}")


async def test_the_bar_shows_the_focused_widgets_keys_and_follows_the_focus() -> None:
    app = BarApp()
    async with app.run_test(size=(80, 8)) as pilot:
        bar = await left_focused(app, pilot)
        text = bar.text
        assert text.startswith("a Alpha x Off q Quit ")
        assert "Beta" not in text and "Hidden" not in text
        assert text.rstrip().endswith("▏^p palette")  # the command palette's key, on the right
        assert len(text) < 80 and span_of(bar, "ctrl+p")[1] == 79  # one space to the right edge

        content = bar.render()
        styles = {content.plain[s.start:s.end]: s.style for s in content.spans
                  if isinstance(s.style, Style)}
        assert styles["a"].bold and not styles["a"].dim
        assert styles["x"].dim and styles[" Off"].dim  # disabled: dimmed
        assert not styles[" Alpha"].dim

        app.query_one(Right).focus()
        await settle(pilot, lambda: "Beta" in bar.text)
        assert bar.text.startswith("b Beta q Quit ")
        assert "Alpha" not in bar.text and "again" not in bar.text


async def test_focus_changes_redraw_the_same_widget_and_mount_nothing() -> None:
    app = BarApp()
    async with app.run_test(size=(80, 8)) as pilot:
        bar = await left_focused(app, pilot)
        nodes = list(app.screen.query("*"))
        for i in range(6):
            pane, word = (Right, "Beta") if i % 2 == 0 else (Left, "Alpha")
            app.query_one(pane).focus()
            await until_shown(pilot, bar, word)
            assert word in bar.text
            assert app.query_one(KeyBar) is bar
            assert not bar.children
        await pilot.pause(0.05)
        assert list(app.screen.query("*")) == nodes  # not one widget mounted or removed
        assert bar.update_items() is False  # nothing changed: nothing to draw again


async def test_clicking_a_key_runs_it_and_a_disabled_one_rings_the_bell() -> None:
    app = BarApp()
    async with app.run_test(size=(80, 8)) as pilot:
        bar = await left_focused(app, pilot)

        start, end = span_of(bar, "a")
        await pilot.click(KeyBar, offset=(end - 1, 0))  # on its description
        await settle(pilot, lambda: app.hits)
        assert app.hits == ["a"] and app.bells == 0

        start, _ = span_of(bar, "x")
        await pilot.click(KeyBar, offset=(start, 0))
        await pilot.pause(0.1)
        assert app.hits == ["a"] and app.bells == 1  # disabled: not run

        await pilot.click(KeyBar, offset=(start - 1, 0))  # the space between two keys
        await pilot.click(KeyBar, offset=(50, 0))  # past the last key
        await pilot.pause(0.1)
        assert app.hits == ["a"] and app.bells == 1

        start, _ = span_of(bar, "q")
        await pilot.click(KeyBar, offset=(start + 2, 0))
        await settle(pilot, lambda: len(app.hits) > 1)
        assert app.hits == ["a", "q"]


async def test_keys_that_do_not_fit_are_cut_at_a_whole_key() -> None:
    app = BarApp()
    async with app.run_test(size=(30, 8)) as pilot:
        bar = await left_focused(app, pilot)
        text = bar.text
        # 30 cells: 12 for the palette's key, 18 left: "a Alpha x Off " and not "q Quit" (20)
        assert text.startswith("a Alpha x Off ")
        assert "q" not in text.replace("^p palette", "")
        assert text.rstrip().endswith("▏^p palette") and len(text) == 29
        assert [item.key for _, _, item in bar.spans] == ["a", "x", "ctrl+p"]

        await pilot.resize_terminal(40, 8)
        await settle(pilot, lambda: "Quit" in bar.text)
        assert bar.text.startswith("a Alpha x Off q Quit ")


async def test_a_view_key_in_the_app_changes_the_bar() -> None:
    app = recorded_app()
    async with app.run_test(size=(120, 36)) as pilot:
        bar = app.query_one(KeyBar)
        await settle(pilot, lambda: "Launch" in bar.text)
        assert "Filter" not in bar.text
        await pilot.press("2")  # the GPU view: its filter, busy/idle and sort keys
        await settle(pilot, lambda: "Filter" in bar.text)
        assert "/ Filter" in bar.text and "b Busy/idle" in bar.text and "l Launch" in bar.text
        await pilot.press("8")  # the map: its colour key, not the GPU view's
        await settle(pilot, lambda: "Colour" in bar.text)
        assert "m Colour" in bar.text and "Filter" not in bar.text
        assert app.query_one(KeyBar) is bar and not bar.children


async def test_the_key_under_the_mouse_is_highlighted_and_shows_its_tooltip() -> None:
    app = BarApp()
    async with app.run_test(size=(80, 8)) as pilot:
        bar = await left_focused(app, pilot)

        def background(word: str) -> object:
            content = bar.render()
            for span in content.spans:
                if content.plain[span.start:span.end] == word and isinstance(span.style, Style):
                    return span.style.background
            raise AssertionError(word)

        plain = background(" Alpha")
        start, _ = span_of(bar, "a")
        await pilot.hover(KeyBar, offset=(start + 3, 0))
        await settle(pilot, lambda: bar.hovered == "a")
        assert bar.hovered == "a"
        assert background(" Alpha") != plain and background(" Off") == plain

        start, _ = span_of(bar, "ctrl+p")
        await pilot.hover(KeyBar, offset=(start, 0))  # the rule left of the palette's key is its own
        await settle(pilot, lambda: bar.hovered == "ctrl+p")
        assert bar.tooltip == "Open the command palette"
        assert background(" Alpha") == plain

        await pilot.hover(KeyBar, offset=(50, 0))  # no key there
        await settle(pilot, lambda: bar.hovered is None)
        assert bar.hovered is None and bar.tooltip is None


async def test_a_new_theme_recolours_the_keys() -> None:
    app = BarApp()
    async with app.run_test(size=(80, 8)) as pilot:
        bar = await left_focused(app, pilot)

        def key_colour() -> object:
            content = bar.render()
            for span in content.spans:
                if content.plain[span.start:span.end] == "a" and isinstance(span.style, Style):
                    return span.style.foreground
            raise AssertionError("a")

        app.theme = "textual-dark"
        await pilot.pause(0.1)
        dark = key_colour()
        app.theme = "textual-light"
        await pilot.pause(0.1)
        assert key_colour() != dark
        assert key_colour() == Color.parse(app.get_css_variables()["footer-key-foreground"])
