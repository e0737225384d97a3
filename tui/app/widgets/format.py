"""Cell rendering shared by the panels: bars, levels, sparklines, and styled durations, sizes and
marks (their plain text is ``tui.model.textformat``'s, which the CLI prints too).

Colours are never named here. A ``Palette`` maps level names to Rich styles that a widget reads
from its component classes, which the stylesheet sets from theme variables (``$success``,
``$warning``, ``$error``, ...). Rendered cells are cached by (value, width, palette), so a
thousand GPUs whose values repeat cost a dictionary lookup each.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from rich.segment import Segment
from rich.style import Style
from rich.text import Text

# The plain text of numbers and marks lives in the model, where the CLI reads it too; the panels
# import it from here with the styled cells built on it.
from tui.model.textformat import (  # noqa: F401  (re-exported for the panels)
    SIM_MARK,
    duration,
    loss_text,
    placement_parts,
    placement_text,
    rate_bytes,
    size_bytes,
    size_mb,
    step_rate_text,
)

LEVELS = ("ok", "warn", "crit", "muted", "accent", "bar-empty", "dim", "strong")

# Where a value stops being light and becomes heavy (nvitop's thresholds), and hot temperatures.
UTIL_THRESHOLDS = (10.0, 75.0)
MEM_THRESHOLDS = (10.0, 80.0)
TEMP_THRESHOLDS = (70.0, 85.0)
POWER_THRESHOLDS = (80.0, 95.0)  # percent of the limit

SPARK = "▁▂▃▄▅▆▇█"
EIGHTHS = " ▏▎▍▌▋▊▉"


def merge_runs(segments: Iterable[Segment]) -> list[Segment]:
    """Neighbouring segments of the same style object as one: rich's ``Segment.simplify``
    without comparing styles by value (two Python calls a pair). A row's or a map line's
    styles come from one palette, so equal styles are the same objects; two equal ones that
    are not stay two segments, which draw the same."""
    out: list[Segment] = []
    text: list[str] = []
    style: Style | None = None
    for seg in segments:
        if seg.style is not style or seg.control:
            if text:
                out.append(Segment("".join(text), style))
            if seg.control:
                out.append(seg)
                text, style = [], None
                continue
            text, style = [seg.text], seg.style
        else:
            text.append(seg.text)
    if text:
        out.append(Segment("".join(text), style))
    return out


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


def marked_simulated(label: str, simulated: bool, palette: Palette = PLAIN) -> Text:
    """``label``, followed by a muted "sim" when the GPUs behind it are simulated: one marker
    for the tables, the job view and ``rigdeck status`` (``.plain``), so none can forget it."""
    t = Text(label, no_wrap=True)
    if simulated:
        t.append(SIM_MARK, style=palette["muted"])
    return t


def placement_cell(parts: Sequence[tuple[str, bool]], palette: Palette = PLAIN) -> Text:
    """``h1[0,1] sim h2[0,1]``: the nodes of ``placement_parts``, simulated ones marked."""
    if not parts:
        return Text("-", no_wrap=True, overflow="ellipsis")
    return Text(" ", no_wrap=True, overflow="ellipsis").join(
        marked_simulated(label, sim, palette) for label, sim in parts)


# The one table of a state's look, for every thing the app shows a state of (a host, a job, a
# rank, a trial, a sweep, a pipeline and its steps, a pool): its palette level in tables, and,
# through LEVEL_MARKUP, its colour in the views' heads.
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
        "unknown": "warn",  # a live job whose hosts do not answer
        "completed": "ok",  # a sweep's trial, or the sweep
        "pruning": "warn",
        "cached": "accent",  # a pipeline step reused from an earlier run: not "succeeded" green
        "skipped": "dim",
        "waiting": "warn",  # a pipeline step's retry backoff
        "staging": "warn",  # a pipeline step's inputs being moved
    }.get(state, "muted")


# A palette level as the views' markup spells it (Textual's theme variables).
LEVEL_MARKUP = {"ok": "$success", "warn": "$warning", "crit": "$error", "muted": "$text-muted",
                "accent": "$accent", "dim": "$text-disabled", "strong": "$text"}


def state_markup(state: str) -> str:
    """The markup colour of ``state`` (``[$success]running[/]``): the tables' level for it."""
    return LEVEL_MARKUP.get(state_level(state), "$text-muted")


@lru_cache(maxsize=1024)
def state_cell(state: str, palette: Palette, note: str = "") -> Text:
    text = Text(state, style=palette[state_level(state)])
    if note:
        text.append(note, style=palette["muted"])
    return text
