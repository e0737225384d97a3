"""The app's own frame timer: how long its UI thread is busy at a stretch.

Everything the app shows is made on one thread: the sampling step (``refresh_views``), each
frame Textual draws (layout, render, the compositor's update), and the garbage collector's
passes wherever they fall. A stretch longer than a frame at 30 fps (33 ms) is a frame the user
does not get. ``FrameTimer`` keeps each stretch's length for a minute and says the longest in
the last ten seconds and the last minute; with ``RIGDECK_FRAME_TIMER=1`` the summary line shows
them (``frames ≤12 ms 10s · ≤15 ms 60s (frame) · 0 slow``: the longest was a frame), where a
person or a script driving the app through tmux (``bench/ui_live.py``) reads them.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from textual.screen import Screen

FRAME_MS = 1000.0 / 30  # a frame at 30 fps: a longer stretch is a stall
WINDOW_S = 60.0
ENV = "RIGDECK_FRAME_TIMER"


class FrameTimer:
    """``note(ms)`` per stretch (or ``timed(fn)``); ``longest_ms(seconds)`` and ``slow(seconds)``
    read them back. ``clock``: monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._stretches: deque[tuple[float, float, str]] = deque()  # (when it ended, ms, kind)
        self._gc_start: float | None = None
        self.frames = 0

    def note(self, ms: float, kind: str = "frame") -> None:
        now = self.clock()
        if kind == "frame":
            self.frames += 1
        self._stretches.append((now, ms, kind))
        while self._stretches and self._stretches[0][0] < now - WINDOW_S:
            self._stretches.popleft()

    def timed(self, fn: Callable[[], Any], kind: str = "frame") -> Any:
        t0 = time.perf_counter()
        try:
            return fn()
        finally:
            self.note((time.perf_counter() - t0) * 1000.0, kind)

    def longest_ms(self, seconds: float = WINDOW_S) -> float:
        since = self.clock() - seconds
        return max((ms for t, ms, _ in self._stretches if t >= since), default=0.0)

    def slow(self, seconds: float = WINDOW_S, over_ms: float = FRAME_MS) -> int:
        since = self.clock() - seconds
        return sum(1 for t, ms, _ in self._stretches if t >= since and ms > over_ms)

    def longest_kind(self, seconds: float = WINDOW_S) -> str:
        """What the longest stretch was: ``frame``, ``refresh`` (a sampling step) or ``gc``."""
        since = self.clock() - seconds
        return max(((ms, kind) for t, ms, kind in self._stretches if t >= since), default=(0.0, ""))[1]

    def text(self) -> str:
        """The summary line's words: ``frames ≤12 ms 10s · ≤15 ms 60s (frame) · 0 slow``."""
        kind = self.longest_kind()
        return (
            f"frames ≤{self.longest_ms(10.0):.0f} ms 10s · ≤{self.longest_ms():.0f} ms 60s"
            + (f" ({kind})" if kind else "")
            + f" · {self.slow()} slow"
        )

    # -- the collector's passes ---------------------------------------------------------------

    def watch_collector(self) -> None:
        """Time every garbage collection too (a pass stalls whatever it falls in)."""
        if self._on_gc not in gc.callbacks:
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start is not None:
            self.note((time.perf_counter() - self._gc_start) * 1000.0, "gc")
            self._gc_start = None


class TimedScreen(Screen[None]):
    """The app's default screen, each of its updates (a frame: layout when needed, render,
    the compositor's output) timed by the app's ``frame_timer``."""

    def _on_timer_update(self) -> None:
        timer = getattr(self.app, "frame_timer", None)
        if timer is None:
            super()._on_timer_update()
        else:
            timer.timed(super()._on_timer_update)
