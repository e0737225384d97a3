"""The garbage collector's schedule for the app: thousands of GPUs mean hundreds of thousands of
live objects, and a pass of the collector stalls the UI thread (whichever thread triggers it,
it holds the interpreter) for as long as it walks what it looks at.

- What the app has built once the cluster is up lives as long as the app: collected once, then
  ``gc.freeze()``-d out of every later pass.
- Young passes run between frames, from a timer on the UI thread, whenever a few thousand
  objects have been made since the last (a few ms each), not when an allocation in the middle
  of a view switch crosses the threshold (a view switch with a pass inside was the app's most
  common stall at 128 hosts). The automatic threshold stays as a net for a burst the timer
  cannot keep up with.
- What outlives a young pass is frozen right after it: the app's objects live on (tables, their
  caches, the samples shown) or die by reference count, so walking them again in an older
  generation's pass finds nothing, and such a pass was the next longest stall (30-40 ms over the
  rows a view switch had built). No full passes either: with Textual's cycles broken
  (``tui/app/stripcycle.py``, ``tui/app/cycles.py``) what the app keeps is not garbage later,
  and a full pass over what it built (~100k objects) was its longest stall, ~80 ms.
- Should memory grow all the same (something new that makes cycles), one pass over everything,
  frozen included, runs once the process has grown by ``GROWTH_MB`` since the last: a stall,
  but bounded memory.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable

COLLECT_S = 0.1  # how often the UI thread looks whether a young pass is due
YOUNG = 5_000  # objects made since the last young pass: time for the next one
NET = 100_000  # the collector's own threshold, for a burst between two timer ticks
NEVER = 2**31 - 1  # the older generations are only ever collected here, never automatically
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
        gc.set_threshold(NET, NEVER, NEVER)
        self._memory_at_full = self._memory()

    def between_frames(self) -> None:
        """A young pass, if enough has been made since the last (on the UI thread, between
        two of its messages: never inside a frame or a view switch); what it leaves is frozen."""
        if gc.get_count()[0] >= YOUNG:
            gc.collect(0)
            gc.freeze()

    def cluster(self, gpus: int) -> None:
        """The cluster now has ``gpus`` GPUs: when it grew (hosts connected), collect and freeze
        in a moment, once they settle."""
        if gpus > self._frozen_for_gpus:
            self._frozen_for_gpus = gpus
            self._freeze_at = min(self._freeze_at, time.monotonic() + 2.0)

    def tick(self) -> None:
        """Soon after the cluster grew, collect, then ``gc.freeze()`` what is left (it lives
        on); once a minute, look at memory."""
        now = time.monotonic()
        if now >= self._freeze_at:
            self.settle()
        if now >= self._check_memory_at:
            self._check_memory_at = now + 60.0
            self.check_memory()

    def settle(self) -> None:
        """Collect and freeze now, as ``tick`` does once the cluster has settled (a benchmark
        puts this start-up pass behind it before it measures)."""
        self._freeze_at = float("inf")
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
