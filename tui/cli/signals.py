"""Ctrl+C and SIGTERM for the CLI's long-running commands (``exporter``, ``tensorboard``).

A parent that ignored or blocked SIGINT (a background job, a test runner's worker) passes that
on, and a Ctrl+C sent to the command would go unheard; so each command handles both signals
itself, as ``rigdeck serve`` does, and unblocks them. Meanwhile SIGUSR1 prints every thread's
stack to stderr: a long-running process that seems stuck can be asked where it is.
"""

from __future__ import annotations

import faulthandler
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def stop_signals(on_stop: Callable[[], None]) -> Iterator[None]:
    """Within the block, SIGINT and SIGTERM call ``on_stop`` (in the main thread; it may raise,
    e.g. KeyboardInterrupt); the previous handlers come back after it."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    previous = {s: signal.signal(s, lambda *_: on_stop()) for s in STOP_SIGNALS}
    signal.pthread_sigmask(signal.SIG_UNBLOCK, list(previous))
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def interrupt() -> None:
    """An ``on_stop`` that ends the block the way Ctrl+C does by default."""
    raise KeyboardInterrupt
