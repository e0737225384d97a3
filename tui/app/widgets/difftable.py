"""A DataTable updated by diff, as dolphie does it.

Every row has a stable key (host name, GPU uuid, job id, rank). ``apply`` takes the rows wanted
now, in the order wanted, each as a tuple of raw (hashable) values, one per column:

- rows whose key is gone are removed (in one pass, not one O(n) removal each);
- new rows are added;
- for rows already there only the cells whose raw value changed are rendered and stored;
- the rows are reordered only when the wanted order differs from the shown one.

All of it counts as one update of the table (one refresh), and the cursor stays on the row it
was on. The bulk steps reach into DataTable's row bookkeeping (``_data``, ``_row_locations``),
mirroring what its own ``update_cell``, ``remove_row`` and ``sort`` do one at a time, and the
drawing overrides some of its private methods (rows drawn from a cache of cells, one line each).

Those are Textual's internals: each table checks them when it is made (``_fast_needs``, through
``tui/app/textualpatch.py``). Where one is not as expected (another Textual), the log says so
once and the table keeps DataTable's own ways: it draws, orders and measures the rows itself,
and ``apply`` changes them through its public methods (a changed cell by ``update_cell``, any
other change by filling the table again). Slower with many rows, the same rows on screen.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from rich.cells import cell_len
from rich.console import RenderableType
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.coordinate import Coordinate
from textual.geometry import Region, Size
from textual.render import measure
from textual.strip import Strip
from textual.widgets import DataTable
from textual.widgets.data_table import CellKey, ColumnKey, DuplicateKey, Row, RowKey

from tui.app.textualpatch import Check, Need, Probe, usable
from tui.app.widgets.format import LEVELS, Palette, merge_runs

_palette_serial = 0
SEG_CACHE = 1024  # rendered cells kept (a 200x60 screen of GPUs shows about 500)
# Rows diffed beyond those in view on each update, either side. Any other row is brought up to
# date when it is drawn (scrolled into view), so more would be work for rows nobody sees: in a
# sorted view the cursor's row, and so the view, moves every second.
MARGIN = 2


@dataclass(frozen=True)
class Col:
    key: str
    label: str
    width: int | None = None  # None: as wide as its widest cell


class LazyCell:
    """A cell's raw value; rendered (by its table's ``render_cell``) only when something draws
    it, so the rows scrolled out of view cost a comparison, not a rendering."""

    __slots__ = ("table", "column", "raw", "_text")

    def __init__(self, table: DiffTable, column: str, raw: Any):
        self.table = table
        self.column = column
        self.raw = raw
        self._text: RenderableType | None = None

    @property
    def text(self) -> RenderableType:
        if self._text is None:
            self._text = self.table.render_cell(self.column, self.raw, self.table.palette)
        return self._text

    @property
    def plain(self) -> str:
        t = self.text
        return t.plain if isinstance(t, Text) else str(t)

    def __rich__(self) -> RenderableType:
        return self.text

    def __str__(self) -> str:
        return self.plain

    def __repr__(self) -> str:
        return f"LazyCell({self.column}={self.raw!r})"


def _same_source(a: Any, b: Any) -> bool:
    """Whether a row's source is the one its values were made from: the same object, or a tuple
    of the same objects (sources made afresh on each call from unchanged parts)."""
    if a is b:
        return True
    if type(a) is tuple and type(b) is tuple and len(a) == len(b):
        return all(x is y for x, y in zip(a, b, strict=True))
    return False


def cell_segments(
    cell: RenderableType, console: Any, pad: int, inner: int, pre: Style, post: Style
) -> list[Segment]:
    """A cell as segments ``inner + 2 * pad`` wide: rendered by rich, cut to fit, padded, and
    styled between the row's style (``pre``) and the cursor's (``post``)."""
    if isinstance(cell, Text):
        text = cell
        if text.cell_len > inner:
            text = cell.copy()
            text.truncate(inner, overflow="ellipsis" if cell.overflow == "ellipsis" else "crop")
        segments = list(text.render(console))
        if text.style:
            segments = list(Segment.apply_style(segments, console.get_style(text.style)))
    else:
        options = console.options.update_dimensions(inner, 1).update(no_wrap=True)
        segments = console.render_lines(cell, options, pad=False)[0]
    segments = Segment.adjust_line_length(segments, inner)
    if pad:
        segments = [Segment(" " * pad), *segments, Segment(" " * pad)]
    return list(Segment.simplify(Segment.apply_style(segments, style=pre, post_style=post)))


def _plain_segments(
    cell: RenderableType, console: Any, pad: int, inner: int, pre: Style, post: Style
) -> list[Segment] | None:
    """``cell_segments`` of a one-style Text that fits its cell, made directly (the same
    segments at a fraction of the cost), or None for anything else."""
    if not isinstance(cell, Text):
        return None
    if cell.spans:
        return _spanned_segments(cell, console, pad, inner, pre, post)
    plain = cell.plain
    if "\n" in plain or "\t" in plain:
        return None
    length = cell.cell_len
    if length > inner:
        return None
    base = pre + post
    style = cell.style
    if style:
        own = console.get_style(style) if isinstance(style, str) else style
        styled = pre + own + post
    else:
        styled = base
    if not plain:
        return [Segment(" " * (inner + 2 * pad), base)] if inner + 2 * pad else []
    if styled == base:
        return [Segment(" " * pad + plain + " " * (inner - length + pad), base)]
    out = []
    if pad:
        out.append(Segment(" " * pad, base))
    out.append(Segment(plain, styled))
    if inner - length + pad:
        out.append(Segment(" " * (inner - length + pad), base))
    return out


def _spanned_segments(
    cell: Text, console: Any, pad: int, inner: int, pre: Style, post: Style
) -> list[Segment] | None:
    """``cell_segments`` of a Text whose spans do not overlap (a bar: its filled part, its
    track, its label), made directly; None for anything else (overlapping spans, a tab, a
    newline, a text wider than its cell), which rich renders."""
    plain = cell.plain
    if "\n" in plain or "\t" in plain or cell.cell_len > inner:
        return None
    get = console.get_style
    own = cell.style
    base_style = (get(own) if isinstance(own, str) else own) if own else Style.null()
    end = len(plain)
    pieces: list[tuple[str, Style]] = []
    pos = 0
    for span in sorted(cell.spans, key=lambda sp: sp.start):
        start, stop = span.start, span.end
        if start < pos or stop > end or start >= stop:
            return None
        if start > pos:
            pieces.append((plain[pos:start], base_style))
        style = span.style
        pieces.append((plain[start:stop], base_style + (get(style) if isinstance(style, str) else style)))
        pos = stop
    if pos < end:
        pieces.append((plain[pos:], base_style))
    blank = pre + post
    out: list[Segment] = [Segment(" " * pad, blank)] if pad else []
    for text, style in pieces:
        out.append(Segment(text, pre + style + post))
    fill = inner - cell.cell_len + pad
    if fill:
        out.append(Segment(" " * fill, blank))
    return list(Segment.simplify(out))


def _header_sees(location: Coordinate, cursor_type: str) -> Any:
    """What of a cursor's (or hover's) place the header line's look depends on, as DataTable
    highlights cells: the header is row -1, so a row cursor matters only there, a column
    cursor by its column, a cell cursor only on the header itself."""
    if cursor_type == "row":
        return location.row == -1
    if cursor_type == "column":
        return location.column
    if cursor_type == "cell":
        return location if location.row == -1 else None
    return None


class _Line(list[Segment]):
    """A body row's segments and their width in cells (known as it is made, not measured)."""

    cells = 0


@dataclass(frozen=True)
class _FrameValues:
    """What drawing a frame's lines reads from the table, read once for the frame."""

    width: int
    scroll: Any
    header: int
    simple: bool  # one-line rows, row cursor, no fixed rows or columns, no row labels
    show_cursor: bool
    show_hover: bool
    cursor: Coordinate
    hover: Coordinate
    # Each column's drawn width: measured when the table is idle, after rows came, so a frame
    # drawn between new rows and their measure has other widths than the next one.
    widths: tuple[int, ...] = ()


class _RowPlaces:
    """DataTable's row key <-> row index map (its ``_row_locations``: the methods it calls on
    its ``TwoWayDict``), made from the rows in order: a list for index -> key (it is the order)
    and a dict the other way, without the per-row Python a ``TwoWayDict`` built from a dict
    costs. Not a ``TwoWayDict`` itself: that class's module is private to Textual."""

    def __init__(self, keys: list[RowKey]) -> None:
        self._keys = keys
        self._made: dict[RowKey, int] | None = None

    def _forward(self) -> dict[RowKey, int]:
        """Key -> index, made when first asked (drawing a frame reads the order by index
        only; a key's index is asked for when the cursor or a cell is looked up by key)."""
        if self._made is None:
            self._made = dict(zip(self._keys, range(len(self._keys)), strict=True))
        return self._made

    def get(self, key: RowKey) -> int | None:
        return self._forward().get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._forward()

    def __iter__(self) -> Iterator[RowKey]:
        return iter(self._keys)

    def __setitem__(self, key: RowKey, value: int) -> None:
        if value != len(self._keys) or key in self._forward():  # only appends come here
            raise ValueError("rows are only appended to a table's order")
        self._forward()[key] = value
        self._keys.append(key)

    def __delitem__(self, key: RowKey) -> None:
        raise ValueError("rows leave a table's order by a new order")

    def __len__(self) -> int:
        return len(self._keys)

    def get_key(self, value: int) -> RowKey | None:
        keys = self._keys
        return keys[value] if 0 <= value < len(keys) else None

    def contains_value(self, value: int) -> bool:
        return 0 <= value < len(self._keys)


class _OrderedRows(Sequence[Any]):
    """DataTable's ``ordered_rows`` as a view of the order, not a list of every row made again
    whenever the order changes."""

    def __init__(self, rows: dict[RowKey, Any], keys: list[RowKey]) -> None:
        self._rows, self._keys = rows, keys

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self._rows[k] for k in self._keys[i]]
        return self._rows[self._keys[i]]

    def __iter__(self) -> Any:
        rows = self._rows
        return (rows[k] for k in self._keys)


class _LineOffsets(Sequence[tuple[RowKey, int]]):
    """``_y_offsets`` for one-line rows: line ``y`` is row ``y``'s first line."""

    def __init__(self, keys: list[RowKey]) -> None:
        self._keys = keys

    def __len__(self) -> int:
        return len(self._keys)

    def __getitem__(self, y: Any) -> Any:
        if isinstance(y, slice):
            return [(k, 0) for k in self._keys[y]]
        return (self._keys[y], 0)

    def clear(self) -> None:
        """DataTable's ``clear`` empties its cached offsets; these are made from the order."""


@dataclass
class ApplyStats:
    added: int = 0
    removed: int = 0
    cells: int = 0
    reordered: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.added or self.removed or self.cells or self.reordered)


ADD_AT_ONCE = 200  # new rows added in one frame (beyond those in view); more in the next ones

FAST = "the tables' fast drawing and bulk updates (tui/app/widgets/difftable.py)"
# DataTable's private methods DiffTable overrides or calls, with their parameters: drawn, ordered
# and measured by them, a row is one line.
_METHODS = {
    "_render_line_in_row": ("self", "row_key", "line_no", "base_style", "cursor_location", "hover_location"),
    "_render_line": ("self", "y", "x1", "x2", "base_style"),
    "_on_click": ("self", "event"),
    "_on_mouse_move": ("self", "event"),
    "_get_row_region": ("self", "row_index"),
    "_update_dimensions": ("self", "new_rows"),
    "_get_styles_to_render_cell": (
        "self", "is_header_cell", "is_row_label_cell", "is_fixed_style_cell", "hover", "cursor",
        "show_cursor", "show_hover_cursor", "has_css_foreground_priority", "has_css_background_priority",
    ),
    "_get_row_style": ("self", "row_index", "base_style"),
    "_highlight_cursor": ("self",),
    "_post_selected_message": ("self",),
    "_scroll_cursor_into_view": ("self", "animate"),
    "_set_hover_cursor": ("self", "active"),
}
_PROPERTIES = ("_y_offsets", "_total_row_height", "_row_label_column_width")  # overridden or read
# What DataTable's __init__ sets that DiffTable reads or writes (its row bookkeeping, caches' keys).
_STATE = (
    "_data", "_row_locations", "_new_rows", "_update_count", "_require_update_dimensions",
    "_updated_cells", "_labelled_row_exists", "_header_row_key", "_pseudo_class_state", "_show_hover_cursor",
)
_ROW_FIELDS = ["key", "height", "label", "auto_height"]  # how _add_rows makes a Row


def _fast_needs(table: DataTable[Any]) -> list[Check]:
    """What the fast paths rely on in DataTable, checked on a table just made."""
    needs: list[Check] = [Need(DataTable, name, params) for name, params in _METHODS.items()]
    needs += [Need(DataTable, name) for name in _PROPERTIES]
    needs += [Need(table, name) for name in _STATE]
    needs.append(Probe(f"DataTable's Row has the fields {_ROW_FIELDS}",
                       lambda: [f.name for f in fields(Row)] == _ROW_FIELDS))
    return needs


class DiffTable(DataTable[RenderableType]):
    """Subclasses give ``render_cell(column_key, raw, palette)``."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {f"rd--{lvl}" for lvl in LEVELS}
    DEFAULT_CSS = """
    DiffTable > .rd--ok { color: $success; }
    DiffTable > .rd--warn { color: $warning; }
    DiffTable > .rd--crit { color: $error; text-style: bold; }
    DiffTable > .rd--muted { color: $text-muted; }
    DiffTable > .rd--dim { color: $text-disabled; }
    DiffTable > .rd--accent { color: $accent; }
    DiffTable > .rd--strong { text-style: bold; }
    DiffTable > .rd--bar-empty { color: $surface-lighten-2; }
    """

    # Set before DataTable.__init__ runs (it clears the table, which bumps the order version).
    _order_version = 0
    _ordered_rows: list[Any] = []
    _ordered_rows_for: tuple[int, int] | None = None
    _offsets: list[tuple[RowKey, int]] = []
    _offsets_for: tuple[int, int] | None = None
    _frame_values: _FrameValues | None = None
    _drawing_row: tuple[RowKey, int] | None = None  # the row ``_render_line`` is drawing
    # Whether DataTable's internals are as the fast paths expect (``_fast_needs``): set once
    # DataTable.__init__ has run; until then, and where they are not, DataTable's own ways.
    _fast_paths = False

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes, cursor_type="row", zebra_stripes=True)
        self._cols: tuple[Col, ...] = ()
        self._column_keys: tuple[str, ...] = ()
        self._auto: frozenset[str] = frozenset()
        self._raw: dict[str, tuple[Any, ...]] = {}
        self._order: list[str] = []
        self._palette: Palette | None = None
        # Rendered cells and rows that survive table updates (DataTable's own caches do not).
        # Least recently used first, at most SEG_CACHE cells: values that recur (every idle
        # GPU's "0%", common temperatures) stay; one-off ones (a sparkline) leave a few at a time
        # as new ones come, rather than piling up for the garbage collector to walk again and
        # again and then all going in one stall.
        self._seg_cache: OrderedDict[tuple[str, Any, int, int], list[Segment]] = OrderedDict()
        # A row's (style, cursor style) pair as a small number: the cell cache's keys hold it
        # rather than the two Styles (hashing them was most of a cache lookup's cost).
        self._looks: dict[tuple[Style, Style], int] = {}
        self._rows_rendered: dict[str, tuple[Any, Any, Any, Any]] = {}
        # The header line as DataTable renders it, kept across table updates (DataTable's own
        # cache is forgotten with every tick's update): (what it was drawn from, the line).
        self._header_drawn: tuple[Any, Any] | None = None
        self._frame: Any = None
        self._frame_styles: dict[tuple[int, bool, bool], tuple[Style, Style, int]] = {}
        self._widths: tuple[int, ...] = ()
        self._line_style: Style | None = None
        self._src: dict[str, Any] = {}  # key -> the source its row comes from (apply_sources)
        self._source_of: Callable[[str], Any] | None = None  # key -> its row's source now
        self._raw_src: dict[str, Any] = {}  # key -> the source its raw values were made from
        self._applied = 0  # applies so far: rows left for later are added only if none came since
        self._make_raw: Callable[[Any], tuple[Any, ...]] | None = None
        self._strips: dict[int, tuple[Any, Any, Strip]] = {}
        self._row_keys: dict[str, RowKey] = {}
        self._fast_paths = usable(FAST, _fast_needs(self))

    # -- palette ----------------------------------------------------------------------------

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._theme_changed)

    def _theme_changed(self, _theme: object) -> None:
        self._palette = None
        self._seg_cache.clear()
        self._looks.clear()
        self._header_drawn = None
        if not self._fast_paths:  # DataTable keeps the old colours' lines: every row made anew
            self._refill(list(self._order), dict(self._raw).__getitem__, dict(self._raw_src).get)
            return
        for row in self._data.values():  # every cell renders again in the new colours
            for cell in row.values():
                if isinstance(cell, LazyCell):
                    cell._text = None
        self._update_count += 1
        self.refresh()

    @property
    def palette(self) -> Palette:
        if self._palette is None:
            global _palette_serial
            _palette_serial += 1
            styles = {
                lvl: self.get_component_rich_style(f"rd--{lvl}", partial=True) for lvl in LEVELS
            }
            self._palette = Palette(_palette_serial, styles)
        return self._palette

    # -- rendering --------------------------------------------------------------------------

    def _segments(
        self, column: str, raw: Any, width: int, pre: Style, post: Style, look: int
    ) -> list[Segment]:
        """A cell as padded segments exactly ``width`` wide, styled for its row (``look``
        numbers its ``pre`` and ``post`` styles), cached by value and look: equal values in
        different rows (every idle GPU's "0%") render once."""
        key = (column, raw, width, look)
        cache = self._seg_cache
        hit = cache.get(key)
        if hit is not None:
            cache.move_to_end(key)
            return hit
        cell = self.render_cell(column, raw, self.palette)
        console = self.app.console
        pad = self.cell_padding
        inner = max(0, width - 2 * pad)
        segments = _plain_segments(cell, console, pad, inner, pre, post)
        if segments is None:
            segments = cell_segments(cell, console, pad, inner, pre, post)
        cache[key] = segments
        if len(cache) > SEG_CACHE:
            cache.popitem(last=False)
        return segments

    def _render_line_in_row(
        self,
        row_key: RowKey,
        line_no: int,
        base_style: Style,
        cursor_location: Any,
        hover_location: Any,
    ) -> Any:
        """DataTable's row rendering, minus its cost.

        DataTable renders every cell of a row through Padding and Console.render_lines, and
        forgets every rendered row on any update of the table. Here cells render from their raw
        values (cached by value) only when a row is drawn, and a row is rebuilt only when its
        values, position or look changed. The result is the same: padded cells, cell styles
        between the row style and the cursor/hover style, and the row extended to the widget's
        width; clicks find their row from the mouse position rather than segment meta.
        """
        if not self._fast_paths:
            return super()._render_line_in_row(row_key, line_no, base_style, cursor_location, hover_location)
        if row_key is self._header_row_key:
            return self._header_line(row_key, line_no, base_style, cursor_location, hover_location)
        key = row_key.value
        raw = self.current_raw(key) if key is not None else None
        at = self._drawing_row
        if at is not None and at[0] is row_key:
            row_index: int | None = at[1]
        else:
            row_index = self._row_locations.get(row_key) if row_key in self._row_locations else None
        fv = self._frame_values or self._read_frame_values()
        if raw is None or key is None or row_index is None or line_no != 0 or not fv.simple:
            return super()._render_line_in_row(
                row_key, line_no, base_style, cursor_location, hover_location
            )
        cursor = fv.show_cursor and cursor_location.row == row_index
        hover = fv.show_hover and hover_location.row == row_index
        frame = (
            base_style,
            self._pseudo_class_state,
            fv.width,
            fv.show_cursor,
            self._palette,
            fv.widths,
        )
        if frame != self._frame:
            self._frame = frame
            self._frame_styles.clear()
            self._widths = fv.widths
        look = (row_index, cursor, hover)
        hit = self._rows_rendered.get(key)
        if hit is not None and hit[0] == look and hit[1] is raw and hit[2] is frame:
            return hit[3]
        styles = self._frame_styles.get((row_index % 2, cursor, hover))
        if styles is None:
            component_style, post_style = self._get_styles_to_render_cell(
                False,
                False,
                False,
                hover,
                cursor,
                self.show_cursor,
                self._show_hover_cursor,
                self.cursor_foreground_priority == "css",
                self.cursor_background_priority == "css",
            )
            row_style = self._get_row_style(row_index, base_style)
            pre = row_style + component_style
            if len(self._looks) > 64:  # looks come and go (focus, theme): start afresh
                self._looks.clear()
                self._seg_cache.clear()
                self._frame_styles.clear()
            styles_id = self._looks.setdefault((pre, post_style), len(self._looks))
            styles = (pre, post_style, styles_id)
            self._frame_styles[(row_index % 2, cursor, hover)] = styles
        pre, post_style, styles_id = styles
        cells: list[Segment] = []
        widths = self._widths
        segments_of = self._segments
        for column, value, width in zip(self._column_keys, raw, widths, strict=True):
            cells += segments_of(column, value, width, pre, post_style, styles_id)
        remaining = max(0, fv.width - sum(widths) - self._row_label_column_width)
        cells.append(Segment(" " * remaining, pre))
        # Neighbouring cells' padding shares a style: one segment each, a third fewer for every
        # later step of the frame (the screen's filters, the compositor's cuts, the encoding).
        line = _Line(merge_runs(cells))
        line.cells = sum(widths) + remaining
        # No row/column meta on body segments (a new Style per segment and row, the biggest cost
        # of drawing a row): clicks and hovers find their row from the mouse position instead.
        pair: tuple[list[Any], list[list[Segment]]] = ([], [line])
        self._rows_rendered[key] = (look, raw, frame, pair)
        return pair

    def _header_line(
        self,
        row_key: RowKey,
        line_no: int,
        base_style: Style,
        cursor_location: Any,
        hover_location: Any,
    ) -> Any:
        """The header line as DataTable draws it, drawn again only when what it is drawn from
        changed (its columns' labels and widths, the cursors, the widget's look), not on every
        tick's update of the table's cells."""
        columns = tuple(
            (c.key, c.label.plain, c.label.style, tuple(c.label.spans), c.get_render_width(self))
            for c in self.ordered_columns
        )
        cursor_type = self.cursor_type
        made_from = (
            line_no,
            base_style,
            _header_sees(cursor_location, cursor_type),
            _header_sees(hover_location, cursor_type),
            cursor_type,
            self.show_cursor,
            self._show_hover_cursor,
            self._pseudo_class_state,
            self.fixed_columns,
            self._labelled_row_exists and self.show_row_labels,
            self.get_component_styles("datatable--header").rich_style,
            self.zebra_stripes,
            self.size.width,
            self._row_label_column_width,
            columns,
        )
        drawn = self._header_drawn
        if drawn is not None and drawn[0] == made_from:
            return drawn[1]

        # DataTable's own caches are keyed by its update count, not by the columns' widths, and
        # its idle pass widens columns without counting an update: drawn now from them, a line
        # of the old widths would be kept here under the new ones for good. Counting one makes
        # DataTable draw the header afresh.
        self._update_count += 1
        line = super()._render_line_in_row(
            row_key, line_no, base_style, cursor_location, hover_location
        )
        self._header_drawn = (made_from, line)
        return line

    def _read_frame_values(self) -> _FrameValues:
        return _FrameValues(
            width=self.size.width,
            scroll=self.scroll_offset,
            header=self.header_height if self.show_header else 0,
            simple=not (
                self.fixed_columns
                or self.fixed_rows
                or self.cursor_type != "row"
                or (self._labelled_row_exists and self.show_row_labels)
            ),
            show_cursor=self.show_cursor,
            show_hover=self._show_hover_cursor,
            cursor=self.cursor_coordinate,
            hover=self.hover_coordinate,
            widths=tuple(c.get_render_width(self) for c in self.ordered_columns),
        )

    def render_lines(self, crop: Any) -> list[Strip]:
        # DataTable asks for its (costly) rich_style, and the widget's size, scroll position and
        # cursors (reactive attributes, each read costs) for every line; once a frame is enough.
        if not self._fast_paths:
            return super().render_lines(crop)
        self._line_style = self.rich_style
        self._frame_values = fv = self._read_frame_values()
        try:
            return super().render_lines(crop)
        finally:
            self._frame_values = None
            self._forget_far_rows(fv.scroll[1], self.size.height)

    def _forget_far_rows(self, top: int, height: int) -> None:
        """Drop the drawn rows and lines kept for rows more than a screen away from the view.

        They would be drawn again only when scrolled back into view, and by then their values
        or positions have mostly changed (a sorted view moves every second); kept, a table of
        thousands of rows ends up holding a line for each, and those long-lived objects are
        what the collector's full passes walk (``tui/app/collector.py``)."""
        keep = 3 * height + 2 * MARGIN
        if len(self._strips) <= keep and len(self._rows_rendered) <= keep:
            return
        lo, hi = max(0, top - height), top + 2 * height
        self._strips = {i: v for i, v in self._strips.items() if lo <= i < hi}
        near = set()
        get_key = self._row_locations.get_key
        for i in range(lo, min(hi, len(self._row_locations))):
            row_key = get_key(i)
            if row_key is not None:
                near.add(row_key.value)
        self._rows_rendered = {k: v for k, v in self._rows_rendered.items() if k in near}

    def render_line(self, y: int) -> Strip:
        fv = self._frame_values
        if fv is None or self.fixed_rows or self._line_style is None:
            return super().render_line(y)
        scroll_x, scroll_y = fv.scroll
        if y >= fv.header:
            y += scroll_y
        return self._render_line(y, scroll_x, scroll_x + fv.width, self._line_style)

    def _render_line(self, y: int, x1: int, x2: int, base_style: Style) -> Strip:
        """A body line from the row cache; header lines and anything unusual as DataTable does."""
        if not self._fast_paths:
            return super()._render_line(y, x1, x2, base_style)
        fv = self._frame_values or self._read_frame_values()
        row_index = y - fv.header
        if y < fv.header or not fv.simple or not (0 <= row_index < len(self._row_locations)):
            return super()._render_line(y, x1, x2, base_style)
        row_key = self._row_locations.get_key(row_index)
        if row_key is None:
            return super()._render_line(y, x1, x2, base_style)
        self._drawing_row = (row_key, row_index)
        try:
            _fixed, scrollable = self._render_line_in_row(
                row_key,
                0,
                base_style,
                cursor_location=fv.cursor,
                hover_location=fv.hover,
            )
        finally:
            self._drawing_row = None
        if len(scrollable) != 1:  # DataTable rendered this row itself
            return super()._render_line(y, x1, x2, base_style)
        line = scrollable[0]
        width = fv.width
        hit = self._strips.get(row_index)
        if hit is not None and hit[0] is line and hit[1] == (x1, x2, width, base_style):
            return hit[2]
        cells = line.cells if isinstance(line, _Line) else Segment.get_line_length(line)
        strip = Strip(line, cells)
        if x1 or x2 < width:
            strip = strip.crop(x1, x2)
        strip = strip.adjust_cell_length(width, base_style)
        self._strips[row_index] = (scrollable[0], (x1, x2, width, base_style), strip)
        return strip

    def _row_at(self, event: events.MouseEvent) -> int | None:
        """The body row under the mouse (rows are one line high), or None."""
        y = event.y - (self.header_height if self.show_header else 0)
        if y < 0 or event.x >= self.size.width:
            return None
        row = int(self.scroll_y) + y
        return row if 0 <= row < self.row_count else None

    async def _on_click(self, event: events.Click) -> None:
        if not self._fast_paths or "row" in event.style.meta or self.cursor_type != "row":
            await super()._on_click(event)  # the header, or DataTable's own cells
            return
        row = self._row_at(event)
        if row is None or not self.show_cursor:
            return
        self._set_hover_cursor(True)
        highlight_click = row == self.cursor_coordinate.row
        self.cursor_coordinate = Coordinate(row, 0)
        if highlight_click:
            self._post_selected_message()
        self._scroll_cursor_into_view(animate=True)
        event.stop()

    def _on_mouse_move(self, event: events.MouseMove) -> None:
        if not self._fast_paths or "row" in event.style.meta or self.cursor_type != "row":
            super()._on_mouse_move(event)
            return
        row = self._row_at(event)
        if row is None:
            self._set_hover_cursor(False)
            return
        self._set_hover_cursor(True)
        if self.show_cursor:
            self.hover_coordinate = Coordinate(row, 0)

    # -- row order --------------------------------------------------------------------------
    # DataTable recomputes its ordered rows and line offsets (a walk over every row) whenever
    # any cell changes, that is on every tick here. They only change with the rows' order.

    def _order_changed(self) -> None:
        self._order_version += 1

    def add_row(self, *cells: Any, **kwargs: Any) -> RowKey:
        self._order_changed()
        return super().add_row(*cells, **kwargs)

    def remove_row(self, row_key: RowKey | str) -> None:
        self._order_changed()
        super().remove_row(row_key)

    def clear(self, columns: bool = False) -> DiffTable:
        self._order_changed()
        self._applied += 1  # rows left for later: not any more
        super().clear(columns)
        return self

    def sort(self, *columns: Any, key: Any = None, reverse: bool = False) -> DiffTable:
        self._order_changed()
        super().sort(*columns, key=key, reverse=reverse)
        return self

    def _own_order(self) -> _RowPlaces | None:
        """The row order as ``_set_order`` made it, while it still is the table's (DataTable
        itself rebuilds ``_row_locations`` in ``sort`` and ``remove_row``)."""
        places: object = self._row_locations
        if isinstance(places, _RowPlaces) and len(places._keys) == self.row_count:
            return places
        return None

    @property
    def ordered_rows(self) -> Sequence[Any]:  # type: ignore[override]
        if not self._fast_paths:
            return super().ordered_rows
        places = self._own_order()
        if places is not None:
            return _OrderedRows(self.rows, places._keys)
        version = (self.row_count, self._order_version)
        if self._ordered_rows_for != version:
            rows, key_at = self.rows, self._row_locations.get_key
            self._ordered_rows = [rows[key_at(i)] for i in range(self.row_count)]  # type: ignore[index]
            self._ordered_rows_for = version
        return self._ordered_rows

    @property
    def _y_offsets(self) -> Sequence[tuple[RowKey, int]]:  # type: ignore[override]
        if not self._fast_paths:
            return super()._y_offsets
        places = self._own_order()
        if places is not None:  # every row is one line (DiffTable adds no other)
            return _LineOffsets(places._keys)
        version = (self.row_count, self._order_version)
        if self._offsets_for != version:
            self._offsets = [(row.key, y) for row in self.ordered_rows for y in range(row.height)]
            self._offsets_for = version
        return self._offsets

    def _get_row_region(self, row_index: int) -> Region:
        """DataTable's, with a row's top read from its index (rows are one line each) rather
        than summed over every row above it."""
        if not self._fast_paths or self._own_order() is None or not self.is_valid_row_index(row_index):
            return super()._get_row_region(row_index)
        row_width = (
            sum(column.get_render_width(self) for column in self.columns.values())
            + self._row_label_column_width
        )
        y = row_index + (self.header_height if self.show_header else 0)
        return Region(0, y, max(self.size.width, row_width), 1)

    # -- columns ----------------------------------------------------------------------------

    def set_columns(self, cols: Sequence[Col]) -> bool:
        """Define the columns; when they change, the rows go (the next ``apply`` adds them)."""
        cols = tuple(cols)
        if cols == self._cols:
            return False
        self.clear(columns=True)
        self._raw_src.clear()
        self._src.clear()
        self._source_of = None
        self._seg_cache.clear()
        self._looks.clear()
        self._rows_rendered.clear()
        self._frame = None
        self._raw.clear()
        self._order = []
        self._cols = cols
        self._column_keys = tuple(c.key for c in cols)
        self._auto = frozenset(c.key for c in cols if c.width is None)
        for c in cols:
            self.add_column(Text(c.label), key=c.key, width=c.width)
        return True

    @property
    def column_keys(self) -> tuple[str, ...]:
        return self._column_keys

    @property
    def _auto_columns(self) -> frozenset[str]:
        return self._auto

    def columns_for(self, w: Any) -> list[Col]:
        """The columns for a terminal width (``tui.app.widgets.tables.Widths``)."""
        return list(self._cols)

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        return Text("" if raw is None else str(raw))

    # -- rows -------------------------------------------------------------------------------

    @property
    def cursor_key(self) -> str | None:
        if not self._order or self.cursor_row < 0 or self.cursor_row >= len(self._order):
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:  # CellDoesNotExist while rows change
            return None

    def raw(self, key: str) -> tuple[Any, ...] | None:
        return self.current_raw(key)

    def apply(self, rows: Sequence[tuple[str, tuple[Any, ...]]]) -> ApplyStats:
        """Show ``rows`` (key, raw values) in this order, changing only what differs."""
        self._make_raw = None
        self._source_of = None
        self._src.clear()
        return self._apply([k for k, _ in rows], dict(rows).__getitem__, self._src.get, whole=True)

    def apply_sources(
        self,
        entries: Sequence[tuple[str, Any]],
        make_raw: Callable[[Any], tuple[Any, ...]],
        margin: int | None = None,
    ) -> ApplyStats:
        """Like ``apply``, for big tables: ``entries`` are (key, source) and ``make_raw(source)``
        gives a row's raw values. Only rows near the viewport (and new rows) are diffed now; the
        others keep their source and are brought up to date when they are drawn (scrolled into
        view), so a tick costs O(rows) dictionary work plus O(visible rows) diffing."""
        self._make_raw = make_raw
        src = self._src
        src.clear()
        src.update(entries)
        self._source_of = src.get
        return self._apply([k for k, _ in entries], lambda k: make_raw(src[k]), src.get, margin)

    def apply_keyed(
        self,
        wanted: list[str],
        source_of: Callable[[str], Any],
        make_raw: Callable[[Any], tuple[Any, ...]],
        margin: int | None = None,
    ) -> ApplyStats:
        """Like ``apply_sources`` with the sources found by ``source_of(key)``, when they are
        needed (rows in the window, new rows, rows scrolled into view), rather than listed:
        with the order kept by the caller, a tick makes no per-row list."""
        self._make_raw = make_raw
        self._source_of = source_of
        self._src.clear()
        return self._apply(wanted, lambda k: make_raw(source_of(k)), source_of, margin)

    def refresh_sources(
        self,
        source_of: Callable[[str], Any],
        make_raw: Callable[[Any], tuple[Any, ...]],
        margin: int | None = None,
    ) -> ApplyStats:
        """Like ``apply_sources`` when the rows and their order are as they were: only their
        sources changed, and ``source_of(key)`` finds a row's source when it is needed. A tick
        then costs O(visible rows), whatever the table's size."""
        self._make_raw = make_raw
        self._source_of = source_of
        self._src.clear()
        if not self._fast_paths:
            return self._apply_plain(list(self._order), lambda k: make_raw(source_of(k)), source_of)
        stats = ApplyStats()
        lo, hi = self._window(margin)
        order = self._order
        for i in range(max(0, lo), min(len(order), hi)):
            key = order[i]
            src = source_of(key)
            stats.cells += self._update_row(key, make_raw(src), src)
        if stats.changed:
            self._update_count += 1
            self.refresh()
        return stats

    def _window(self, margin: int | None) -> tuple[int, int]:
        """The rows diffed at once: those in view and ``margin`` more either side."""
        page = max(1, self.size.height)
        margin = MARGIN if margin is None else margin
        top = int(self.scroll_y)
        return (top - margin, top + page + margin)

    def _apply(
        self,
        wanted: list[str],
        raw_of: Callable[[str], tuple[Any, ...]],
        source_of: Callable[[str], Any],
        margin: int | None = None,
        whole: bool = False,
    ) -> ApplyStats:
        """Show ``wanted``: every row diffed (``whole``) or those in view and ``margin`` more
        either side (``_window``), once the cursor has followed its row."""
        # Which rows go and which come are set operations, and the order a list comparison: a
        # tick over thousands of rows walks them in C; Python code runs per row in the window
        # and per row added or removed.
        if not self._fast_paths:
            return self._apply_plain(wanted, raw_of, source_of)
        self._applied += 1
        stats = ApplyStats()
        wanted_set = set(wanted)
        cursor_key = self.cursor_key
        stale = self._raw.keys() - wanted_set
        if stale:
            self._remove_rows(stale)
            stats.removed = len(stale)
        new = wanted_set - self._raw.keys()
        later: set[str] = set()
        if new:
            adding = [key for key in wanted if key in new]
            if len(adding) > ADD_AT_ONCE:
                adding, later = self._rows_now(wanted, new, self._window(margin))
            self._add_rows(adding, raw_of, source_of)
            stats.added = len(adding)
        shown = [k for k in wanted if k not in later] if later else wanted
        if self._order != shown:
            self._set_order(shown)
            stats.reordered = True
        self._follow_cursor(stats, cursor_key, shown)
        lo, hi = (0, len(shown)) if whole else self._window(margin)
        for i in range(max(0, lo), min(len(shown), hi)):
            key = shown[i]
            if key not in new:
                stats.cells += self._update_row(key, raw_of(key), source_of(key))
        if stats.changed:
            self._update_count += 1
            if stats.removed or stats.added:
                self.refresh(layout=True)
            else:
                self.refresh()
        if later:
            self.call_after_refresh(self._add_later, self._applied, wanted, raw_of, source_of)
        return stats

    def _apply_plain(
        self,
        wanted: list[str],
        raw_of: Callable[[str], tuple[Any, ...]],
        source_of: Callable[[str], Any],
    ) -> ApplyStats:
        """``_apply`` by DataTable's public methods alone (its internals are not as the fast
        paths expect): every row diffed, a changed cell stored by ``update_cell``, and rows
        added, removed or moved by filling the table again (``_refill``)."""
        self._applied += 1
        shown, wanted_set = set(self._raw), set(wanted)
        stats = ApplyStats(added=len(wanted_set - shown), removed=len(shown - wanted_set))
        if wanted != self._order:
            kept_before = [k for k in self._order if k in wanted_set]
            stats.reordered = kept_before != [k for k in wanted if k in shown]
            self._refill(wanted, raw_of, source_of)
            return stats
        for key in wanted:
            stats.cells += self._update_row(key, raw_of(key), source_of(key))
        return stats

    def _refill(
        self,
        order: list[str],
        raw_of: Callable[[str], tuple[Any, ...]],
        source_of: Callable[[str], Any],
    ) -> None:
        """Clear the table and add the rows ``order`` names with DataTable's ``add_row``, one at
        a time, the cursor kept on its row: ``rebuild``, and any change of rows where the fast
        paths are off."""
        cursor_key = self.cursor_key
        self.clear()
        self._raw.clear()
        self._raw_src.clear()
        self._order = []
        for key in order:
            values = raw_of(key)
            self.add_row(*self._cells_for(values), key=key)
            self._order.append(key)
            self._raw[key] = values
            self._raw_src[key] = source_of(key)
        if cursor_key is not None and cursor_key in self._raw:
            self.move_cursor(row=self._order.index(cursor_key), animate=False, scroll=False)

    def _rows_now(
        self, wanted: list[str], new: set[str], window: tuple[int, int] | None
    ) -> tuple[list[str], set[str]]:
        """Of many new rows (a filter letting hundreds back in), those to add now: every one
        down to the bottom of the window (so the rows in view are all there, in place) and
        others up to ``ADD_AT_ONCE``; the rest are added over the next frames."""
        bottom = (window or self._window(None))[1]
        now = [key for key in wanted[: max(0, bottom)] if key in new]
        for key in wanted[max(0, bottom):]:
            if len(now) >= ADD_AT_ONCE:
                break
            if key in new:
                now.append(key)
        return now, new.difference(now)

    def _add_later(
        self,
        applied: int,
        wanted: list[str],
        raw_of: Callable[[str], tuple[Any, ...]],
        source_of: Callable[[str], Any],
    ) -> None:
        """The rows ``_apply`` left for later (the next ``ADD_AT_ONCE``), unless the table
        was applied (or cleared) since: that apply saw them missing and took them on."""
        if applied == self._applied and self.is_attached:
            self._apply(wanted, raw_of, source_of)

    def _follow_cursor(self, stats: ApplyStats, cursor_key: str | None, shown: list[str]) -> None:
        """The cursor follows its row to where the new order put it, before the rows in view are
        diffed (DataTable scrolls it into view): the rows diffed are those the next frame shows,
        not those shown before the move."""
        if cursor_key is not None and (stats.removed or stats.reordered) and cursor_key in self._raw:
            self.move_cursor(row=shown.index(cursor_key), animate=False, scroll=False)
        elif stats.removed:
            self.cursor_coordinate = self.cursor_coordinate  # clamps to the rows left

    def _add_rows(
        self,
        keys: list[str],
        raw_of: Callable[[str], tuple[Any, ...]],
        source_of: Callable[[str], Any],
    ) -> None:
        """Append rows ``keys``, as ``add_row`` does one at a time, in one pass: DataTable's
        ``add_row`` lists the columns twice and sets (and so validates and watches) the cursor
        for each row, ~0.2 ms a row: a filter that lets a thousand GPUs back in stalled the
        frame for it."""
        column_keys = [c.key for c in self.ordered_columns]
        places, data, rows, fresh = self._row_locations, self._data, self.rows, self._new_rows
        was_empty = self.row_count == 0
        for key in keys:
            values = raw_of(key)
            rk = self._row_key(key)
            if rk in rows:
                raise DuplicateKey(f"The row key {rk!r} already exists.")
            places[rk] = len(rows)
            data[rk] = dict(zip(column_keys, self._cells_for(values), strict=True))
            rows[rk] = Row(rk, 1, None, False)
            fresh.add(rk)
            self._order.append(key)
            self._raw[key] = values
            self._raw_src[key] = source_of(key)
        self._require_update_dimensions = True
        self._order_changed()
        self.cursor_coordinate = self.cursor_coordinate  # clamped to the rows there are now
        if was_empty and self.row_count and self.columns and self.show_cursor and self.cursor_type != "none":
            self._highlight_cursor()  # a cursor where there was none: DataTable says so
        self._update_count += 1
        self.check_idle()

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        """DataTable's, measuring only what decides a width: the new rows' cells in the
        columns as wide as their widest cell (DataTable renders and measures every cell of
        every new row, the raw values of fixed-width columns too). Rows here are one line."""
        new_rows = list(new_rows)
        rows = self.rows
        if not self._fast_paths or any(
            r is not None and (r.label is not None or r.auto_height) for r in map(rows.get, new_rows)
        ):
            super()._update_dimensions(new_rows)  # rows that are not this class's own
            return
        auto = [c for c in self.ordered_columns if c.key.value in self._auto]
        data = self._data
        for row_key in new_rows:
            row = data.get(row_key)
            if row is None:  # removed before the table was idle
                continue
            for column in auto:
                cell = row.get(column.key)
                if not isinstance(cell, LazyCell):  # not this class's cell: DataTable measures
                    super()._update_dimensions(new_rows)
                    return
                text = cell.text
                if isinstance(text, Text):
                    width = max(map(cell_len, text.plain.split("\n")))
                else:
                    width = measure(self.app.console, text, 1)
                if width > column.content_width:
                    column.content_width = width
        width = sum(c.get_render_width(self) for c in self.columns.values())
        header = self.header_height if self.show_header else 0
        self.virtual_size = Size(width + self._row_label_column_width, self._total_row_height + header)

    def _remove_rows(self, stale: set[str]) -> None:
        cols = self.column_keys
        data = self._data
        updated = self._updated_cells
        for k in stale:
            rk = self._row_key(k)
            if updated:  # cells changed since the table was last idle (rarely any)
                for ck in cols:
                    updated.discard(CellKey(rk, ColumnKey(ck)))
            del self.rows[rk]
            del data[rk]
            del self._raw[k]
            self._raw_src.pop(k, None)
            self._rows_rendered.pop(k, None)
            self._row_keys.pop(k, None)
        self._set_order([k for k in self._order if k not in stale])
        self._require_update_dimensions = True

    def _row_key(self, key: str) -> RowKey:
        """The row's ``RowKey``, made once (the order of thousands of rows is rebuilt from
        them)."""
        rk = self._row_keys.get(key)
        if rk is None:
            rk = self._row_keys[key] = RowKey(key)
        return rk

    def _set_order(self, order: list[str]) -> None:
        self._order = list(order)  # its own: rows added later are appended to it
        try:
            keys = list(map(self._row_keys.__getitem__, order))
        except KeyError:  # a row added otherwise than by ``_apply``
            keys = [self._row_key(k) for k in order]
        # Not the TwoWayDict DataTable declares, but what it calls on one (see _RowPlaces).
        self._row_locations = _RowPlaces(keys)  # type: ignore[assignment]
        self._order_changed()

    def _cells_for(self, values: tuple[Any, ...]) -> list[Any]:
        """What DataTable stores for a row: the raw values themselves (this class draws them),
        except in auto-width columns, which DataTable measures, and everywhere when DataTable
        draws the rows (the fast paths off): there a LazyCell renders them."""
        lazy = self._auto if self._fast_paths else frozenset(self._column_keys)
        return [
            LazyCell(self, c, v) if c in lazy else v
            for c, v in zip(self._column_keys, values, strict=True)
        ]

    def cell_text(self, key: str, column: str) -> str:
        """A cell as the table shows it, as plain text."""
        raw = self.current_raw(key)
        if raw is None:
            raise KeyError(key)
        cell = self.render_cell(column, raw[self._column_keys.index(column)], self.palette)
        return cell.plain if isinstance(cell, Text) else str(cell)

    def _update_row(self, key: str, values: tuple[Any, ...], src: Any = None) -> int:
        """Store the cells of one row that changed (made from ``src``); returns how many."""
        old = self._raw[key]
        self._raw_src[key] = src
        if old == values:
            return 0
        if not self._fast_paths:
            return self._update_cells(key, old, values)
        row = self._data[self._row_key(key)]
        if len(old) != len(values):
            old = (object(),) * len(values)
        changed = 0
        for c, o, v in zip(self.column_keys, old, values, strict=True):
            if o != v:
                row[c] = LazyCell(self, c, v) if c in self._auto else v  # type: ignore[index]
                changed += 1
                if c in self._auto_columns:  # DataTable measures the column again when idle
                    self._updated_cells.add(CellKey(RowKey(key), ColumnKey(c)))
                    self._require_update_dimensions = True
        self._raw[key] = values
        return changed

    def _update_cells(self, key: str, old: tuple[Any, ...], values: tuple[Any, ...]) -> int:
        """``_update_row`` by DataTable's ``update_cell``, which also measures an auto-width
        column again (the fast paths off)."""
        if len(old) != len(values):
            old = (object(),) * len(values)
        changed = 0
        for c, o, v in zip(self._column_keys, old, values, strict=True):
            if o != v:
                self.update_cell(key, c, LazyCell(self, c, v), update_width=c in self._auto)
                changed += 1
        self._raw[key] = values
        return changed

    def current_raw(self, key: str) -> tuple[Any, ...] | None:
        """A row's raw values, brought up to date first if it was left for later."""
        source_of, make_raw = self._source_of, self._make_raw
        if source_of is None or make_raw is None or key not in self._raw:
            return self._raw.get(key)
        src = source_of(key)
        if src is not None and not _same_source(self._raw_src.get(key), src):
            self._update_row(key, make_raw(src), src)
        return self._raw.get(key)

    def rebuild(self, rows: Sequence[tuple[str, tuple[Any, ...]]]) -> None:
        """The naive way (clear, then add every row): the benchmark's baseline."""
        self._src.clear()
        self._source_of = None
        self._make_raw = None
        self._refill([k for k, _ in rows], dict(rows).__getitem__, self._src.get)
