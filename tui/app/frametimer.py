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
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TextIO

from textual.screen import Screen

from tui.app.textualpatch import Need, usable

FRAME_MS = 1000.0 / 30  # a frame at 30 fps: a longer stretch is a stall
WINDOW_S = 60.0
ENV = "RIGDECK_FRAME_TIMER"
LOG_ENV = "RIGDECK_FRAME_LOG"  # a file: every collector pass and every stretch over LOG_OVER_MS
LOG_OVER_MS = 20.0
TIMED = "the frame timer's frames (tui/app/frametimer.py)"


class FrameTimer:
    """``note(ms)`` per stretch (or ``timed(fn)``); ``longest_ms(seconds)`` and ``slow(seconds)``
    read them back. ``clock``: monotonic seconds."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        # (when it ended, ms, kind): read and written on the UI thread only
        self._stretches: deque[tuple[float, float, str]] = deque()
        # A collection's pass, from whatever thread it ran on (a reader's, or the UI thread's
        # own in the middle of reading the stretches): moved to the stretches by the UI thread.
        self._gc_passes: deque[tuple[float, float, str]] = deque()
        self._gc_start: float | None = None
        self.frames = 0
        self._log: TextIO | None = None
        self._where: Callable[[], str] = str

    def log_to(self, path: str, where: Callable[[], str]) -> None:
        """Write each collector pass (generation, ms, objects freed) and each stretch over
        ``LOG_OVER_MS`` (with ``where()``: the view it fell in) to ``path``, a line each: what a
        slow stretch was, for whoever tunes the app (``RIGDECK_FRAME_LOG``)."""
        self._log = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (closed in stop)
        self._where = where

    def _write(self, line: str) -> None:
        if self._log is not None:
            self._log.write(f"{time.monotonic():.3f} {line}\n")

    def note(self, ms: float, kind: str = "frame", cpu_ms: float | None = None) -> None:
        """A stretch of the UI thread that just ended (on the UI thread); ``cpu_ms``: the
        thread's own CPU time in it (the rest it waited: for the interpreter, held by another
        thread, or for a core)."""
        now = self.clock()
        if kind == "frame":
            self.frames += 1
        self._stretches.append((now, ms, kind))
        self._settle(now)
        if ms > LOG_OVER_MS and self._log is not None:
            cpu = f" (cpu {cpu_ms:.1f} ms)" if cpu_ms is not None else ""
            self._write(f"{kind} {ms:.1f} ms{cpu} in {self._where()}")

    def _settle(self, now: float) -> None:
        """Take in the collector's passes and forget what is over a minute old."""
        passes, stretches = self._gc_passes, self._stretches
        while passes:
            stretches.append(passes.popleft())
        while stretches and stretches[0][0] < now - WINDOW_S:
            stretches.popleft()

    def _recent(self, seconds: float) -> list[tuple[float, float, str]]:
        now = self.clock()
        self._settle(now)
        return [s for s in list(self._stretches) if s[0] >= now - seconds]

    def timed(self, fn: Callable[[], Any], kind: str = "frame") -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn()
        finally:
            self.note((time.perf_counter() - t0) * 1000.0, kind, (time.thread_time() - c0) * 1000.0)

    def longest_ms(self, seconds: float = WINDOW_S) -> float:
        return max((ms for _, ms, _ in self._recent(seconds)), default=0.0)

    def slow(self, seconds: float = WINDOW_S, over_ms: float = FRAME_MS) -> int:
        return sum(1 for _, ms, _ in self._recent(seconds) if ms > over_ms)

    def longest_kind(self, seconds: float = WINDOW_S) -> str:
        """What the longest stretch was: ``frame``, ``refresh`` (a sampling step) or ``gc``."""
        return max(((ms, kind) for _, ms, kind in self._recent(seconds)), default=(0.0, ""))[1]

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
        if self._log is not None:
            self._log.close()
            self._log = None

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start is not None:
            ms = (time.perf_counter() - self._gc_start) * 1000.0
            self._gc_passes.append((self.clock(), ms, "gc"))  # a deque's append: thread-safe
            self._gc_start = None
            if self._log is not None:
                self._write(f"gc{info['generation']} {ms:.1f} ms collected {info['collected']} "
                            f"counts {gc.get_count()} frozen {gc.get_freeze_count()} "
                            f"{threading.current_thread().name}")


class TimedScreen(Screen[None]):
    """The app's default screen, each of its updates (a frame: layout when needed, render,
    the compositor's output) timed by the app's ``frame_timer``. It overrides Screen's private
    ``_on_timer_update``: ``default_screen`` uses it only where that is as expected."""

    def _on_timer_update(self) -> None:
        timer = getattr(self.app, "frame_timer", None)
        if timer is None:
            super()._on_timer_update()
        else:
            timer.timed(super()._on_timer_update)


def default_screen() -> Screen[None]:
    """The app's default screen: a ``TimedScreen`` where Screen's update step is the method it
    overrides, else Textual's own (the frames untimed: the frame timer sees only the sampling
    steps and the collector's passes, and the log says so once)."""
    if usable(TIMED, [Need(Screen, "_on_timer_update", ("self",))]):
        return TimedScreen(id="_default")
    return Screen(id="_default")
