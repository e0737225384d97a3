"""A line chart with real axes: braille dots for the curve, ticks and labels on both axes.

Drawn with the Line API: the lines are computed once per (data version, size, theme) and
``render_line`` hands them out. Many more points than dot columns are folded per column into
their min and max, so a noisy loss reads as a band, not as aliasing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget

_PLAIN = Style()

# Braille dot bits, by (column in the cell, row in the cell).
_DOTS = ((0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80))


def nice_step(span: float, target_ticks: int) -> float:
    """A 1/2/5 x 10^n step that cuts ``span`` into about ``target_ticks`` pieces."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / max(1, target_ticks)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def ticks(lo: float, hi: float, target: int) -> tuple[float, float, list[float]]:
    """Axis bounds widened to whole steps, and the tick values between them."""
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    step = nice_step(hi - lo, target)
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
    """The chart as ``height`` strips of ``width`` cells."""
    if width < 12 or height < 4:
        return [Strip.blank(width)] * height
    if not points:
        lines = [Strip.blank(width)] * height
        msg = empty[:width]
        pad = (width - len(msg)) // 2
        lines = list(lines)
        lines[height // 2] = Strip(
            [Segment(" " * pad), Segment(msg, axis), Segment(" " * (width - pad - len(msg)))]
        )
        return lines

    xs = [float(p[0]) for p in points]
    ys = [float(p[1]) for p in points if math.isfinite(p[1])]
    if not ys:
        ys = [0.0]
    plot_h = height - 2
    y_lo, y_hi, y_ticks = ticks(min(ys), max(ys), max(2, plot_h // 3))
    y_step = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else 1.0
    y_labels = [fmt_tick(v, y_step) for v in y_ticks]
    label_w = max(len(s) for s in y_labels)
    plot_w = width - label_w - 2  # the axis column, and a margin on the right
    if plot_w < 4:
        return [Strip.blank(width)] * height
    x_lo = min(xs)
    x_hi = max(max(xs), x_max if x_max is not None else max(xs))
    x_lo_t, x_hi_t, x_ticks = ticks(x_lo, x_hi if x_hi > x_lo else x_lo + 1, max(2, plot_w // 12))
    x_lo, x_hi = x_lo_t, x_hi_t

    dots_w, dots_h = plot_w * 2, plot_h * 4
    grid = [[0] * plot_w for _ in range(plot_h)]

    def to_dx(x: float) -> int:
        return min(dots_w - 1, max(0, int(round((x - x_lo) / (x_hi - x_lo) * (dots_w - 1)))))

    def to_dy(y: float) -> int:  # 0 at the top
        return min(dots_h - 1, max(0, int(round((y_hi - y) / (y_hi - y_lo) * (dots_h - 1)))))

    def plot(dx: int, dy: int) -> None:
        grid[dy // 4][dx // 2] |= _DOTS[dx % 2][dy % 4]

    # Fold the points per dot column into (min, max), then connect the columns.
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

    # y tick rows
    tick_rows: dict[int, str] = {}
    for v, label in zip(y_ticks, y_labels, strict=True):
        row = to_dy(v) // 4
        tick_rows.setdefault(row, label)

    strips = []
    for r in range(plot_h):
        tick = tick_rows.get(r)
        segs = [
            Segment((tick or "").rjust(label_w), axis),
            Segment("┤" if tick is not None else "│", axis),
        ]
        run = "".join(chr(0x2800 + b) if b else " " for b in grid[r])
        segs.append(Segment(run, line))
        segs.append(Segment(" "))
        strips.append(Strip(segs, width))

    # x axis and its labels
    axis_chars = ["─"] * plot_w
    label_chars = [" "] * (plot_w + 2)
    x_step = x_ticks[1] - x_ticks[0] if len(x_ticks) > 1 else 1.0
    last_end = -1
    for v in x_ticks:
        col = to_dx(v) // 2
        if 0 <= col < plot_w:
            axis_chars[col] = "┬"
            text = fmt_tick(v, x_step) if x_step >= 1 else f"{v:g}"
            start = max(0, min(col - len(text) // 2, plot_w + 2 - len(text)))
            if start > last_end:
                label_chars[start : start + len(text)] = list(text)
                last_end = start + len(text)
    strips.append(
        Strip([Segment(" " * label_w + "└", axis), Segment("".join(axis_chars) + " ", axis)], width)
    )
    strips.append(
        Strip(
            [Segment(" " * (label_w + 1), axis), Segment("".join(label_chars)[: plot_w + 1], axis)],
            width,
        )
    )
    return [s.adjust_cell_length(width) for s in strips]


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


class LossChart(Widget):
    """Loss over steps. ``set_points`` with a version; it redraws only when that changes."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"chart--axis", "chart--line"}
    DEFAULT_CSS = """
    LossChart { height: 1fr; min-height: 6; }
    LossChart > .chart--axis { color: $text-muted; }
    LossChart > .chart--line { color: $accent; }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._points: tuple[tuple[float, float], ...] = ()
        self._version: object = None
        self._x_max: float | None = None
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
        if (
            version == self._version
            and x_max == self._x_max
            and (empty is None or empty == self._empty)
        ):
            return
        self._points = tuple(points)
        self._version = version
        self._x_max = x_max
        if empty is not None:
            self._empty = empty
        self._invalidate()

    @property
    def points(self) -> tuple[tuple[float, float], ...]:
        return self._points

    def _render_lines(self, size: Size) -> list[Strip]:
        key = (self._version, size, self._x_max, self._empty)
        if key != self._cache_key:
            self._lines = render_chart(
                self._points,
                size.width,
                size.height,
                x_max=self._x_max,
                axis=self.get_component_rich_style("chart--axis", partial=True),
                line=self.get_component_rich_style("chart--line", partial=True),
                empty=self._empty,
            )
            self._cache_key = key
        return self._lines

    def render_line(self, y: int) -> Strip:
        lines = self._render_lines(self.size)
        if 0 <= y < len(lines):
            return lines[y].apply_style(self.rich_style)
        return Strip.blank(self.size.width, self.rich_style)
