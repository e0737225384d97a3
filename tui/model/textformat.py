"""Plain text for numbers the faces show: sizes, durations, losses, step rates, and the mark of a
simulated GPU.

The CLI prints these as they are; the app's cells (``tui.app.widgets.format``) start from them
and add style. Plain strings only, so the CLI never needs the app to format a number.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

SIM_MARK = " sim"  # follows a label whose GPUs are simulated, wherever one is shown


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


def simulated_text(label: str, simulated: bool) -> str:
    """``label``, followed by "sim" when the GPUs behind it are simulated: the one marker for the
    tables, the job view and ``rigdeck status``, so none can forget it."""
    return label + SIM_MARK if simulated else label


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


def placement_text(placement: Sequence[Mapping[str, Any]]) -> str:
    """``h1[0,1] sim h2[0,1]``: every node of the placement, simulated ones marked."""
    parts = placement_parts(placement)
    return " ".join(simulated_text(label, sim) for label, sim in parts) if parts else "-"
