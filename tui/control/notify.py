"""Notifications: the ``[notify]`` webhook and command, told of jobs', sweeps' and pipelines'
state changes.

The controller records every state change in its history; ``Notifier`` observes those records
(``History.observers``, ``SweepStore.observers``) in whichever process runs the controller: the
app's or the CLI's embedded one, or ``rigdeck serve`` on the server's host (then the webhook is
called, and the command run, there). Attached to a server, a face runs no controller and so sends
nothing: one sender per history.

One event per transition: before an event is queued, ``History.first_notice`` records it in the
history's SQLite (kind, id, event, attempt), so two controllers on one history (the app and a
``launch --wait``), an announcement followed by its record (a failed gang is announced when the
failure is decided, recorded once the other ranks have stopped), or a restarted server never
send it twice. A job that ended before a restart makes no transition after it: nothing is sent.

Sending never holds up the controller: events go to a queue and one worker thread sends them, a
webhook POST with a timeout and a few retries with growing pauses, a command with the event JSON
on stdin and in ``RIGDECK_EVENT``. A webhook URL's secrets (password, query, token-like path
segments) never reach a log line (``redact_url``).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from tui.control.history import History
from tui.model.identity import local_user
from tui.model.userconfig import (
    NotifyConfig,
    NotifyEvent,
    event_for_state,
    incident_event,
    job_event,
    redact_url,
    sweep_event,
)

log = logging.getLogger(__name__)

__all__ = ["Notifier", "post_webhook", "run_command"]

BACKOFF_S = 0.5  # the first pause between webhook attempts; doubled each time


def _user() -> str | None:
    return local_user()


def post_webhook(url: str, body: bytes, *, timeout: float, retries: int,
                 sleep: Callable[[float], None] = time.sleep) -> str | None:
    """POST ``body`` (JSON) to ``url``: None when an attempt got a 2xx answer, else why not
    (with the URL redacted). A 4xx other than 408 and 429 is not tried again."""
    import urllib.error  # (here: a CLI that sends nothing does not import urllib's http and ssl)
    import urllib.request

    shown = redact_url(url)
    why = "not sent"
    for attempt in range(retries + 1):
        if attempt:
            sleep(BACKOFF_S * 2 ** (attempt - 1))
        req = urllib.request.Request(url, data=body, method="POST", headers={
            "Content-Type": "application/json", "User-Agent": "rigdeck-notify"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - http(s) only, checked
                resp.read(65536)
                return None
        except urllib.error.HTTPError as e:
            why = f"{shown} answered HTTP {e.code}"
            if 400 <= e.code < 500 and e.code not in (408, 429):
                return why
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            why = f"{shown} not reached: {type(reason).__name__}: {_scrub(str(reason), url)}"
    return why


def _scrub(text: str, url: str) -> str:
    """An error's text with the URL's secrets out of it (some errors quote the URL)."""
    return text.replace(url, redact_url(url))


def run_command(argv: tuple[str, ...] | list[str], ev: NotifyEvent, body: bytes, *,
                timeout: float) -> str | None:
    """Run the notify command locally (argv, no shell), the event JSON on stdin and in
    ``RIGDECK_EVENT``: None when it exited 0, else why not."""
    env = {**os.environ, "RIGDECK_EVENT": body.decode(), **ev.env()}
    try:
        res = subprocess.run(list(argv), input=body, env=env, capture_output=True, timeout=timeout,
                             check=False)
    except subprocess.TimeoutExpired:
        return f"{argv[0]} did not finish in {timeout:g}s"
    except OSError as e:
        return f"{argv[0]} could not run: {e.strerror or e}"
    if res.returncode != 0:
        err = res.stderr.decode(errors="replace").strip()[-300:]
        return f"{argv[0]} exited {res.returncode}" + (f": {err}" if err else "")
    return None


class Notifier:
    """Sends the configured events of one controller; observers go on its history (``attach``)."""

    def __init__(self, config: NotifyConfig, history: History, *, controller: str = "embedded",
                 user: str | None = None):
        self.config = config
        self.history = history
        self.controller = controller
        self.user = user if user is not None else _user()
        self._queue: queue.Queue[NotifyEvent | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._sweeps: Any = None
        self._pipelines: Any = None
        # The latest sends, (event, target, error or None): for tests and a look in a debugger.
        self.sent: deque[tuple[str, str, str | None]] = deque(maxlen=256)

    # -- observing ---------------------------------------------------------------------------

    def attach_jobs(self) -> None:
        if self.job_state not in self.history.observers:
            self.history.observers.append(self.job_state)
        if self.job_incident not in self.history.incident_observers:
            self.history.incident_observers.append(self.job_incident)

    def attach_sweeps(self, store: Any) -> None:
        self._sweeps = store
        if self.sweep_state not in store.observers:
            store.observers.append(self.sweep_state)

    def attach_pipelines(self, store: Any) -> None:
        self._pipelines = store
        if self.pipeline_state not in store.observers:
            store.observers.append(self.pipeline_state)

    def job_incident(self, job_id: str, incident: dict[str, Any]) -> None:
        if not self.config.wants("job", "incident"):
            return
        rec = self.history.get(job_id)
        if rec is not None:
            self._offer(incident_event(rec, incident, when=time.time(), user=self.user, controller=self.controller))

    def job_state(self, job_id: str, state: str, fields: dict[str, Any]) -> None:
        event = event_for_state("job", state)
        if event is None or not self.config.wants("job", event):
            return
        rec = self.history.get(job_id)
        if rec is None:
            return
        ev = job_event(rec, state, when=time.time(), cause=fields.get("cause"), user=self.user,
                       controller=self.controller, include_output=self.config.include_output)
        if ev is not None:
            self._offer(ev)

    def sweep_state(self, sweep_id: str, state: str) -> None:
        event = event_for_state("sweep", state)
        if event is None or not self.config.wants("sweep", event) or self._sweeps is None:
            return
        rec = self._sweeps.get(sweep_id)
        if rec is None:
            return
        ev = sweep_event(rec, state, when=time.time(), user=self.user, controller=self.controller)
        if ev is not None:
            self._offer(ev)

    def pipeline_state(self, pipeline_id: str, state: str) -> None:
        event = event_for_state("pipeline", state)
        if event is None or not self.config.wants("pipeline", event) or self._pipelines is None:
            return
        rec = self._pipelines.get(pipeline_id)
        if rec is None:
            return
        ev = sweep_event(rec, state, when=time.time(), user=self.user, controller=self.controller,
                         kind="pipeline")
        if ev is not None:
            self._offer(ev)

    def _offer(self, ev: NotifyEvent) -> None:
        if not self.history.first_notice(ev.kind, ev.id, ev.event, ev.restarts):
            return  # told already (by this controller, another one, or before a restart)
        log.info("notify: %s", ev.summary())
        self._queue.put(ev)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="notify", daemon=True)
                self._thread.start()

    # -- sending -----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            ev = self._queue.get()
            if ev is None:
                return
            try:
                self.send(ev)
            except Exception:  # a bug here must not end the thread: later events still go
                log.exception("notify: sending %s failed", ev.summary())

    def send(self, ev: NotifyEvent) -> None:
        """Send one event to every configured target, now (the worker calls this)."""
        body = json.dumps(ev.to_json()).encode()
        ref = f"{ev.kind}:{ev.id}:{ev.event}"
        if self.config.webhook:
            why = post_webhook(self.config.webhook, body, timeout=self.config.timeout_s,
                               retries=self.config.retries)
            self.sent.append((ref, "webhook", why))
            if why:
                log.warning("notify: webhook for %s: %s", ev.summary(), why)
        if self.config.command:
            why = run_command(self.config.command, ev, body, timeout=self.config.timeout_s)
            self.sent.append((ref, "command", why))
            if why:
                log.warning("notify: command for %s: %s", ev.summary(), why)

    def close(self, timeout: float = 15.0) -> None:
        """Send what is queued (for up to ``timeout`` seconds), then stop the worker: a short
        CLI command's events still go out."""
        with self._lock:
            thread = self._thread
            self._thread = None
        if thread is None:
            return
        self._queue.put(None)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("notify: %d event(s) not sent before exit", self._queue.qsize())
