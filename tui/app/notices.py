"""Job state changes as the app tells them: a toast and the terminal bell.

The app sees jobs as snapshots, from its embedded controller or from a server alike; a
``StateTracker`` turns successive snapshots into events, and the user's ``[notify]`` table
(``on``, ``kinds``, ``app``) says which of them to tell. The webhook and the command are sent
by the controller, never from here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tui.model.jobview import JobsSnapshot
from tui.model.userconfig import ConfigError, NotifyConfig, NotifyEvent, StateTracker, load_config


class JobNotices:
    def __init__(self, config: NotifyConfig | None = None):
        if config is None:
            try:
                config = load_config().notify
            except ConfigError:
                config = NotifyConfig()  # the CLI refused it before the app started
        self.config = config
        self.tracker = StateTracker()

    def feed(self, snapshot: JobsSnapshot, now: float) -> list[NotifyEvent]:
        """The events between the last snapshot and this one that the user wants told. A
        snapshot of version 0 (nothing polled yet) is no look at all: otherwise every job in
        the history would seem new at the first real one."""
        if snapshot.version <= 0:
            return []
        events = self.tracker.feed(snapshot.rows, now)
        if not self.config.app:
            return []
        return [ev for ev in events if self.config.wants(ev.kind, ev.event)]


def toast(app: Any, events: Iterable[NotifyEvent]) -> None:
    """A toast for each event, and the bell once when there was any."""
    rang = False
    for ev in events:
        bad = ev.event == "failed"
        app.notify(ev.summary(), title=f"{ev.kind} {ev.event}", severity="error" if bad else "information",
                   timeout=30 if bad else 8, markup=False)
        rang = True
    if rang:
        app.bell()
