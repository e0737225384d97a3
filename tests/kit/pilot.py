"""Driving the app under Textual's pilot: wait for what the screen should come to, read a
widget's text. One copy for every UI test file."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from textual.pilot import Pilot
from textual.widgets import Static


async def until(pilot: Pilot[Any], cond: Callable[[], object], seconds: float = 10.0) -> None:
    """Let the app run until ``cond()`` holds, for at most ``seconds`` (a loaded machine, a
    detail through the server); the caller asserts what it waited for."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await pilot.pause(0.05)
        if cond():
            return


def static_text(app: Any, selector: str) -> str:
    """What a ``Static`` shows, as plain text."""
    return str(app.query_one(selector, Static).render())


def static_words(app: Any, selector: str) -> str:
    """What a ``Static`` shows, its runs of spaces and line ends as one space (a panel's words
    in order, whatever its columns' widths)."""
    return " ".join(static_text(app, selector).split())
