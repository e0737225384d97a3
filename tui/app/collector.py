"""The garbage collector's schedule for the app: thousands of GPUs mean hundreds of thousands of
live objects, and a pass of the collector stalls the UI thread (whichever thread triggers it,
it holds the interpreter) for as long as it walks what it looks at.

- What the app has built once the cluster is up lives as long as the app: collected once, then
  ``gc.freeze()``-d out of every later pass.
- Young passes run between frames, from a timer on the UI thread, whenever a few thousand
  objects have been made since the last (a few ms each), not when an allocation in the middle
  of a view switch crosses the threshold (a view switch with a pass inside was the app's most
  common stall at 128 hosts); one over the middle generation after ``MIDDLE`` of them. The
  automatic threshold stays as a net for a burst the timer cannot keep up with.
- What outlives a middle pass is frozen at once. Left in the oldest generation, it was what
  the once-a-minute full pass had to walk: at 128 hosts a minute of view switches left ~100,000
  objects there (a filter's new table rows, the lines the tables keep), and the pass took
  40-100 ms. Frozen, an object is never looked at again: when it dies by reference count it
  goes as any other, but if it dies in a cycle nothing finds it. That is safe because the app
  makes next to no such cycles any more: Textual's footer removed and mounted its ~15 keys (a
  web of cycles each) whenever the bindings changed, and its strips and LRU caches made cycles
  of what they held; the keys are now one widget drawn again, never remounted
  (``tui/app/widgets/keybar.py``), and ``tui/app/stripcycle.py`` and ``tui/app/cycles.py``
  end the others. Measured with ``gc.DEBUG_SAVEALL`` over 90 view switches at 128 hosts:
  320 objects left to the collector, against 14,300 before.
- Once a minute, between frames too, a full pass over what is not frozen (what an automatic
  pass promoted, from any thread), then ``gc.freeze()``: a few ms.
- Should memory grow all the same, one pass over everything, frozen included, runs once the
  process has grown by ``GROWTH_MB`` since the last: a stall, but bounded memory.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable

COLLECT_S = 0.1  # how often the UI thread looks whether a young pass is due
YOUNG = 5_000  # objects made since the last young pass: time for the next one
MIDDLE = 3  # young passes: then one over the middle generation too (and a freeze)
FULL_S = 60.0  # between two full passes over what is not frozen
NET = 100_000  # the collector's own threshold, for a burst between two timer ticks
NEVER = 2**31 - 1  # the oldest generation is only ever collected here, never automatically
GROWTH_MB = 256.0  # resident memory grown since the last full pass: collect everything


def resident_mb() -> float | None:
    """This process's resident memory in MB (Linux; None where ``/proc`` is not there)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return None


class CollectorTuning:
    """``start`` when the app has mounted, ``cluster`` on each new host snapshot, ``tick`` on
    every refresh, ``between_frames`` from a timer (a few times a second), ``stop`` when the
    app goes."""

    def __init__(self, memory: Callable[[], float | None] = resident_mb) -> None:
        self._frozen_for_gpus = 0
        self._freeze_at = float("inf")
        self._thresholds = gc.get_threshold()
        self._memory = memory
        self._memory_at_full: float | None = None
        self._check_memory_at = 0.0
        self.full_passes = 0  # over everything, frozen included: memory had grown

    def start(self) -> None:
        # Everything built so far lives as long as the app: out of the collector's way.
        self._thresholds = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(NET, MIDDLE, NEVER)
        self._memory_at_full = self._memory()

    def between_frames(self) -> None:
        """A young pass, if enough has been made since the last (on the UI thread, between
        two of its messages: never inside a frame or a view switch), or a middle one and a
        freeze; once a minute (and soon after the cluster grew) a full one over what is not
        frozen, then a freeze."""
        now = time.monotonic()
        if now >= self._freeze_at and self._frozen_for_gpus:
            self.settle()
            return
        young, middle, _ = gc.get_count()
        if middle >= MIDDLE:
            gc.collect(1)
            gc.freeze()  # what outlived it: out of every later pass
        elif young >= YOUNG:
            gc.collect(0)

    def cluster(self, gpus: int) -> None:
        """The cluster now has ``gpus`` GPUs: when it grew (hosts connected), collect and freeze
        in a moment, once they settle."""
        if gpus > self._frozen_for_gpus:
            self._frozen_for_gpus = gpus
            self._freeze_at = min(self._freeze_at, time.monotonic() + 2.0)

    def tick(self) -> None:
        """Once a minute, look at memory (on each refresh)."""
        now = time.monotonic()
        if now >= self._check_memory_at:
            self._check_memory_at = now + 60.0
            self.check_memory()

    def settle(self) -> None:
        """Collect and freeze now, as ``tick`` does once the cluster has settled (a benchmark
        puts this start-up pass behind it before it measures)."""
        self._freeze_at = time.monotonic() + FULL_S
        gc.collect()
        gc.freeze()
        self._memory_at_full = self._memory()

    def check_memory(self) -> None:
        """When memory grew by ``GROWTH_MB`` since the last full pass: one over everything."""
        now = self._memory()
        if now is None or self._memory_at_full is None:
            return
        if now - self._memory_at_full > GROWTH_MB:
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self.full_passes += 1
            self._memory_at_full = self._memory()

    def stop(self) -> None:
        # The process may go on (tests, an embedding program): leave the collector as it was.
        gc.unfreeze()
        gc.set_threshold(*self._thresholds)
