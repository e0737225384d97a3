"""The garbage collector's settings for the app: thousands of GPUs mean hundreds of thousands
of live objects, and a full collection walks all of them (tens of ms, a stalled frame, every
few seconds as samples churn). This keeps the full passes short."""

from __future__ import annotations

import gc
import time


class CollectorTuning:
    """``start`` when the app has mounted, ``cluster`` on each new host snapshot, ``tick`` on
    every refresh, ``stop`` when the app goes."""

    def __init__(self) -> None:
        self._frozen_for_gpus = 0
        self._freeze_at = float("inf")
        self._thresholds = gc.get_threshold()

    def start(self) -> None:
        # Everything built so far lives as long as the app: keep it out of the collector's way,
        # so a full collection while thousands of GPU rows change costs what changed, not all.
        # Samples churn (every GPU, every second), and most of a second's objects die within
        # about a second: collecting young objects every 50,000 allocations rather than 700 lets
        # them die by reference count first, instead of being walked (and promoted, and walked
        # again) while still alive. Old ones are collected far less often (a full pass is the
        # stall a user would see). bench/ui.py: at 512 x 8 GPUs the collector's time per second
        # fell from ~20 ms (10,000) to ~4 ms.
        self._thresholds = gc.get_threshold()
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)

    def cluster(self, gpus: int) -> None:
        """The cluster now has ``gpus`` GPUs: when it grew (hosts connected), freeze in a
        moment, once they settle."""
        if gpus > self._frozen_for_gpus:
            self._frozen_for_gpus = gpus
            self._freeze_at = min(self._freeze_at, time.monotonic() + 2.0)

    def tick(self) -> None:
        """Once a minute (and soon after the cluster grows) collect, then ``gc.freeze()`` what
        is left: it lives on, and later full passes walk only what is newer than a minute."""
        now = time.monotonic()
        if now < self._freeze_at or not self._frozen_for_gpus:
            return
        self._freeze_at = now + 60.0
        gc.collect()
        gc.freeze()

    def settle(self) -> None:
        """Collect and freeze now, as ``tick`` does once the cluster has settled (a benchmark
        puts this start-up pass behind it before it measures)."""
        self._freeze_at = time.monotonic() + 60.0
        gc.collect()
        gc.freeze()

    def stop(self) -> None:
        # The process may go on (tests, an embedding program): leave the collector as it was.
        gc.unfreeze()
        gc.set_threshold(*self._thresholds)
