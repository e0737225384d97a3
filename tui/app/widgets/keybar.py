"""The key bar: the bottom line of keys that work where you are, drawn by one widget.

Textual's ``Footer`` shows the same line, but it is a container of one ``FooterKey`` widget a
key, and it recomposes each time the active bindings change (every view switch moves the focus):
~15 widgets removed and ~15 mounted. A removed widget is a web of reference cycles that only the
cyclic collector frees, and mounting one matches CSS and lays out; at 128 hosts the footer's
keys were most of the garbage the app's full collector pass had to walk. ``KeyBar`` is a single
widget without children: when the screen's bindings change it works out what it would show and,
when that differs from what it shows, draws it again. Nothing is ever mounted or removed.

It shows what the compact ``Footer`` shows: each shown binding of the screen's active bindings,
the first one of each action, as its key and its description (one space between, one space
after each), a disabled one dimmed, and the command palette's key on the right behind a thin
rule; the key under the mouse is highlighted and shows its tooltip, and a click on it presses it
(a disabled one rings the bell). Keys that do not fit the width are left off from the last one
that fits whole. Binding groups (``Binding.Group``) are not drawn as groups: rigdeck has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from rich.cells import cell_len
from textual import events
from textual.content import Content
from textual.style import Style
from textual.widget import Widget

if TYPE_CHECKING:
    from textual.screen import Screen
    from textual.signal import Signal

EDGE = "▏"  # the rule left of the palette's key (a ``vkey`` left border in Textual's Footer)


@dataclass(frozen=True)
class KeyItem:
    """One key on the bar: the key to simulate, how it is shown, what it does, whether it works,
    and the tooltip shown while the mouse rests on it."""

    key: str
    display: str
    description: str
    enabled: bool
    tooltip: str = ""

    @property
    def width(self) -> int:
        """Cells it takes, without the space after it."""
        if not self.description:
            return cell_len(self.display)
        return cell_len(self.display) + 1 + cell_len(self.description)


@dataclass(frozen=True)
class KeyItems:
    """What the bar shows: its keys, left to right, and the palette's key (None: not shown)."""

    keys: tuple[KeyItem, ...] = ()
    palette: KeyItem | None = None


class KeyBar(Widget, can_focus=False):
    """The keys of the screen's active bindings, on one line docked at the bottom."""

    ALLOW_SELECT = False
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "keybar--key",
        "keybar--description",
        "keybar--item",
        "keybar--disabled",
        "keybar--edge",
        "keybar--hover",
    }
    DEFAULT_CSS = """
    KeyBar {
        dock: bottom;
        width: 1fr;
        height: 1;
        text-wrap: nowrap;
        color: $footer-foreground;
        background: $footer-background;
        .keybar--item {
            background: $footer-item-background;
        }
        .keybar--key {
            color: $footer-key-foreground;
            background: $footer-key-background;
            text-style: bold;
        }
        .keybar--description {
            color: $footer-description-foreground;
            background: $footer-description-background;
        }
        .keybar--disabled {
            text-style: dim;
        }
        .keybar--edge {
            color: $foreground 20%;
        }
        .keybar--hover {
            background: $block-hover-background;
        }
    }
    """

    def __init__(self, *, name: str | None = None, id: str | None = None, classes: str | None = None):
        super().__init__(name=name, id=id, classes=classes)
        self.items = KeyItems()
        # x ranges drawn last, [start, end) in cells of this widget, with the key each one is
        self.spans: list[tuple[int, int, KeyItem]] = []
        self.hovered: str | None = None  # the key of the item under the mouse
        self._signal: Signal[Screen] | None = None

    # -- bindings -----------------------------------------------------------------------------

    def on_mount(self) -> None:
        self._signal = self.screen.bindings_updated_signal
        self._signal.subscribe(self, self._bindings_changed)
        self.update_items()

    def on_unmount(self) -> None:
        if self._signal is not None:
            self._signal.unsubscribe(self)
            self._signal = None

    def _bindings_changed(self, screen: Screen) -> None:
        # While the terminal has lost the app's focus the focused widget is put aside and only
        # the app's keys are active: keep what was shown until it comes back (as Footer does).
        if not self.app.app_focus or not self.is_attached or screen is not self.screen:
            return
        self.update_items()

    def collect(self) -> KeyItems:
        """What the screen's active bindings say the bar should show now."""
        active = self.screen.active_bindings
        app = self.app
        keys: list[KeyItem] = []
        actions: set[str] = set()
        for _node, binding, enabled, tooltip in active.values():
            if not binding.show or binding.action in actions:
                continue
            actions.add(binding.action)
            keys.append(KeyItem(binding.key, app.get_key_display(binding), binding.description, enabled,
                                tooltip))
        palette = None
        if app.ENABLE_COMMAND_PALETTE and (found := active.get(app.COMMAND_PALETTE_BINDING)):
            _node, binding, enabled, _tooltip = found
            palette = KeyItem(binding.key, app.get_key_display(binding), binding.description, enabled,
                              binding.tooltip or binding.description)
        return KeyItems(tuple(keys), palette)

    def update_items(self) -> bool:
        """Work out the keys again; draw them when they differ from those shown. True if so."""
        items = self.collect()
        if items == self.items:
            return False
        self.items = items
        self.refresh()
        return True

    # -- drawing ------------------------------------------------------------------------------

    def _item_look(self, item: KeyItem) -> Style:
        look = self.get_visual_style("keybar--item", partial=True)
        if item.key == self.hovered:
            look += self.get_visual_style("keybar--hover", partial=True)
        if not item.enabled:
            look += self.get_visual_style("keybar--disabled", partial=True)
        return look

    def _item_parts(self, item: KeyItem) -> list[tuple[str, Style]]:
        look = self._item_look(item)
        key = look + self.get_visual_style("keybar--key", partial=True)
        if not item.description:
            return [(item.display, key)]
        description = look + self.get_visual_style("keybar--description", partial=True)
        return [(item.display, key), (" " + item.description, description)]

    def render(self) -> Content:
        width = self.size.width
        palette = self.items.palette
        # the palette's key: the rule, the key, its description and a space to the right edge
        palette_width = 0 if palette is None else 1 + palette.width + 1
        if palette_width > width:
            palette, palette_width = None, 0
        room = width - palette_width
        parts: list[tuple[str, Style] | str] = []
        spans: list[tuple[int, int, KeyItem]] = []
        x = 0
        for item in self.items.keys:
            if x + item.width > room:
                break
            parts.extend(self._item_parts(item))
            parts.append(" ")
            spans.append((x, x + item.width, item))
            x += item.width + 1
        if palette is not None:
            start = room
            parts.append(" " * max(0, start - x))
            edge = self._item_look(palette) + self.get_visual_style("keybar--edge", partial=True)
            parts.append((EDGE, edge))
            parts.extend(self._item_parts(palette))
            spans.append((start, start + 1 + palette.width, palette))
        self.spans = spans
        return Content.assemble(*parts)

    def item_at(self, x: int) -> KeyItem | None:
        """The key drawn at cell ``x`` of the bar (None: none there)."""
        for start, end, item in self.spans:
            if start <= x < end:
                return item
        return None

    @property
    def text(self) -> str:
        """The bar's line as plain text, as last drawn (for tests and scripts)."""
        return self.render().plain

    # -- mouse --------------------------------------------------------------------------------

    def _hover(self, item: KeyItem | None) -> None:
        key = None if item is None else item.key
        if key == self.hovered:
            return
        self.hovered = key
        self.styles.pointer = "default" if item is None else "pointer"
        self.tooltip = (item.tooltip or None) if item is not None else None
        self.refresh()

    def on_mouse_move(self, event: events.MouseMove) -> None:
        self._hover(self.item_at(event.x))

    def on_leave(self, event: events.Leave) -> None:
        self._hover(None)

    def on_mouse_down(self, event: events.MouseDown) -> None:
        item = self.item_at(event.x)
        if item is None:
            return
        event.stop()
        if item.enabled:
            self.app.simulate_key(item.key)
        else:
            self.app.bell()
