"""Whether the app's terminal is still there, and what to do when it is not.

When a terminal goes away (a tmux session killed, an SSH connection dropped) the kernel hangs up
the tty: reads from it return EOF, writes fail with EIO, and SIGHUP goes to the session leader
alone. Textual's Linux driver (8.x) takes an empty read for "nothing this time" and selects
again, so its input thread spins on the EOF; its writer thread dies on the first EIO, and once
its queue of 30 writes is full the next write blocks the app for good, shutdown included.

Started as plain ``rigdeck`` the app is the session leader (or its shell forwards SIGHUP) and
the signal's default action ends it. Started by ``make run``, make is the leader: it catches
SIGHUP and waits for its child before it exits, and the app, which never gets the signal, spins
at 50-80% of a core with nobody to draw for. So the app watches its terminal itself, on a thread
of its own, since its event loop may be the part that is stuck.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import sys
import termios
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

POLL_S = 0.25  # how long the watch sleeps between looks when nothing wakes it
# What poll() reports for a hung-up tty, a closed pty master, or a descriptor that is gone.
_GONE = select.POLLHUP | select.POLLERR | select.POLLNVAL


def input_fd() -> int | None:
    """The descriptor Textual reads keys from (``sys.__stdin__``), if it is a terminal."""
    stdin = sys.__stdin__
    if stdin is None:
        return None
    try:
        fd = stdin.fileno()
    except (OSError, ValueError):
        return None
    return fd if os.isatty(fd) else None


def terminal_gone(fd: int) -> bool:
    """True once ``fd`` no longer reaches a terminal: hung up (EOF on read, EIO on ioctl), its
    pty master closed, or the descriptor closed. Reads nothing, so no key is lost."""
    poller = select.poll()
    poller.register(fd, 0)  # hangups and errors are always reported; a pending key is not
    try:
        events = poller.poll(0)
    except OSError:
        return True
    if any(mask & _GONE for _fd, mask in events):
        return True
    try:
        termios.tcgetattr(fd)  # a hung-up tty answers every ioctl with EIO
    except (OSError, termios.error):
        return True
    return False


class HangupWatch:
    """Calls ``on_gone`` once, on the watch's own thread, when SIGHUP arrives or the terminal
    on ``fd`` is seen gone. ``start`` must be called from the main thread (it sets the SIGHUP
    handler); under ``nohup`` (SIGHUP ignored) only the terminal itself is watched."""

    def __init__(self, fd: int | None, on_gone: Callable[[str], None]) -> None:
        self.fd = fd
        self.on_gone = on_gone
        self._stop = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._old_handler: Any = None
        self._thread = threading.Thread(target=self._run, name="rigdeck-hangup", daemon=True)

    def start(self) -> HangupWatch:
        if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
            self._old_handler = signal.signal(signal.SIGHUP, self._on_sighup)
        self._thread.start()
        return self

    def stop(self) -> None:
        """End the watch (the app is leaving by itself) and give SIGHUP back. Main thread."""
        if self._old_handler is not None:
            signal.signal(signal.SIGHUP, self._old_handler)
            self._old_handler = None
        self._stop.set()
        self._wake()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        if not self._thread.is_alive() and self._wake_r >= 0:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1

    def _wake(self) -> None:
        if self._wake_w < 0:
            return
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:  # the pipe is full: the watch is awake already
            pass

    def _on_sighup(self, signum: int, frame: FrameType | None) -> None:
        # A signal handler only wakes the watch: the main thread may be the stuck one.
        self._wake()

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        while not self._stop.is_set():
            woken = poller.poll(POLL_S * 1000)
            if self._stop.is_set():
                return
            if woken:
                os.read(self._wake_r, 4096)
                reason = "SIGHUP"
            elif self.fd is not None and terminal_gone(self.fd):
                reason = "the terminal hung up"
            else:
                continue
            log.info("%s: leaving", reason)
            self.on_gone(reason)
            return
