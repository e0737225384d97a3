"""The user's own settings: ``$XDG_CONFIG_HOME/rigdeck/config.toml`` (``$RIGDECK_CONFIG``).

``[queue]``, ``[[group]]`` and ``[[quota]]``: the queue's rules (tui.model.fairshare; the
server's config holds the ones in force for everyone). ``[notify]``: where to tell the user
about state changes of jobs, sweeps and pipelines::

    [notify]
    webhook = "https://hooks.example.com/T000/B000?token=..."   # POST of the event JSON
    command = ["notify-send", "rigdeck"]                          # run locally, event JSON on stdin
    on = ["failed", "succeeded"]                                  # which changes (the default)
    kinds = ["job", "sweep", "pipeline"]                          # which things (the default: all)
    app = true                                                    # toast and bell in the app

A missing file is no error: nothing is configured. A bad value is an error naming the file, the
field and what was expected, before anything starts. Also here, plain and I/O-free: the event a
notifier sends (``NotifyEvent``), how a record's state maps to an event, hiding a webhook's
secrets in what is shown (``redact_url``), and a tracker that turns successive job rows into
events (what the app rings its bell on).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tui.model.fairshare import QueuePolicy, parse_policy
from tui.model.fields import Bad, Check, boolean, checked, int_range, number
from tui.model.inventory import InventoryError
from tui.model.jobstate import FAILED, QUEUED, RUNNING, STOPPED, SUCCEEDED, describe_cause

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "CONFIG_ENV",
    "EVENTS",
    "KINDS",
    "ConfigError",
    "NotifyConfig",
    "NotifyEvent",
    "StateTracker",
    "UserConfig",
    "config_path",
    "event_for_state",
    "job_event",
    "load_config",
    "parse_config",
    "redact_url",
    "sweep_event",
]

CONFIG_ENV = "RIGDECK_CONFIG"
# The changes a user can ask to hear about. ``started``: a job's ranks all run (queued -> running
# included); a sweep was made. ``succeeded``: a job's ranks all exited 0; a sweep completed.
# "incident": a job stopped by rigdeck's healing (a hang, a failing GPU, a lost host, a NaN loss),
# whether it restarts or fails (tui.model.health).
EVENTS = ("queued", "started", "succeeded", "failed", "stopped", "incident")
DEFAULT_ON = ("failed", "succeeded", "incident")
# The things that change state.
KINDS = ("job", "sweep", "pipeline")

# A recorded state -> the event its arrival is (states not here are no event). The keys are
# states (jobstate's; a sweep's "completed" is its own), the values events (EVENTS).
_JOB_EVENTS = {QUEUED: "queued", RUNNING: "started", SUCCEEDED: "succeeded", FAILED: "failed",
               STOPPED: "stopped"}
_SWEEP_EVENTS = {RUNNING: "started", "completed": "succeeded", FAILED: "failed", STOPPED: "stopped"}
_PIPELINE_EVENTS = {RUNNING: "started", SUCCEEDED: "succeeded", FAILED: "failed", STOPPED: "stopped"}


class ConfigError(InventoryError):
    """A problem in the user's config file: ``path: field 'notify.on[1]': expected ..., got ...``."""

    def __init__(self, path: Path | None, field: str | None, expected: str, got: Any = None):
        super().__init__(path, None, field, expected, got)


def config_path() -> Path:
    """``$RIGDECK_CONFIG``, else ``$XDG_CONFIG_HOME/rigdeck/config.toml`` (default ~/.config)."""
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(os.path.expanduser(explicit))
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return Path(base) / "rigdeck" / "config.toml"


# ---------------------------------------------------------------------------------------------
# [notify]


@dataclass(frozen=True)
class NotifyConfig:
    webhook: str | None = None
    command: tuple[str, ...] = ()
    on: tuple[str, ...] = DEFAULT_ON
    kinds: tuple[str, ...] = KINDS
    app: bool = True  # a toast and the terminal bell in the app
    timeout_s: float = 10.0  # one webhook POST, one command run
    retries: int = 3  # webhook attempts after the first, with growing pauses
    # A failed rank's last lines of output go out in the body only when asked: they can hold
    # anything the job printed (a token, a path, data), and a webhook is someone else's server.
    include_output: bool = False

    @property
    def sends(self) -> bool:
        """Whether anything is sent from the controller (a webhook or a command)."""
        return bool(self.webhook or self.command)

    def wants(self, kind: str, event: str) -> bool:
        return kind in self.kinds and event in self.on

    def to_toml(self) -> dict[str, Any]:
        """The table as TOML data (what ``rigdeck server setup`` writes for the server)."""
        out: dict[str, Any] = {"on": list(self.on), "kinds": list(self.kinds), "app": self.app,
                               "timeout_s": self.timeout_s, "retries": self.retries,
                               "include_output": self.include_output}
        if self.webhook:
            out["webhook"] = self.webhook
        if self.command:
            out["command"] = list(self.command)
        return out


_URL_EXPECTED = 'an http:// or https:// URL with a host, e.g. "https://hooks.example.com/rigdeck"'


def _webhook(v: Any) -> str:
    if not isinstance(v, str) or any(c.isspace() for c in v):
        raise Bad(got=redact_url(v) if isinstance(v, str) else v)
    try:
        parts = urlsplit(v)
        parts.port  # noqa: B018 - a bad port raises here
    except ValueError:
        raise Bad(got=redact_url(v)) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Bad(got=redact_url(v))
    return v


def _argv(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not v:
        raise Bad()
    for i, word in enumerate(v):
        if not isinstance(word, str) or (i == 0 and not word.strip()):
            raise Bad("a string" if i else "a program (a non-empty string)", got=word, sub=f"[{i}]")
    return tuple(v)


def _choices(allowed: Sequence[str]) -> Any:
    def check(v: Any) -> tuple[str, ...]:
        if not isinstance(v, list):
            raise Bad()
        out: list[str] = []
        for i, word in enumerate(v):
            if word not in allowed:
                raise Bad(f"one of {', '.join(map(repr, allowed))}", got=word, sub=f"[{i}]")
            if word not in out:
                out.append(word)
        return tuple(out)

    return check


_NOTIFY_FIELDS: dict[str, Check] = {
    "webhook": Check(_URL_EXPECTED, _webhook),
    "command": Check('a program and its arguments, a list of strings: ["notify-send", "rigdeck"]', _argv),
    "on": Check(f"a list of events from {', '.join(map(repr, EVENTS))}", _choices(EVENTS)),
    "kinds": Check(f"a list of kinds from {', '.join(map(repr, KINDS))}", _choices(KINDS)),
    "app": Check("true or false (a toast and the terminal bell in the app)", boolean),
    "timeout_s": Check("a number of seconds > 0", number(positive=True)),
    "retries": Check("an integer 0..10 (webhook attempts after the first)", int_range(0, 10)),
    "include_output": Check("true or false (a failed rank's last lines of output in the body; default false)",
                            boolean),
}


def notify_config(raw: Any, path: Path | None) -> NotifyConfig:
    """The checked ``[notify]`` table."""
    if not isinstance(raw, Mapping):
        raise ConfigError(path, "notify", "a table ([notify])", raw)

    def error(name: str, expected: str, got: Any) -> ConfigError:
        return ConfigError(path, f"notify.{name}", expected, got)

    return NotifyConfig(**checked(raw, _NOTIFY_FIELDS, error))


@dataclass(frozen=True)
class UserConfig:
    path: Path | None = None
    notify: NotifyConfig = field(default_factory=NotifyConfig)
    # ``[queue]``, ``[[group]]``, ``[[quota]]``: the queue's order, shares, quotas and preemption
    # (tui.model.fairshare); the server's config holds the ones in force for everyone.
    queue: QueuePolicy = field(default_factory=QueuePolicy)


_TOP_LEVEL = ("notify", "queue", "group", "quota")


def parse_config(text: str, path: Path | None = None) -> UserConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, None, f"a TOML file ({e})") from None
    for key in data:
        if key not in _TOP_LEVEL:
            raise ConfigError(path, key, f"one of the known tables {', '.join(_TOP_LEVEL)}")
    notify = notify_config(data["notify"], path) if "notify" in data else NotifyConfig()

    def error(name: str, expected: str, got: Any) -> ConfigError:
        return ConfigError(path, name, expected, got)

    return UserConfig(path, notify, parse_policy(data, error))


def load_config(path: str | os.PathLike[str] | None = None) -> UserConfig:
    """The user's config (``config_path()`` when ``path`` is None). A missing default file is
    the defaults; a missing file named explicitly is an error."""
    explicit = path is not None or bool(os.environ.get(CONFIG_ENV))
    p = Path(os.path.expanduser(os.fspath(path))) if path is not None else config_path()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        if explicit:
            raise ConfigError(p, None, "an existing config file") from None
        return UserConfig(None)
    except UnicodeDecodeError as e:
        raise ConfigError(p, None, f"UTF-8 text ({e})") from None
    except OSError as e:
        raise ConfigError(p, None, f"a readable file ({e.strerror or e})") from None
    return parse_config(text, p)


# ---------------------------------------------------------------------------------------------
# Secrets in URLs

_SECRET_PATH_WORD = re.compile(r"[A-Za-z0-9_-]{20,}")


def redact_url(url: Any) -> str:
    """A webhook URL as logs and errors may show it: scheme, host, port and the path, with the
    password, the query, the fragment and any long token-like path segment replaced by ``***``
    (Slack and Discord put their secret in the path)."""
    if not isinstance(url, str):
        return repr(url)
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "***"
    user = f"{parts.username}:***@" if parts.password else (f"{parts.username}@" if parts.username else "")
    if ":" in host:
        host = f"[{host}]"
    path = "/".join("***" if _SECRET_PATH_WORD.fullmatch(seg) else seg for seg in parts.path.split("/"))
    return urlunsplit((parts.scheme, user + host + port, path, "***" if parts.query else "",
                       "***" if parts.fragment else ""))


# ---------------------------------------------------------------------------------------------
# Events


@dataclass(frozen=True)
class NotifyEvent:
    """One state change, as every notifier sends it (docs/contracts.md, "Notification event")."""

    event: str  # one of EVENTS
    kind: str  # "job", "sweep", "pipeline"
    id: str
    name: str
    state: str  # the recorded state that made the event
    time: float
    user: str | None = None
    hosts: tuple[str, ...] = ()
    host: str | None = None  # a failure's host
    cause: dict[str, Any] | None = None
    cause_text: str | None = None
    restarts: int = 0
    controller: str | None = None  # "embedded" or "server" (where it was sent from)

    def to_json(self) -> dict[str, Any]:
        return {
            "event": self.event, "kind": self.kind, "id": self.id, "name": self.name,
            "state": self.state, "time": self.time, "user": self.user, "hosts": list(self.hosts),
            "host": self.host, "cause": dict(self.cause) if self.cause is not None else None,
            "cause_text": self.cause_text, "restarts": self.restarts, "controller": self.controller,
        }

    def env(self) -> dict[str, str]:
        """The variables a notify command gets besides ``RIGDECK_EVENT`` (the JSON)."""
        return {"RIGDECK_EVENT_NAME": self.event, "RIGDECK_KIND": self.kind,
                f"RIGDECK_{self.kind.upper()}_ID": self.id, "RIGDECK_ID": self.id,
                "RIGDECK_NAME": self.name, "RIGDECK_STATE": self.state,
                "RIGDECK_HOST": self.host or "", "RIGDECK_CAUSE": self.cause_text or ""}

    def summary(self) -> str:
        """One line for a toast or a log: ``job train-1122 failed: rank 1 on h3 killed by signal 9``."""
        text = f"{self.kind} {self.id} {self.event}"
        return f"{text}: {self.cause_text}" if self.cause_text else text


def event_for_state(kind: str, state: str) -> str | None:
    table = {"sweep": _SWEEP_EVENTS, "pipeline": _PIPELINE_EVENTS}.get(kind, _JOB_EVENTS)
    return table.get(state)


def _hosts_of(placement: Iterable[Mapping[str, Any]] | None) -> tuple[str, ...]:
    out: list[str] = []
    for n in placement or ():
        h = n.get("host")
        if isinstance(h, str) and h not in out:
            out.append(h)
    return tuple(out)


def job_event(rec: Mapping[str, Any], state: str, *, when: float, cause: Mapping[str, Any] | None = None,
              user: str | None = None, controller: str | None = None,
              include_output: bool = False) -> NotifyEvent | None:
    """The event of a job record reaching ``state`` (None when that state is no event).
    ``cause``: the failure's cause when the record does not hold it yet; its ``tail`` (the rank's
    last lines of output) only with ``include_output``."""
    event = event_for_state("job", state)
    if event is None:
        return None
    why = dict(cause) if cause is not None else (dict(rec["cause"]) if rec.get("cause") else None)
    if why is not None and not include_output:
        why.pop("tail", None)
    if event not in ("failed", "stopped"):
        why = None  # a started or succeeded job carries no earlier attempt's cause
    spec = rec.get("spec") or {}
    return NotifyEvent(
        event=event, kind="job", id=str(rec["job_id"]), name=str(rec.get("name") or ""), state=state,
        time=when, user=spec.get("user") if isinstance(spec.get("user"), str) else user,
        hosts=_hosts_of(rec.get("placement")), host=why.get("host") if why else None,
        cause=why, cause_text=(describe_cause(why) or None) if why else None,
        restarts=int(rec.get("restarts") or 0), controller=controller,
    )


def incident_event(rec: Mapping[str, Any], incident: Mapping[str, Any], *, when: float, user: str | None = None,
                   controller: str | None = None) -> NotifyEvent:
    """A job stopped by rigdeck's healing (an incident: tui.model.health); its cause is the
    incident (kind, message, host, GPU, rank)."""
    spec = rec.get("spec") or {}
    cause = {k: incident[k] for k in ("kind", "message", "host", "gpu", "rank", "last_step")
             if incident.get(k) is not None}
    return NotifyEvent(
        event="incident", kind="job", id=str(rec["job_id"]), name=str(rec.get("name") or ""),
        state=str(rec.get("state") or ""), time=when,
        user=spec.get("user") if isinstance(spec.get("user"), str) else user,
        hosts=_hosts_of(rec.get("placement")), host=cause.get("host"), cause=cause,
        cause_text=str(incident.get("message") or incident.get("kind") or ""),
        restarts=int(incident.get("attempt") or 0), controller=controller,
    )


def sweep_event(rec: Mapping[str, Any], state: str, *, when: float, user: str | None = None,
                controller: str | None = None, kind: str = "sweep") -> NotifyEvent | None:
    """A sweep's (or, ``kind`` "pipeline", a pipeline's) record reaching ``state``; its
    ``reason`` is the cause (a failed pipeline's names the step)."""
    event = event_for_state(kind, state)
    if event is None:
        return None
    reason = rec.get("reason")
    spec = rec.get("spec") or {}
    return NotifyEvent(
        event=event, kind=kind, id=str(rec[f"{kind}_id"]), name=str(rec.get("name") or ""), state=state,
        time=when, user=user, hosts=tuple(spec.get("hosts") or ()) if isinstance(spec, Mapping) else (),
        cause={"message": str(reason)} if reason else None, cause_text=str(reason) if reason else None,
        controller=controller,
    )


class StateTracker:
    """Successive looks at jobs -> the events between them (what the app toasts and rings on).

    The first look only learns the states: a job already ended when the app opened is no news."""

    def __init__(self) -> None:
        self._seen: dict[str, str] | None = None

    def feed(self, rows: Iterable[Any], now: float) -> list[NotifyEvent]:
        """``rows``: objects with ``job_id``, ``name``, ``state``, ``placement``, ``restarts``
        and ``cause`` (the app's ``JobRow``)."""
        states = {r.job_id: r for r in rows}
        before = self._seen
        self._seen = {k: r.state for k, r in states.items()}
        if before is None:
            return []
        out: list[NotifyEvent] = []
        for job_id, r in states.items():
            if before.get(job_id) == r.state:
                continue
            rec = {"job_id": job_id, "name": r.name, "placement": list(r.placement or ()),
                   "restarts": r.restarts, "cause": r.cause}
            ev = job_event(rec, r.state, when=now)
            if ev is not None:
                out.append(ev)
        return out
