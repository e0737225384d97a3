"""Letting go of a second of samples without freeing it in a frame.

A view that keeps the cluster's snapshot (the map draws every GPU of it) holds the last
second's GPU views until the next second's replace them; dropping that reference frees
thousands of objects (~2 ms at 512 x 8 GPUs), and on the UI thread that is in the middle of
the next frame. ``release_after_frame`` keeps the old snapshot until the frame being made has
been drawn, then hands it to a thread of its own that drops it while the app idles.
"""

from __future__ import annotations

import threading
from queue import SimpleQueue
from typing import Any

from textual.widget import Widget


class _Releaser:
    def __init__(self) -> None:
        self._queue: SimpleQueue[list[Any]] = SimpleQueue()
        self._pending: list[Any] = []
        self._thread: threading.Thread | None = None

    def after_frame(self, widget: Widget, thing: Any) -> None:
        if not widget.is_mounted:
            return  # no frame to wait for: let go of it here
        if not self._pending:
            widget.call_after_refresh(self._hand_over)
        self._pending.append(thing)

    def _hand_over(self) -> None:
        batch, self._pending = self._pending, []
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rigdeck-release", daemon=True)
            self._thread.start()
        self._queue.put(batch)

    def _run(self) -> None:
        while True:
            self._queue.get()  # dropped here, on this thread: its objects are freed with it


_RELEASER = _Releaser()


def release_after_frame(widget: Widget, thing: Any) -> None:
    """Keep ``thing`` until ``widget``'s next frame has been drawn, then let it go on the
    releasing thread (on the UI thread ``thing`` must not be referenced any more)."""
    _RELEASER.after_frame(widget, thing)
