"""A job's logs as toolong shows files: only visible lines are rendered, from a line cache.

The view keeps an index of the buffer lines that pass the rank filter (absolute buffer indices)
and renders line ``y`` from it on demand. ``sync()`` (called on the app's sampling timer) takes
only the lines added since the last call, so following a busy job costs what arrived, not what
is shown. Search highlights matches and jumps between them; follow mode keeps the end in view.
"""

from __future__ import annotations

from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding, BindingType
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from tui.model.jobview import LogBuffer

MAX_WIDTH = 2000


class LogView(ScrollView, can_focus=True):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "next_rank", "Rank filter", id="logs.rank"),
        Binding("f", "toggle_follow", "Follow", id="logs.follow"),
        Binding("slash", "search", "Search", id="logs.search"),
        Binding("n", "next_match", "Next match", id="logs.next"),
        Binding("N", "prev_match", "Prev match", id="logs.prev", show=False),
        Binding("G,end", "follow_end", "End", id="logs.end", show=False),
        Binding("g,home", "top", "Top", id="logs.top", show=False),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {"log--prefix", "log--match", "log--empty"}
    DEFAULT_CSS = """
    LogView { background: $surface; }
    LogView > .log--prefix { color: $text-muted; }
    LogView > .log--match { background: $warning 60%; color: $text; text-style: bold; }
    LogView > .log--empty { color: $text-muted; }
    """

    follow: reactive[bool] = reactive(True)
    rank: reactive[int | None] = reactive(None)
    search: reactive[str] = reactive("")

    class Changed(Message):
        """The filter, follow mode, search or line count changed (for the status line)."""

    class SearchRequested(Message):
        """The user asked to type a search term."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.buffer: LogBuffer | None = None
        self._seen = 0  # buffer lines looked at
        self._index: list[int] = []  # absolute buffer indices passing the rank filter
        self._max_width = 0
        self._cache: LRUCache[tuple[int, str, int], Strip] = LRUCache(2000)
        self._matches: list[int] = []  # positions in _index
        self._match_at = -1
        self.empty_message = "no job open"

    # -- data -------------------------------------------------------------------------------

    def set_buffer(self, buffer: LogBuffer | None, empty_message: str | None = None) -> None:
        if empty_message is not None:
            self.empty_message = empty_message
        if buffer is self.buffer:
            return
        self.buffer = buffer
        self.rank = None
        self._rebuild()

    def _passes(self, rank: int) -> bool:
        return self.rank is None or rank == self.rank

    def _rebuild(self) -> None:
        self._seen = 0
        self._index = []
        self._max_width = 0
        self._cache.clear()
        self._matches = []
        self._match_at = -1
        self.virtual_size = Size(0, 0)
        self.sync()
        if self.search:
            self._find_matches()
        self.refresh()

    def sync(self) -> int:
        """Take in the lines added since the last call; returns how many passed the filter."""
        buf = self.buffer
        if buf is None:
            return 0
        start, lines = buf.since(self._seen)
        self._seen = start + len(lines)
        if self._index and self._index[0] < buf.base:  # old lines dropped off the buffer
            self._index = [i for i in self._index if i >= buf.base]
            self._cache.clear()
            if self.search:
                self._find_matches()
        added = 0
        term = self.search.lower()
        for offset, (host, rank, text) in enumerate(lines):
            if not self._passes(rank):
                continue
            if term and term in text.lower():
                self._matches.append(len(self._index))
            self._index.append(start + offset)
            self._max_width = min(MAX_WIDTH, max(self._max_width, len(text) + len(host) + 8))
            added += 1
        if added or not self._index:
            self.virtual_size = Size(self._max_width, len(self._index))
            if self.follow:
                # After the refresh: the new virtual size must be laid out before the end moves.
                self.call_after_refresh(self.scroll_end, animate=False, x_axis=False)
            self.refresh()
            self.post_message(self.Changed())
        return added

    @property
    def line_count(self) -> int:
        return len(self._index)

    def visible_text(self) -> list[str]:
        """The lines the filter lets through, as plain text (for tests and copying)."""
        out: list[str] = []
        buf = self.buffer
        if buf is None:
            return out
        for i in self._index:
            item = buf.get(i)
            if item is not None:
                host, rank, text = item
                out.append(f"[{host} r{rank}] {text}")
        return out

    # -- rendering --------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        pos = scroll_y + y
        base_style = self.rich_style
        if self.buffer is None or not self._index:
            if y == 0:
                msg = self.empty_message if self.buffer is None else "no log lines yet"
                style = self.get_component_rich_style("log--empty", partial=True)
                return Strip([Segment(msg[:width], base_style + style)]).adjust_cell_length(
                    width, base_style
                )
            return Strip.blank(width, base_style)
        if pos >= len(self._index):
            return Strip.blank(width, base_style)
        absolute = self._index[pos]
        key = (absolute, self.search, id(self.app.current_theme))
        strip = self._cache.get(key)
        if strip is None:
            strip = self._render_full(absolute, base_style)
            self._cache[key] = strip
        return strip.crop_extend(scroll_x, scroll_x + width, base_style)

    def _render_full(self, absolute: int, base_style: Style) -> Strip:
        assert self.buffer is not None
        item = self.buffer.get(absolute)
        if item is None:
            return Strip.blank(0)
        host, rank, line = item
        text = Text(no_wrap=True, end="")
        text.append(
            f"[{host} r{rank}] ", style=self.get_component_rich_style("log--prefix", partial=True)
        )
        body = Text(line.expandtabs(8), no_wrap=True, end="")
        if self.search:
            body.highlight_words(
                [self.search],
                case_sensitive=False,
                style=self.get_component_rich_style("log--match", partial=True),
            )
        text.append_text(body)
        segments = list(text.render(self.app.console))
        return Strip(segments).apply_style(base_style)

    # -- search -----------------------------------------------------------------------------

    def _find_matches(self) -> None:
        self._matches = []
        self._match_at = -1
        term = self.search.lower()
        if not term or self.buffer is None:
            return
        for pos, i in enumerate(self._index):
            item = self.buffer.get(i)
            if item is not None and term in item[2].lower():
                self._matches.append(pos)

    def set_search(self, term: str) -> None:
        self.search = term
        self._cache.clear()
        self._find_matches()
        if self._matches:
            self.follow = False
            top = int(self.scroll_y)
            after = [i for i, p in enumerate(self._matches) if p >= top]
            self._goto_match(after[0] if after else 0)
        self.refresh()
        self.post_message(self.Changed())

    def _goto_match(self, i: int) -> None:
        if not self._matches:
            return
        self._match_at = i % len(self._matches)
        pos = self._matches[self._match_at]
        self.scroll_to(y=max(0, pos - self.size.height // 2), animate=False, immediate=True)
        self.post_message(self.Changed())

    @property
    def match_status(self) -> str:
        if not self.search:
            return ""
        if not self._matches:
            return f"{self.search!r}: no match"
        return f"{self.search!r}: {self._match_at + 1}/{len(self._matches)}"

    # -- actions ----------------------------------------------------------------------------

    def watch_rank(self, old: int | None, new: int | None) -> None:
        if old != new:
            self._rebuild()
            self.post_message(self.Changed())

    def watch_follow(self, follow: bool) -> None:
        if follow:
            self.call_after_refresh(self.scroll_end, animate=False, x_axis=False)
        self.post_message(self.Changed())

    def action_next_rank(self) -> None:
        """Cycle the rank filter: all ranks, then each rank that wrote a line."""
        ranks = sorted(self.buffer.ranks) if self.buffer is not None else []
        if not ranks:
            self.rank = None
            return
        if self.rank is None:
            self.rank = ranks[0]
        else:
            later = [r for r in ranks if r > self.rank]
            self.rank = later[0] if later else None

    def action_toggle_follow(self) -> None:
        self.follow = not self.follow

    def action_follow_end(self) -> None:
        self.follow = True

    def action_top(self) -> None:
        self.follow = False
        self.scroll_home(animate=False)

    def action_search(self) -> None:
        self.post_message(self.SearchRequested())

    def action_next_match(self) -> None:
        self.follow = False
        self._goto_match(self._match_at + 1)

    def action_prev_match(self) -> None:
        self.follow = False
        self._goto_match(self._match_at - 1)

    def on_mouse_scroll_up(self, event: object) -> None:
        self.follow = False

    def action_scroll_up(self) -> None:
        self.follow = False
        super().action_scroll_up()

    def action_page_up(self) -> None:
        self.follow = False
        super().action_page_up()
