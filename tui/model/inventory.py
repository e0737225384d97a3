"""The host inventory: which machines rigdeck manages and how to reach them.

The inventory is a TOML file (``[defaults]`` plus ``[[hosts]]`` entries), or a DeepSpeed/MPI
hostfile. Names are resolved through the OpenSSH client config, as ``ssh`` would resolve them.
Nothing here opens a connection; the result is plain frozen dataclasses.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from agent.promtext import textfile_path_problem
from tui.model.fields import (
    ENV_NAME_RE,
    Bad,
    Check,
    boolean,
    checked,
    int_range,
    listen_address,
    nonblank,
    number,
    show,
    token,
    valid,
)
from tui.model.identity import local_user

__all__ = [
    "INVENTORY_ENV",
    "HostSpec",
    "Inventory",
    "InventoryError",
    "ServerSpec",
    "SlurmSpec",
    "UnknownHostError",
    "default_inventory_path",
]

INVENTORY_ENV = "RIGDECK_INVENTORY"
DEFAULT_INVENTORY = "~/.config/rigdeck/hosts.toml"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_SSH_CONFIG = "~/.ssh/config"

NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
# Stand-ins for a host name in errors: an unnamed entry ("hosts[2]") or a section ("[defaults]").
_LABEL_RE = re.compile(r"hosts\[[0-9]+\]|\[[a-z_]+\]")
# [ssh://][user@]host[:port], with IPv6 addresses in brackets, as OpenSSH's ProxyJump takes them.
_JUMP_RE = re.compile(
    r"(?:ssh://)?(?:(?P<user>[^@\s/]+)@)?"
    r"(?:\[(?P<v6>[^\]\s]+)\]|(?P<host>[^@:\s/\[\]]+))"
    r"(?::(?P<port>[0-9]+))?"
)
# A hostfile line, loosely: a host token then tokens that are neither '=...' nor TOML syntax.
# Loose on purpose, so that a malformed hostfile gets the hostfile parser's error, not TOML's.
_HOSTFILE_LINE_RE = re.compile(r"[^\s=\[\]{}\"']+(?:\s+[^\s=\[\]{}\"'][^\s\[\]{}\"']*)*")


def login_user() -> str:
    # No $USER/$LOGNAME and no passwd entry (some containers): those images run as root.
    return local_user() or "root"


@dataclass(frozen=True)
class Retention:
    """How long the hosts keep the directories of ended jobs (logs, metrics, cluster files)."""

    max_age_days: float = 30.0
    max_jobs: int = 500


@dataclass(frozen=True)
class ServerSpec:
    """The ``[server]`` table: the inventory host that runs ``rigdeck serve``, the Python that
    runs it there (None: that host's own ``python``), the server's directory on that host, and
    where on that host the server serves Prometheus' ``/metrics`` (``ADDR:PORT``; None: nowhere)."""

    host: str
    python: str | None = None
    state_dir: str = "~/.rigdeck/server"
    metrics_listen: str | None = None
    # Jobs on the server's host run as an account that can read and change the server's files
    # (its users, its key): none are placed there unless the inventory says so.
    allow_jobs: bool = False
    # Whether a member's job may run as the hosts' account before they join with accounts of
    # their own (docs/security.md): None (default) refuses it where that account is the one the
    # server itself runs as; True refuses it always; False never.
    members_need_join: bool | None = None


@dataclass(frozen=True)
class SlurmSpec:
    """The ``[slurm]`` table: the cluster's Slurm, as later launches through ``sbatch`` will use
    it (docs/slurm.md). ``login``: the inventory host or ``~/.ssh/config`` alias where Slurm's
    commands run (None: the inventory's first host); the rest, what every job is submitted with
    unless its spec says otherwise (None: Slurm's default)."""

    login: str | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    # The inventory lists no [[hosts]]: they are Slurm's nodes, read on ``login`` when it is
    # loaded (tui/remote/inventoryfile.py ``slurm_nodes_inventory``). Not a field of the file.
    read_hosts: bool = False

    def login_host(self, hosts: Sequence[HostSpec]) -> str | None:
        """Where Slurm's commands run: ``login``, else the first host (None: no host at all)."""
        return self.login or (hosts[0].name if hosts else None)


@dataclass(frozen=True)
class HostSpec:
    """One managed host with every setting resolved."""

    name: str
    address: str
    port: int = 22
    user: str = field(default_factory=login_user)
    identity_files: tuple[str, ...] = ()
    python: str = "python3"
    state_dir: str = "~/.rigdeck"
    labels: tuple[str, ...] = ()
    proxy_jump: str | None = None
    slots: int | None = None
    sim_gpus: int = 0
    env: tuple[tuple[str, str], ...] = ()
    transport: str = "ssh"
    connect_timeout: float = 10.0
    keepalive: float = 15.0
    # Only the agent's attach stream is opened on this host: no deploy, no probe commands
    # (what a rigdeck server's key is restricted to).
    attach_only: bool = False
    # Where the agent writes the host's GPU series for node_exporter's textfile collector (a
    # path on the host, ~ expanded there; agent/textfile.py), or None.
    prometheus_textfile: str | None = None
    # The account trusted to own the host's GPU claim directory beside root (the hosts' admin),
    # so that every person's agent there shares one (agent/claims.py); None: root or our own.
    claim_dir_owner: str | None = None

    @property
    def is_local(self) -> bool:
        """True when the host is this machine, reached without SSH."""
        return self.transport == "local"


class InventoryError(ValueError):
    """A problem in an inventory, hostfile or ssh config that the user can fix.

    ``host`` is the host's name, or ``hosts[2]`` (an entry without a usable name) or
    ``[defaults]``; ``field`` is None for problems with the file as a whole.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        host: str | None,
        field: str | None,
        expected: str,
        got: Any = None,
        *,
        line: int | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else None
        self.host = host
        self.field = field
        self.expected = expected
        self.got = got
        self.line = line
        super().__init__(self._message())

    def _message(self) -> str:
        where = str(self.path) if self.path is not None else "<built-in inventory>"
        if self.line is not None:
            where += f":{self.line}"
        parts = [where]
        if self.host is not None:
            label = _LABEL_RE.fullmatch(self.host)
            parts.append(self.host if label else f"host {self.host!r}")
        if self.field is not None:
            parts.append(f"field {self.field!r}")
        text = f"expected {self.expected}"
        if self.got is not None:
            text += f", got {show(self.got)} ({type(self.got).__name__})"
        parts.append(text)
        return ": ".join(parts)


class UnknownHostError(KeyError):
    """``Inventory.get`` was asked for a name the inventory does not have."""

    def __init__(self, name: str, known: Sequence[str], path: Path | None) -> None:
        self.name = name
        where = str(path) if path is not None else "the built-in inventory"
        listing = ", ".join(known) if known else "(none)"
        self.message = f"no host {name!r} in {where}; known hosts: {listing}"
        super().__init__(self.message)

    def __str__(self) -> str:
        # KeyError's own __str__ would print the repr of the message, quotes and all.
        return self.message


@dataclass(frozen=True)
class Inventory:
    """The resolved inventory: hosts in file order and where host keys live."""

    hosts: tuple[HostSpec, ...]
    path: Path | None
    known_hosts: Path
    # The OpenSSH client config the names were resolved with; jump hosts that are not in the
    # inventory are resolved through it too. None when disabled.
    ssh_config: Path | None = None
    min_free_mb: float = 256.0  # a launch refuses a host with less free in its state dir
    retention: Retention = field(default_factory=Retention)
    server: ServerSpec | None = None  # the [server] table: where `rigdeck serve` runs
    slurm: SlurmSpec | None = None  # the [slurm] table: the hosts are a Slurm cluster's

    @property
    def names(self) -> list[str]:
        """Host names in inventory order."""
        return [h.name for h in self.hosts]

    def get(self, name: str) -> HostSpec:
        """The host called ``name``; UnknownHostError (a KeyError) listing the known names."""
        for host in self.hosts:
            if host.name == name:
                return host
        raise UnknownHostError(name, self.names, self.path)

    def select(self, names: Sequence[str]) -> tuple[HostSpec, ...]:
        """The named hosts in the order given (repeats dropped); an unknown name is an error."""
        chosen: dict[str, HostSpec] = {}
        for name in names:
            try:
                chosen.setdefault(name, self.get(name))
            except UnknownHostError:
                known = ", ".join(self.names) or "none"
                raise InventoryError(
                    self.path, name, None, f"a host in the inventory (known: {known})"
                ) from None
        return tuple(chosen.values())


# ---------------------------------------------------------------------------------------------
# Field checks (the kit is tui.model.fields). Each takes the raw TOML value and returns the
# converted one, or raises Bad.


# A TCP port, wherever one is written: the port field, host:port, a jump host, the ssh config's Port.
checked_port = int_range(1, 65535)


class _Address(NamedTuple):
    host: str
    port: int | None  # the port written in the address ("h5:2222"), if any


ADDRESS_EXPECTED = (
    "a host name or IP address, optionally with a port: host, host:port, an IPv6 address, "
    "or [IPv6]:port (a string without spaces)"
)
_ADDRESS_V6_RE = re.compile(r"\[(?P<v6>[^\]\s]+)\](?::(?P<port>[^:]*))?")


def split_address(v: str) -> _Address:
    """``host``, ``host:port``, a bare IPv6 address (two or more colons, no port) or
    ``[v6]`` / ``[v6]:port``. A port written here is what the user meant, never part of the
    host name: ssh would otherwise look up a host called "h5:2222"."""
    if not v or any(c.isspace() for c in v):
        raise Bad(ADDRESS_EXPECTED, got=v)
    if v.startswith("["):
        m = _ADDRESS_V6_RE.fullmatch(v)
        if m is None:
            raise Bad(ADDRESS_EXPECTED, got=v)
        host, port_text = m["v6"], m["port"]
    elif v.count(":") == 1:
        host, port_text = v.split(":")
    else:
        host, port_text = v, None
    if not host:
        raise Bad(ADDRESS_EXPECTED, got=v)
    if port_text is None:
        return _Address(host, None)
    if not re.fullmatch(r"[0-9]{1,5}", port_text) or not valid(checked_port, int(port_text)):
        raise Bad("a port 1..65535 after the ':' of host:port", got=v)
    return _Address(host, int(port_text))


def _address(v: Any) -> _Address:
    if not isinstance(v, str):
        raise Bad()
    return split_address(v)


def _name(v: Any) -> str:
    if isinstance(v, str) and NAME_RE.fullmatch(v):
        return v
    raise Bad()


def _local_path(v: Any) -> str:
    return os.path.expanduser(nonblank(v))


def _optional_local_path(v: Any) -> str:
    if v == "":
        return ""
    return _local_path(v)


def _paths(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        return (_local_path(v),)
    if isinstance(v, list):
        return tuple(_local_path(p) for p in v)
    raise Bad()


def _labels(v: Any) -> tuple[str, ...]:
    if isinstance(v, list) and all(isinstance(s, str) and s for s in v):
        return tuple(v)
    raise Bad()


def _env(v: Any) -> dict[str, str]:
    if not isinstance(v, dict):
        raise Bad()
    for key, value in v.items():
        if not ENV_NAME_RE.fullmatch(key):
            raise Bad("environment variable names ([A-Za-z_][A-Za-z0-9_]*)", got=key)
        if not isinstance(value, str):
            raise Bad("a string", got=value, sub=key)
    return dict(v)


def _transport(v: Any) -> str:
    if v in ("ssh", "local"):
        return str(v)
    raise Bad()


class JumpHop(NamedTuple):
    user: str | None
    host: str
    port: int | None


JUMP_EXPECTED = (
    'inventory host names or [user@]host[:port], comma-separated, or "none" for no jump'
)


def parse_jump(element: str) -> JumpHop:
    m = _JUMP_RE.fullmatch(element)
    if m is None:
        raise Bad(got=element)
    port = None
    if m["port"] is not None:
        port = int(m["port"])
        if not valid(checked_port, port):
            raise Bad(f"a jump host port 1..65535 in {JUMP_EXPECTED}", got=element)
    return JumpHop(m["user"], m["v6"] or m["host"], port)


def parse_proxy_jump(v: Any) -> str | None:
    """The raw jump spec, checked for syntax; "none" (as in OpenSSH) means no jump."""
    if not isinstance(v, str) or not v.strip():
        raise Bad()
    if v.strip().lower() == "none":
        return None
    for element in v.split(","):
        parse_jump(element.strip())
    return v.strip()


_TEXTFILE_EXPECTED = (
    'a file path on the host ending in .prom (absolute, or starting with ~), or "" for none'
)


def _textfile(v: Any) -> str:
    """A node_exporter textfile's path as written (checked by the agent's own rule), "" for none."""
    if v == "":
        return ""
    problem = textfile_path_problem(v)
    if problem is not None:
        raise Bad(f'{problem}, or "" for none' if isinstance(v, str) else None)
    return str(v)


def _optional_token(v: Any) -> str:
    """A user name, or "" (none: a host's own entry turning a default off)."""
    return "" if v == "" else token(v)


# Ranks per host: far above any machine's GPU count, far below what would exhaust the
# controller or the agent when it starts that many processes.
MAX_SLOTS = 4096
SLOTS_EXPECTED = f"an integer 1..{MAX_SLOTS}"

_COMMON_FIELDS: dict[str, Check] = {
    "port": Check("an integer 1..65535", checked_port),
    "user": Check("a user name (a string without spaces)", token),
    "identity_file": Check("a path or a list of paths (strings)", _paths),
    "python": Check("a Python interpreter command or path (a string)", nonblank),
    "state_dir": Check("a directory path on the host (a string)", nonblank),
    "labels": Check("a list of strings", _labels),
    "sim_gpus": Check("an integer >= 0", int_range(0)),
    "env": Check('a table of strings (NAME = "value")', _env),
    "connect_timeout": Check("a number of seconds > 0", number(positive=True)),
    "keepalive": Check("a number of seconds >= 0 (0 = off)", number(positive=False)),
    "attach_only": Check("true or false", boolean),
    "prometheus_textfile": Check(_TEXTFILE_EXPECTED, _textfile),
    "claim_dir_owner": Check('a user name on the hosts (a string without spaces), or "" for none',
                             _optional_token),
}
def _retention(v: Any) -> Retention:
    """``[defaults.retention]``: max_age_days (a number > 0) and max_jobs (an integer >= 1)."""
    if not isinstance(v, dict):
        raise Bad("a table with max_age_days and/or max_jobs")
    unknown = sorted(set(v) - {"max_age_days", "max_jobs"})
    if unknown:
        raise Bad("only max_age_days (days > 0) and max_jobs (an integer >= 1)", got=unknown[0])
    age = v.get("max_age_days", Retention.max_age_days)
    jobs = v.get("max_jobs", Retention.max_jobs)
    if not valid(number(positive=True), age):
        raise Bad("max_age_days: a number of days > 0", got=age)
    if not valid(int_range(1), jobs):
        raise Bad("max_jobs: an integer >= 1", got=jobs)
    return Retention(float(age), int(jobs))


DEFAULT_FIELDS: dict[str, Check] = {
    **_COMMON_FIELDS,
    "min_free_mb": Check("a number of MB >= 0 (launch refuses a host with less free for its job files)",
                         number(positive=False)),
    "retention": Check("a table: max_age_days = N, max_jobs = N (when ended job dirs are removed)",
                       _retention),
    "known_hosts": Check("a path (a string)", _local_path),
    "ssh_config": Check('a path (a string; "" disables it)', _optional_local_path),
}
HOST_FIELDS: dict[str, Check] = {
    **_COMMON_FIELDS,
    "name": Check("a name of letters, digits, '.', '_' and '-'", _name),
    "address": Check(ADDRESS_EXPECTED, _address),
    "proxy_jump": Check(JUMP_EXPECTED, parse_proxy_jump),
    "slots": Check(SLOTS_EXPECTED, int_range(1, MAX_SLOTS)),
    "transport": Check('"ssh" or "local"', _transport),
}
INVENTORY_TABLES = ("defaults", "hosts", "server", "slurm")


METRICS_LISTEN_EXPECTED = (
    "ADDR:PORT on the server host where its /metrics is served, a TCP port from 1 to 65535, "
    "e.g. 127.0.0.1:9464 or [::1]:9464"
)


def _metrics_listen(v: Any) -> str:
    """``ADDR:PORT`` with a fixed port: Prometheus scrapes the address written here."""
    listen_address(v, expected=METRICS_LISTEN_EXPECTED, any_port=False)
    return str(v).strip()


# The [server] table. Checked after the hosts: its host must be one of them.
_SERVER_FIELDS: dict[str, Check] = {
    "host": Check("the name of a host in this inventory", _name),
    "python": Check("a Python interpreter command or path on the server host (a string)", nonblank),
    "state_dir": Check("a directory path on the server host (a string)", nonblank),
    "metrics_listen": Check(METRICS_LISTEN_EXPECTED, _metrics_listen),
    "allow_jobs": Check("true or false (may jobs be placed on the server's host; default false)", boolean),
    "members_need_join": Check("true or false (must a member join before their jobs run; default: where the "
                               "hosts' account is the server's own)", boolean),
}


def server_spec(raw: Any, path: Path | None, hosts: Sequence[HostSpec]) -> ServerSpec:
    """The checked ``[server]`` table; its ``host`` must name one of ``hosts``."""
    if not isinstance(raw, dict):
        raise InventoryError(path, None, "server", "a table ([server])", raw)
    entry = checked_fields(raw, _SERVER_FIELDS, path, "[server]")
    names = [h.name for h in hosts]
    if "host" not in entry:
        raise InventoryError(path, "[server]", "host", "the name of a host in this inventory "
                             f"(required; hosts: {', '.join(names) or 'none'})")
    if entry["host"] not in names:
        raise InventoryError(path, "[server]", "host", "the name of a host in this inventory "
                             f"({', '.join(names) or 'none'})", entry["host"])
    return ServerSpec(entry["host"], entry.get("python"),
                      entry.get("state_dir", ServerSpec.state_dir), entry.get("metrics_listen"),
                      entry.get("allow_jobs", False), entry.get("members_need_join"))


# Slurm's names of a partition, account or QoS: what sbatch takes, never parsed by a shell.
_SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
# A --constraint expression: feature names joined by & | , with [ ] ( ) and *N counts.
_SLURM_CONSTRAINT_RE = re.compile(r"[A-Za-z0-9_.\-&|,\[\]()*:!]+")


def _slurm_name(v: Any) -> str:
    if isinstance(v, str) and _SLURM_NAME_RE.fullmatch(v):
        return v
    raise Bad()


def _slurm_constraint(v: Any) -> str:
    if isinstance(v, str) and _SLURM_CONSTRAINT_RE.fullmatch(v) and re.search(r"[A-Za-z0-9_]", v):
        return v
    raise Bad()


_SLURM_FIELDS: dict[str, Check] = {
    "login": Check("the name of an inventory host or ~/.ssh/config alias where sbatch, squeue and scontrol "
                   "run (letters, digits, '.', '_', '-'; default: the first host)", _name),
    "partition": Check("a Slurm partition name (letters, digits, '.', '_', '-')", _slurm_name),
    "account": Check("a Slurm account name (letters, digits, '.', '_', '-')", _slurm_name),
    "qos": Check("a Slurm QOS name (letters, digits, '.', '_', '-')", _slurm_name),
    "constraint": Check("a Slurm --constraint expression: feature names joined by &, | or ',' "
                        '(no spaces), e.g. "a100&ib"', _slurm_constraint),
}


# What a job spec's own [slurm] table may say (tui/model/jobspec.py): sbatch's choices, not the login.
SLURM_JOB_FIELDS: dict[str, Check] = {k: v for k, v in _SLURM_FIELDS.items() if k != "login"}


def slurm_spec(raw: Any, path: Path | None) -> SlurmSpec:
    """The checked ``[slurm]`` table."""
    if not isinstance(raw, dict):
        raise InventoryError(path, None, "slurm", "a table ([slurm])", raw)
    entry = checked_fields(raw, _SLURM_FIELDS, path, "[slurm]")
    return SlurmSpec(**entry)


def checked_fields(
    raw: Mapping[str, Any],
    checks: Mapping[str, Check],
    path: Path | None,
    host: str | None,
    line: int | None = None,
) -> dict[str, Any]:
    """Check every key of one table; unknown keys are errors naming file, host and line."""

    def error(name: str, expected: str, got: Any) -> InventoryError:
        return InventoryError(path, host, name, expected, got, line=line)

    return checked(raw, checks, error)


# ---------------------------------------------------------------------------------------------
# Files.

HOSTFILE_EXPECTED = "a line 'HOSTNAME [slots=N] [max_slots=M]'"


def default_inventory_path() -> Path:
    """$RIGDECK_INVENTORY, or ~/.config/rigdeck/hosts.toml."""
    env = os.environ.get(INVENTORY_ENV)
    return Path(os.path.expanduser(env or DEFAULT_INVENTORY))


def read_inventory_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(path, None, None, "an existing inventory file") from None
    except UnicodeDecodeError as e:
        raise InventoryError(path, None, None, f"UTF-8 text ({e})") from None
    except OSError as e:
        raise InventoryError(path, None, None, f"a readable file ({e.strerror or e})") from None


def looks_like_hostfile(text: str) -> bool:
    lines = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    return bool(lines) and all(_HOSTFILE_LINE_RE.fullmatch(ln) for ln in lines)


def inventory_name(hostname: str) -> str:
    """An inventory name for a host name that may hold other characters (IPv6, brackets)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", hostname).strip("-") or "host"

