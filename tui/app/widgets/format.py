"""Cell rendering shared by the panels: bars, levels, sparklines, durations and sizes.

Colours are never named here. A ``Palette`` maps level names to Rich styles that a widget reads
from its component classes, which the stylesheet sets from theme variables (``$success``,
``$warning``, ``$error``, ...). Rendered cells are cached by (value, width, palette), so a
thousand GPUs whose values repeat cost a dictionary lookup each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from rich.style import Style
from rich.text import Text

LEVELS = ("ok", "warn", "crit", "muted", "accent", "bar-empty", "dim", "strong")

# Where a value stops being light and becomes heavy (nvitop's thresholds), and hot temperatures.
UTIL_THRESHOLDS = (10.0, 75.0)
MEM_THRESHOLDS = (10.0, 80.0)
TEMP_THRESHOLDS = (70.0, 85.0)
POWER_THRESHOLDS = (80.0, 95.0)  # percent of the limit

SPARK = "▁▂▃▄▅▆▇█"
EIGHTHS = " ▏▎▍▌▋▊▉"


@dataclass(frozen=True)
class Palette:
    """Level name -> style; ``key`` changes with the theme so cached cells follow it."""

    key: int
    styles: Mapping[str, Style]

    def __hash__(self) -> int:
        return self.key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Palette) and other.key == self.key

    def __getitem__(self, level: str) -> Style:
        return self.styles.get(level) or Style()


PLAIN = Palette(-1, {})


def level(value: float | None, thresholds: tuple[float, float]) -> str:
    if value is None:
        return "muted"
    lo, hi = thresholds
    if value >= hi:
        return "crit"
    if value >= lo:
        return "warn"
    return "ok"


def util_level(pct: float | None) -> str:
    """Busy is not bad for a GPU: idle reads muted, working green, saturated amber."""
    if pct is None:
        return "muted"
    lo, hi = UTIL_THRESHOLDS
    return "warn" if pct >= hi else ("ok" if pct >= lo else "muted")


def bar_text(fraction: float, width: int) -> str:
    """A horizontal bar of ``width`` cells with eighth-cell resolution (no padding)."""
    fraction = 0.0 if not math.isfinite(fraction) else min(1.0, max(0.0, fraction))
    eighths = round(fraction * width * 8)
    full, part = divmod(eighths, 8)
    return "█" * full + (EIGHTHS[part] if part and full < width else "")


@lru_cache(maxsize=2048)
def bar_cell(pct: float | None, width: int, lvl: str, label: str, palette: Palette) -> Text:
    """``███▍────  42%``: a bar in the level's colour, the rest of the track dim, then a label."""
    if pct is None:
        return Text("-", style=palette["muted"])
    filled = bar_text(pct / 100.0, width)
    text = Text(no_wrap=True, overflow="crop")
    text.append(filled, palette[lvl])
    text.append("─" * (width - len(filled)), palette["bar-empty"])
    text.append(label)
    return text


@lru_cache(maxsize=512)
def temp_cell(temp_c: float | None, palette: Palette) -> Text:
    if temp_c is None:
        return Text("-", style=palette["muted"])
    return Text(f"{temp_c:.0f}°C", style=palette[level(temp_c, TEMP_THRESHOLDS)])


@lru_cache(maxsize=2048)
def power_cell(power_w: float | None, limit_w: float | None, palette: Palette) -> Text:
    if power_w is None:
        return Text("-", style=palette["muted"])
    if not limit_w:
        return Text(f"{power_w:.0f}W")
    pct = 100.0 * power_w / limit_w
    text = Text(
        f"{power_w:.0f}", style=palette[level(pct, POWER_THRESHOLDS)] if pct >= 80 else Style()
    )
    text.append(f"/{limit_w:.0f}W", style=palette["muted"])
    return text


@lru_cache(maxsize=8192)
def size_mb(mb: float) -> str:
    """Memory in MiB as a short string: 812M, 12.3G, 80G."""
    if mb < 1000:
        return f"{mb:.0f}M"
    g = mb / 1024.0
    return f"{g:.1f}G" if g < 100 else f"{g:.0f}G"


def size_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    raise AssertionError("unreachable")


def rate_bytes(bps: float | None) -> str:
    return "-" if bps is None else f"{size_bytes(bps)}/s"


def duration(seconds: float | None) -> str:
    """3s, 4m05s, 2h03m, 3d04h."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 24:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def loss_text(loss: float | None) -> str:
    if loss is None:
        return "-"
    if not math.isfinite(loss):
        return str(loss)
    return f"{loss:.4g}" if abs(loss) < 1e5 else f"{loss:.3e}"


def step_rate_text(rate: float | None) -> str:
    if rate is None:
        return "-"
    if rate >= 10:
        return f"{rate:.0f}/s"
    if rate >= 1:
        return f"{rate:.1f}/s"
    return f"{rate * 60:.1f}/min"


SIM_MARK = " sim"  # follows a label whose GPUs are simulated, wherever one is shown


def marked_simulated(label: str, simulated: bool, palette: Palette = PLAIN) -> Text:
    """``label``, followed by a muted "sim" when the GPUs behind it are simulated: one marker
    for the tables, the job view and ``rigdeck status`` (``.plain``), so none can forget it."""
    t = Text(label, no_wrap=True)
    if simulated:
        t.append(SIM_MARK, style=palette["muted"])
    return t


def placement_parts(placement: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, bool], ...]:
    """(label, simulated) per node: ``h1[0,1]`` (GPUs), or ``h1×2`` (processes without GPUs,
    never marked: only a GPU is simulated)."""
    parts = []
    for n in placement:
        gpus = list(n.get("gpus") or [])
        if gpus:
            parts.append((f"{n.get('host')}[{','.join(str(g) for g in gpus)}]", bool(n.get("simulated"))))
        else:
            parts.append((f"{n.get('host')}×{n.get('slots')}", False))
    return tuple(parts)


def placement_cell(parts: Sequence[tuple[str, bool]], palette: Palette = PLAIN) -> Text:
    """``h1[0,1] sim h2[0,1]``: the nodes of ``placement_parts``, simulated ones marked."""
    if not parts:
        return Text("-", no_wrap=True, overflow="ellipsis")
    return Text(" ", no_wrap=True, overflow="ellipsis").join(
        marked_simulated(label, sim, palette) for label, sim in parts)


def placement_text(placement: Sequence[Mapping[str, Any]]) -> str:
    """``placement_cell`` as plain text."""
    return placement_cell(placement_parts(placement)).plain


def state_level(state: str) -> str:
    return {
        "up": "ok",
        "running": "ok",
        "succeeded": "ok",
        "exited": "ok",
        "done": "ok",
        "stale": "warn",
        "connecting": "muted",
        "starting": "warn",
        "stopping": "warn",
        "pending": "muted",
        "stopped": "muted",
        "writing": "warn",
        "down": "crit",
        "failed": "crit",
        "lost": "crit",
        "error": "crit",
        "completed": "ok",  # a sweep's trial, or the sweep
        "pruning": "warn",
        "cached": "accent",  # a pipeline step reused from an earlier run: not "succeeded" green
        "skipped": "dim",
        "waiting": "warn",  # a pipeline step's retry backoff
        "staging": "warn",  # a pipeline step's inputs being moved
    }.get(state, "muted")


@lru_cache(maxsize=1024)
def state_cell(state: str, palette: Palette, note: str = "") -> Text:
    text = Text(state, style=palette[state_level(state)])
    if note:
        text.append(note, style=palette["muted"])
    return text
