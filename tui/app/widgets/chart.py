"""A line chart with real axes: braille dots for the curve, ticks and labels on both axes.

Drawn with the Line API: the lines are computed once per (data version, size, theme) and
``render_line`` hands them out. Many more points than dot columns are folded per column into
their min and max, so a noisy loss reads as a band, not as aliasing.

Several series share the axes (``render_series``: the sweeps' objective curves): each is drawn
in its own style, and a cell that two of them pass through takes the style of the first (the
series are given most important first).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

_PLAIN = Style()

# Braille dot bits, by (column in the cell, row in the cell).
_DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))


def nice_step(span: float, target_ticks: int, integer: bool = False) -> float:
    """A 1/2/2.5/5 x 10^n step that cuts ``span`` into about ``target_ticks`` pieces;
    ``integer``: a whole number (no 2.5 for an axis of trial numbers)."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(1, target_ticks)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        step = m * mag
        if integer and step != int(step):
            continue
        if raw <= step:
            return step
    return 10 * mag


def ticks(
    lo: float, hi: float, target: int, min_step: float = 0.0
) -> tuple[float, float, list[float]]:
    """Axis bounds widened to whole steps, and the tick values between them; ``min_step``: no
    finer step than that (1 for an axis of whole numbers, such as trial numbers)."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = max(nice_step(hi - lo, target, integer=min_step >= 1), min_step)
    start = math.floor(lo / step + 1e-9) * step
    end = math.ceil(hi / step - 1e-9) * step
    values: list[float] = []
    v = start
    while v <= end + step * 1e-6 and len(values) < 200:
        values.append(round(v, 12))
        v += step
    return start, end, values


def fmt_tick(v: float, step: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or (abs(v) < 1e-3):
        return f"{v:.1e}"
    decimals = max(0, -int(math.floor(math.log10(step)))) if step < 1 else 0
    while decimals < 6 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6:
        decimals += 1  # a 2.5 step: 0.25, 0.50, not 0.2, 0.5
    return f"{v:.{decimals}f}"


def render_chart(
    points: Sequence[tuple[float, float]],
    width: int,
    height: int,
    *,
    x_max: float | None = None,
    axis: Style = _PLAIN,
    line: Style = _PLAIN,
    empty: str = "no data yet",
) -> list[Strip]:
    """The chart of one series as ``height`` strips of ``width`` cells."""
    return render_series([points], width, height, x_max=x_max, axis=axis, lines=[line], empty=empty)


def render_series(
    series: Sequence[Sequence[tuple[float, float]]],
    width: int,
    height: int,
    *,
    x_max: float | None = None,
    x_min_step: float = 0.0,
    axis: Style = _PLAIN,
    lines: Sequence[Style] = (),
    empty: str = "no data yet",
    steps: bool = False,
) -> list[Strip]:
    """Several series on shared axes as ``height`` strips of ``width`` cells; series ``i`` is
    drawn in ``lines[i]`` (the last style for any beyond them), the first on top. ``steps``:
    each value holds until the next point (across, then down or up), as a best-so-far does."""
    if width < 12 or height < 4:
        return [Strip.blank(width)] * height
    series = [s for s in series if s]
    if not series:
        return _empty_chart(width, height, empty, axis)
    frame = _frame(series, width, height, x_max, x_min_step)
    if frame is None:
        return [Strip.blank(width)] * height
    grids = [
        (_step_dots if steps else _dots)(s, frame.to_dx, frame.to_dy, frame.plot_w, frame.plot_h)
        for s in series
    ]
    styles = [
        (lines[min(i, len(lines) - 1)] if lines else _PLAIN) for i in range(len(series))
    ]
    strips = _plot_strips(frame, grids, styles, axis, width) + _x_axis_strips(frame, axis, width)
    return [s.adjust_cell_length(width) for s in strips]


def _empty_chart(width: int, height: int, empty: str, axis: Style) -> list[Strip]:
    """A chart with nothing to draw: blank, with ``empty`` centred on the middle row."""
    lines_out = [Strip.blank(width)] * height
    msg = empty[:width]
    pad = (width - len(msg)) // 2
    lines_out = list(lines_out)
    lines_out[height // 2] = Strip(
        [Segment(" " * pad), Segment(msg, axis), Segment(" " * (width - pad - len(msg)))]
    )
    return lines_out


@dataclass(frozen=True)
class _Frame:
    """Where a chart's plot sits and what its axes span: computed once from all the series,
    then shared by the curves, the y tick rows and the x axis."""

    plot_w: int  # cells of the plot area, right of the y labels and their axis column
    plot_h: int  # rows of the plot area, above the x axis and its labels
    label_w: int  # width of the y labels
    x_lo: float
    x_hi: float
    y_lo: float
    y_hi: float
    x_ticks: list[float]
    y_ticks: list[float]
    y_labels: list[str]

    def to_dx(self, x: float) -> int:
        dots_w = self.plot_w * 2
        return min(dots_w - 1, max(0, int(round((x - self.x_lo) / (self.x_hi - self.x_lo) * (dots_w - 1)))))

    def to_dy(self, y: float) -> int:  # 0 at the top
        dots_h = self.plot_h * 4
        return min(dots_h - 1, max(0, int(round((self.y_hi - y) / (self.y_hi - self.y_lo) * (dots_h - 1)))))


def _frame(
    series: Sequence[Sequence[tuple[float, float]]],
    width: int,
    height: int,
    x_max: float | None,
    x_min_step: float,
) -> _Frame | None:
    """The axes' bounds and ticks for these (non-empty) series, the y labels' width fixing the
    plot's; None when the labels leave too little room for a plot."""
    xs = [float(p[0]) for s in series for p in s]
    ys = [float(p[1]) for s in series for p in s if math.isfinite(p[1])]
    if not ys:
        ys = [0.0]
    plot_h = height - 2
    y_lo, y_hi, y_ticks = ticks(min(ys), max(ys), max(2, plot_h // 3))
    y_step = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else 1.0
    y_labels = [fmt_tick(v, y_step) for v in y_ticks]
    label_w = max(len(s) for s in y_labels)
    plot_w = width - label_w - 2  # the axis column, and a margin on the right
    if plot_w < 4:
        return None
    x_lo = min(xs)
    x_hi = max(max(xs), x_max if x_max is not None else max(xs))
    x_lo_t, x_hi_t, x_ticks = ticks(
        x_lo, x_hi if x_hi > x_lo else x_lo + 1, max(2, plot_w // 12), x_min_step
    )
    return _Frame(plot_w=plot_w, plot_h=plot_h, label_w=label_w, x_lo=x_lo_t, x_hi=x_hi_t,
                  y_lo=y_lo, y_hi=y_hi, x_ticks=x_ticks, y_ticks=y_ticks, y_labels=y_labels)


def _plot_strips(
    frame: _Frame, grids: Sequence[list[list[int]]], styles: Sequence[Style], axis: Style, width: int
) -> list[Strip]:
    """The plot's rows: a y label where a tick falls (the first tick of a row wins), the y
    axis, and the series' dots."""
    tick_rows: dict[int, str] = {}
    for v, label in zip(frame.y_ticks, frame.y_labels, strict=True):
        row = frame.to_dy(v) // 4
        tick_rows.setdefault(row, label)

    strips = []
    for r in range(frame.plot_h):
        tick = tick_rows.get(r)
        segs = [
            Segment((tick or "").rjust(frame.label_w), axis),
            Segment("┤" if tick is not None else "│", axis),
        ]
        segs.extend(_row_segments([g[r] for g in grids], styles, frame.plot_w))
        segs.append(Segment(" "))
        strips.append(Strip(segs, width))
    return strips


def _x_axis_strips(frame: _Frame, axis: Style, width: int) -> list[Strip]:
    """The x axis with its tick marks, and the row of its labels: a label that would overlap
    the one before it is left out."""
    plot_w, label_w = frame.plot_w, frame.label_w
    axis_chars = ["─"] * plot_w
    label_chars = [" "] * (plot_w + 2)
    x_ticks = frame.x_ticks
    x_step = x_ticks[1] - x_ticks[0] if len(x_ticks) > 1 else 1.0
    last_end = -1
    for v in x_ticks:
        col = frame.to_dx(v) // 2
        if 0 <= col < plot_w:
            axis_chars[col] = "┬"
            text = fmt_tick(v, x_step) if x_step >= 1 else f"{v:g}"
            start = max(0, min(col - len(text) // 2, plot_w + 2 - len(text)))
            if start > last_end:
                label_chars[start : start + len(text)] = list(text)
                last_end = start + len(text)
    return [
        Strip([Segment(" " * label_w + "└", axis), Segment("".join(axis_chars) + " ", axis)], width),
        Strip(
            [Segment(" " * (label_w + 1), axis), Segment("".join(label_chars)[: plot_w + 1], axis)],
            width,
        ),
    ]


def _dots(
    points: Sequence[tuple[float, float]],
    to_dx: Callable[[float], int],
    to_dy: Callable[[float], int],
    plot_w: int,
    plot_h: int,
) -> list[list[int]]:
    """One series as braille dot bits per cell: the points folded per dot column into (min,
    max), the columns connected."""
    grid = [[0] * plot_w for _ in range(plot_h)]

    def plot(dx: int, dy: int) -> None:
        grid[dy // 4][dx // 2] |= _DOTS[dx % 2][dy % 4]

    cols: dict[int, list[int]] = {}
    for x, y in points:
        if not math.isfinite(y):
            continue
        dx, dy = to_dx(float(x)), to_dy(float(y))
        c = cols.get(dx)
        if c is None:
            cols[dx] = [dy, dy, dy]  # min, max, last
        else:
            c[0], c[1], c[2] = min(c[0], dy), max(c[1], dy), dy
    prev: tuple[int, int] | None = None
    for dx in sorted(cols):
        lo_dy, hi_dy, last = cols[dx]
        for dy in range(lo_dy, hi_dy + 1):
            plot(dx, dy)
        if prev is not None:
            _segment(prev[0], prev[1], dx, last if lo_dy == hi_dy else (lo_dy + hi_dy) // 2, plot)
        prev = (dx, last)
    return grid


def _step_dots(
    points: Sequence[tuple[float, float]],
    to_dx: Callable[[float], int],
    to_dy: Callable[[float], int],
    plot_w: int,
    plot_h: int,
) -> list[list[int]]:
    """One series as a step line: from each point across to the next one's x, then to its y."""
    grid = [[0] * plot_w for _ in range(plot_h)]

    def plot(dx: int, dy: int) -> None:
        grid[dy // 4][dx // 2] |= _DOTS[dx % 2][dy % 4]

    prev: tuple[int, int] | None = None
    for x, y in points:
        if not math.isfinite(y):
            continue
        dx, dy = to_dx(float(x)), to_dy(float(y))
        if prev is None:
            plot(dx, dy)
        else:
            for cx in range(prev[0], dx + 1):
                plot(cx, prev[1])
            for cy in range(min(prev[1], dy), max(prev[1], dy) + 1):
                plot(dx, cy)
        prev = (dx, dy)
    return grid


def _row_segments(rows: Sequence[list[int]], styles: Sequence[Style], width: int) -> list[Segment]:
    """One row of cells of several series: the dots of all, each cell in the style of the first
    series with a dot there; runs of one style as one segment."""
    if len(rows) == 1:
        return [Segment("".join(chr(0x2800 + b) if b else " " for b in rows[0]), styles[0])]
    out: list[Segment] = []
    run: list[str] = []
    run_style: Style | None = None
    for c in range(width):
        bits = 0
        style = None
        for row, st in zip(rows, styles, strict=True):
            b = row[c]
            if b:
                bits |= b
                if style is None:
                    style = st
        ch = chr(0x2800 + bits) if bits else " "
        st = style if style is not None else _PLAIN
        if run and st != run_style:
            out.append(Segment("".join(run), run_style))
            run = []
        run.append(ch)
        run_style = st
    if run:
        out.append(Segment("".join(run), run_style))
    return out


def _segment(x0: int, y0: int, x1: int, y1: int, plot: object) -> None:
    """Bresenham between two dots."""
    dx, dy = abs(x1 - x0), -abs(y1 - y0)
    sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
    err = dx + dy
    while True:
        plot(x0, y0)  # type: ignore[operator]
        if x0 == x1 and y0 == y1:
            return
        e2 = 2 * err
        if e2 >= dy:
            err += dy
            x0 += sx
        if e2 <= dx:
            err += dx
            y0 += sy


LINE_CLASSES = ("chart--line", "chart--line-2", "chart--line-3", "chart--line-4")
LINE_VARS = ("$accent", "$success", "$primary-lighten-2", "$foreground")  # their colours, for legends


class LossChart(Widget):
    """Loss over steps, or several series on shared axes (``set_series``). Given with a
    version; it redraws only when that changes."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"chart--axis", *LINE_CLASSES}
    DEFAULT_CSS = (
        "LossChart { height: 1fr; min-height: 6; }\n"
        "LossChart > .chart--axis { color: $text-muted; }\n"
        + "".join(f"LossChart > .{c} {{ color: {v}; }}\n" for c, v in zip(LINE_CLASSES, LINE_VARS, strict=True))
    )

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._series: tuple[tuple[tuple[float, float], ...], ...] = ()
        self._version: object = None
        self._x_max: float | None = None
        self._x_min_step = 0.0
        self._steps = False
        self._empty = "waiting for the first loss"
        self._cache_key: object = None
        self._lines: list[Strip] = []

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, lambda _t: self._invalidate())

    def _invalidate(self) -> None:
        self._cache_key = None
        self.refresh()

    def set_points(
        self,
        points: Sequence[tuple[float, float]],
        version: object,
        *,
        x_max: float | None = None,
        empty: str | None = None,
    ) -> None:
        self.set_series([points], version, x_max=x_max, empty=empty)

    def set_series(
        self,
        series: Sequence[Sequence[tuple[float, float]]],
        version: object,
        *,
        x_max: float | None = None,
        x_min_step: float = 0.0,
        steps: bool = False,
        empty: str | None = None,
    ) -> None:
        """Up to four series (most important first: drawn on top, in ``chart--line``, then
        ``chart--line-2`` ...); ``steps``: drawn as steps (``render_series``)."""
        if (
            version == self._version
            and x_max == self._x_max
            and x_min_step == self._x_min_step
            and steps == self._steps
            and (empty is None or empty == self._empty)
        ):
            return
        self._series = tuple(tuple(s) for s in series)
        self._version = version
        self._x_max = x_max
        self._x_min_step = x_min_step
        self._steps = steps
        if empty is not None:
            self._empty = empty
        self._invalidate()

    @property
    def points(self) -> tuple[tuple[float, float], ...]:
        """The first series."""
        return self._series[0] if self._series else ()

    @property
    def series(self) -> tuple[tuple[tuple[float, float], ...], ...]:
        return self._series

    def _render_lines(self, size: Size) -> list[Strip]:
        key = (self._version, size, self._x_max, self._x_min_step, self._steps, self._empty)
        if key != self._cache_key:
            self._lines = render_series(
                self._series,
                size.width,
                size.height,
                x_max=self._x_max,
                x_min_step=self._x_min_step,
                steps=self._steps,
                axis=self.get_component_rich_style("chart--axis", partial=True),
                lines=[self.get_component_rich_style(c, partial=True) for c in LINE_CLASSES],
                empty=self._empty,
            )
            self._cache_key = key
        return self._lines

    def render_line(self, y: int) -> Strip:
        lines = self._render_lines(self.size)
        if 0 <= y < len(lines):
            return lines[y].apply_style(self.rich_style)
        return Strip.blank(self.size.width, self.rich_style)
