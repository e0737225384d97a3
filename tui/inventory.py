"""The host inventory: which machines rigdeck manages and how to reach them.

The inventory is a TOML file (``[defaults]`` plus ``[[hosts]]`` entries), or a DeepSpeed/MPI
hostfile. Names are resolved through the OpenSSH client config, as ``ssh`` would resolve them.
Nothing here opens a connection; the result is plain frozen dataclasses.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import getpass
import math
import os
import re
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import paramiko

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "INVENTORY_ENV",
    "HostSpec",
    "Inventory",
    "InventoryError",
    "UnknownHostError",
    "default_inventory_path",
    "hostfile_to_toml",
    "jump_chain",
    "load_hostfile",
    "load_inventory",
    "local_inventory",
]

INVENTORY_ENV = "RIGDECK_INVENTORY"
DEFAULT_INVENTORY = "~/.config/rigdeck/hosts.toml"
DEFAULT_KNOWN_HOSTS = "~/.ssh/known_hosts"
DEFAULT_SSH_CONFIG = "~/.ssh/config"

NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
# Stand-ins for a host name in errors: an unnamed entry ("hosts[2]") or a section ("[defaults]").
_LABEL_RE = re.compile(r"hosts\[[0-9]+\]|\[[a-z_]+\]")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# [ssh://][user@]host[:port], with IPv6 addresses in brackets, as OpenSSH's ProxyJump takes them.
_JUMP_RE = re.compile(
    r"(?:ssh://)?(?:(?P<user>[^@\s/]+)@)?"
    r"(?:\[(?P<v6>[^\]\s]+)\]|(?P<host>[^@:\s/\[\]]+))"
    r"(?::(?P<port>[0-9]+))?"
)
# A hostfile line, loosely: a host token then tokens that are neither '=...' nor TOML syntax.
# Loose on purpose, so that a malformed hostfile gets the hostfile parser's error, not TOML's.
_HOSTFILE_LINE_RE = re.compile(r"[^\s=\[\]{}\"']+(?:\s+[^\s=\[\]{}\"'][^\s\[\]{}\"']*)*")


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        # No $USER/$LOGNAME and no passwd entry (some containers); those images run as root.
        return "root"


@dataclass(frozen=True)
class Retention:
    """How long the hosts keep the directories of ended jobs (logs, metrics, cluster files)."""

    max_age_days: float = 30.0
    max_jobs: int = 500


@dataclass(frozen=True)
class HostSpec:
    """One managed host with every setting resolved."""

    name: str
    address: str
    port: int = 22
    user: str = field(default_factory=_local_user)
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
            text += f", got {_show(self.got)} ({type(self.got).__name__})"
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
# Field checks. Each takes the raw TOML value and returns the converted one, or raises _Bad.


class _Bad(Exception):
    """A value failed its check; the caller adds file and host. Overrides are optional."""

    def __init__(self, expected: str | None = None, *, got: Any = None, field: str | None = None):
        super().__init__(expected)
        self.expected = expected
        self.got = got
        self.field = field


class _Check(NamedTuple):
    expected: str
    convert: Callable[[Any], Any]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _int_range(lo: int, hi: int | None = None) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if _is_int(v) and v >= lo and (hi is None or v <= hi):
            return int(v)
        raise _Bad()

    return check


def _seconds(*, positive: bool) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        if (_is_int(v) or isinstance(v, float)) and math.isfinite(v):
            if v > 0 or (v == 0 and not positive):
                return float(v)
        raise _Bad()

    return check


def _text(v: Any) -> str:
    if isinstance(v, str) and v.strip():
        return v
    raise _Bad()


def _token(v: Any) -> str:
    """A non-empty string without whitespace (addresses, user names)."""
    if isinstance(v, str) and v and not any(c.isspace() for c in v):
        return v
    raise _Bad()


class _Address(NamedTuple):
    host: str
    port: int | None  # the port written in the address ("h5:2222"), if any


_ADDRESS_EXPECTED = (
    "a host name or IP address, optionally with a port: host, host:port, an IPv6 address, "
    "or [IPv6]:port (a string without spaces)"
)
_ADDRESS_V6_RE = re.compile(r"\[(?P<v6>[^\]\s]+)\](?::(?P<port>[^:]*))?")


def _split_address(v: str) -> _Address:
    """``host``, ``host:port``, a bare IPv6 address (two or more colons, no port) or
    ``[v6]`` / ``[v6]:port``. A port written here is what the user meant, never part of the
    host name: ssh would otherwise look up a host called "h5:2222"."""
    if not v or any(c.isspace() for c in v):
        raise _Bad(_ADDRESS_EXPECTED, got=v)
    if v.startswith("["):
        m = _ADDRESS_V6_RE.fullmatch(v)
        if m is None:
            raise _Bad(_ADDRESS_EXPECTED, got=v)
        host, port_text = m["v6"], m["port"]
    elif v.count(":") == 1:
        host, port_text = v.split(":")
    else:
        host, port_text = v, None
    if not host:
        raise _Bad(_ADDRESS_EXPECTED, got=v)
    if port_text is None:
        return _Address(host, None)
    if not re.fullmatch(r"[0-9]{1,5}", port_text) or not 1 <= int(port_text) <= 65535:
        raise _Bad("a port 1..65535 after the ':' of host:port", got=v)
    return _Address(host, int(port_text))


def _address(v: Any) -> _Address:
    if not isinstance(v, str):
        raise _Bad()
    return _split_address(v)


def _name(v: Any) -> str:
    if isinstance(v, str) and NAME_RE.fullmatch(v):
        return v
    raise _Bad()


def _local_path(v: Any) -> str:
    return os.path.expanduser(_text(v))


def _optional_local_path(v: Any) -> str:
    if v == "":
        return ""
    return _local_path(v)


def _paths(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        return (_local_path(v),)
    if isinstance(v, list):
        return tuple(_local_path(p) for p in v)
    raise _Bad()


def _labels(v: Any) -> tuple[str, ...]:
    if isinstance(v, list) and all(isinstance(s, str) and s for s in v):
        return tuple(v)
    raise _Bad()


def _env(v: Any) -> dict[str, str]:
    if not isinstance(v, dict):
        raise _Bad()
    for key, value in v.items():
        if not _ENV_NAME_RE.fullmatch(key):
            raise _Bad("environment variable names ([A-Za-z_][A-Za-z0-9_]*)", got=key)
        if not isinstance(value, str):
            raise _Bad("a string", got=value, field=f"env.{key}")
    return dict(v)


def _transport(v: Any) -> str:
    if v in ("ssh", "local"):
        return str(v)
    raise _Bad()


class _Jump(NamedTuple):
    user: str | None
    host: str
    port: int | None


_JUMP_EXPECTED = (
    'inventory host names or [user@]host[:port], comma-separated, or "none" for no jump'
)


def _parse_jump(element: str) -> _Jump:
    m = _JUMP_RE.fullmatch(element)
    if m is None:
        raise _Bad(got=element)
    port = None
    if m["port"] is not None:
        port = int(m["port"])
        if not 1 <= port <= 65535:
            raise _Bad(f"a jump host port 1..65535 in {_JUMP_EXPECTED}", got=element)
    return _Jump(m["user"], m["v6"] or m["host"], port)


def _proxy_jump(v: Any) -> str | None:
    """The raw jump spec, checked for syntax; "none" (as in OpenSSH) means no jump."""
    if not isinstance(v, str) or not v.strip():
        raise _Bad()
    if v.strip().lower() == "none":
        return None
    for element in v.split(","):
        _parse_jump(element.strip())
    return v.strip()


# Ranks per host: far above any machine's GPU count, far below what would exhaust the
# controller or the agent when it starts that many processes.
MAX_SLOTS = 4096
_SLOTS_EXPECTED = f"an integer 1..{MAX_SLOTS}"

_COMMON_FIELDS: dict[str, _Check] = {
    "port": _Check("an integer 1..65535", _int_range(1, 65535)),
    "user": _Check("a user name (a string without spaces)", _token),
    "identity_file": _Check("a path or a list of paths (strings)", _paths),
    "python": _Check("a Python interpreter command or path (a string)", _text),
    "state_dir": _Check("a directory path on the host (a string)", _text),
    "labels": _Check("a list of strings", _labels),
    "sim_gpus": _Check("an integer >= 0", _int_range(0)),
    "env": _Check('a table of strings (NAME = "value")', _env),
    "connect_timeout": _Check("a number of seconds > 0", _seconds(positive=True)),
    "keepalive": _Check("a number of seconds >= 0 (0 = off)", _seconds(positive=False)),
}
def _retention(v: Any) -> Retention:
    """``[defaults.retention]``: max_age_days (a number > 0) and max_jobs (an integer >= 1)."""
    if not isinstance(v, dict):
        raise _Bad("a table with max_age_days and/or max_jobs")
    unknown = sorted(set(v) - {"max_age_days", "max_jobs"})
    if unknown:
        raise _Bad("only max_age_days (days > 0) and max_jobs (an integer >= 1)", got=unknown[0])
    age = v.get("max_age_days", Retention.max_age_days)
    jobs = v.get("max_jobs", Retention.max_jobs)
    if not ((_is_int(age) or isinstance(age, float)) and math.isfinite(age) and age > 0):
        raise _Bad("max_age_days: a number of days > 0", got=age)
    if not (_is_int(jobs) and jobs >= 1):
        raise _Bad("max_jobs: an integer >= 1", got=jobs)
    return Retention(float(age), int(jobs))


_DEFAULT_FIELDS: dict[str, _Check] = {
    **_COMMON_FIELDS,
    "min_free_mb": _Check("a number of MB >= 0 (launch refuses a host with less free for its job files)",
                          _seconds(positive=False)),
    "retention": _Check("a table: max_age_days = N, max_jobs = N (when ended job dirs are removed)",
                        _retention),
    "known_hosts": _Check("a path (a string)", _local_path),
    "ssh_config": _Check('a path (a string; "" disables it)', _optional_local_path),
}
_HOST_FIELDS: dict[str, _Check] = {
    **_COMMON_FIELDS,
    "name": _Check("a name of letters, digits, '.', '_' and '-'", _name),
    "address": _Check(_ADDRESS_EXPECTED, _address),
    "proxy_jump": _Check(_JUMP_EXPECTED, _proxy_jump),
    "slots": _Check(_SLOTS_EXPECTED, _int_range(1, MAX_SLOTS)),
    "transport": _Check('"ssh" or "local"', _transport),
}
_TOP_LEVEL = ("defaults", "hosts")


def _unknown_field(key: str, known: Sequence[str]) -> str:
    hint = difflib.get_close_matches(key, known, n=1)
    did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
    return f"one of the known fields {', '.join(sorted(known))}{did_you_mean}"


def _checked(
    raw: Mapping[str, Any],
    checks: Mapping[str, _Check],
    path: Path | None,
    host: str | None,
    line: int | None = None,
) -> dict[str, Any]:
    """Check every key of one table; unknown keys are errors."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        check = checks.get(key)
        if check is None:
            raise InventoryError(path, host, key, _unknown_field(key, list(checks)), line=line)
        try:
            out[key] = check.convert(value)
        except _Bad as bad:
            raise InventoryError(
                path,
                host,
                bad.field or key,
                bad.expected or check.expected,
                value if bad.got is None else bad.got,
                line=line,
            ) from None
    return out


# ---------------------------------------------------------------------------------------------
# OpenSSH client config.


class _SshConfig:
    """A parsed ssh config file, or an empty stand-in when there is none."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.config: paramiko.SSHConfig | None = None
        if path is None or not path.is_file():
            return
        try:
            self.config = paramiko.SSHConfig.from_path(str(path))
        except paramiko.ssh_exception.ConfigParseError as e:
            raise InventoryError(path, None, None, f"a valid OpenSSH client config ({e})") from None
        except (OSError, UnicodeDecodeError) as e:
            raise InventoryError(path, None, None, f"a readable ssh config ({e})") from None

    def lookup(self, alias: str) -> dict[str, Any]:
        """The options for ``alias``; {} without a config."""
        if self.config is None:
            return {}
        try:
            return dict(self.config.lookup(alias))
        except paramiko.ssh_exception.CouldNotCanonicalize as e:
            raise InventoryError(
                self.path, alias, None, f"a host name the ssh config can canonicalize ({e})"
            ) from None

    def has_hostname(self, alias: str) -> bool:
        """Whether a Host block naming ``alias`` literally (not by wildcard) sets HostName.

        ``lookup`` invents HostName = alias for names it does not know, so its answer cannot
        tell a configured alias from a typo.
        """
        if self.config is None:
            return False
        # paramiko has no public view of its parsed blocks.
        for block in getattr(self.config, "_config", []):
            patterns = block.get("host") or []
            negated = any(p.startswith("!") and fnmatch.fnmatch(alias, p[1:]) for p in patterns)
            if alias in patterns and not negated and "hostname" in block.get("config", {}):
                return True
        return False

    def port(self, options: Mapping[str, Any], host: str) -> int | None:
        if "port" not in options:
            return None
        value = options["port"]
        try:
            port = int(value)
        except ValueError:
            port = 0
        if not 1 <= port <= 65535:
            raise InventoryError(self.path, host, "Port", "an integer 1..65535", value)
        return port

    def proxy_jump(self, options: Mapping[str, Any], host: str) -> str | None:
        if "proxyjump" not in options:
            return None
        value = options["proxyjump"]
        try:
            return _proxy_jump(value)
        except _Bad as bad:
            raise InventoryError(
                self.path, host, "ProxyJump", bad.expected or _JUMP_EXPECTED, value
            ) from None


def _identity_files(options: Mapping[str, Any]) -> tuple[str, ...] | None:
    files = options.get("identityfile")
    if not files:
        return None
    return tuple(os.path.expanduser(f) for f in files)


# ---------------------------------------------------------------------------------------------
# Resolution: host entry > ssh config > [defaults] > built-in defaults.


class _Resolver:
    """Turns raw host entries of one file into HostSpecs."""

    def __init__(self, path: Path | None, defaults: dict[str, Any]) -> None:
        self.path = path
        self.defaults = defaults
        ssh_config = defaults.get("ssh_config", os.path.expanduser(DEFAULT_SSH_CONFIG))
        self.ssh_path = Path(ssh_config) if ssh_config else None
        self.ssh = _SshConfig(self.ssh_path)
        self.known_hosts = Path(
            defaults.get("known_hosts", os.path.expanduser(DEFAULT_KNOWN_HOSTS))
        )

    def resolve(
        self,
        raw: Any,
        label: str,
        *,
        alias: str | None = None,
        fallback_address: str | None = None,
        line: int | None = None,
    ) -> HostSpec:
        """One host. ``alias`` is the name looked up in the ssh config (default: the name)."""
        if not isinstance(raw, dict):
            raise InventoryError(self.path, label, None, "a table ([[hosts]])", raw, line=line)
        entry = _checked(raw, _HOST_FIELDS, self.path, label, line)
        if "name" not in entry:
            raise InventoryError(self.path, label, "name", "a host name (required)", line=line)
        name: str = entry["name"]
        transport: str = entry.get("transport", "ssh")
        # A local host is not reached over SSH, so the ssh config has nothing to say about it.
        options = self.ssh.lookup(alias or name) if transport == "ssh" else {}

        def pick(key: str, from_ssh: Any, builtin: Any) -> Any:
            if key in entry:
                return entry[key]
            if from_ssh is not None:
                return from_ssh
            return self.defaults.get(key, builtin)

        address_port: int | None = None
        if "address" in entry:
            address, address_port = entry["address"]
            if address_port is not None and entry.get("port", address_port) != address_port:
                raise InventoryError(
                    self.path,
                    name,
                    "port",
                    f"no port, or the port the address names ({address_port}), "
                    f"as address = {raw['address']!r}",
                    entry["port"],
                    line=line,
                )
        elif transport == "ssh" and self.ssh.has_hostname(alias or name):
            address = options["hostname"]
        elif fallback_address is not None:
            address = fallback_address
        elif transport == "local":
            address = "localhost"
        else:
            where = f"the ssh config {self.ssh_path}" if self.ssh_path else "an ssh config"
            raise InventoryError(
                self.path,
                name,
                "address",
                f"a host name or IP address (required unless {where} has a "
                f"'Host {alias or name}' block with HostName)",
                line=line,
            )

        if "proxy_jump" in entry:
            proxy_jump = entry["proxy_jump"]
        else:
            proxy_jump = self.ssh.proxy_jump(options, name)
        if proxy_jump is not None and transport == "local":
            raise InventoryError(
                self.path,
                name,
                "proxy_jump",
                'no jump host for transport = "local"',
                proxy_jump,
                line=line,
            )
        env = {**self.defaults.get("env", {}), **entry.get("env", {})}
        return HostSpec(
            name=name,
            address=address,
            port=address_port or pick("port", self.ssh.port(options, name), 22),
            user=pick("user", options.get("user"), None) or _local_user(),
            identity_files=pick("identity_file", _identity_files(options), ()),
            python=pick("python", None, "python3"),
            state_dir=pick("state_dir", None, "~/.rigdeck"),
            labels=pick("labels", None, ()),
            proxy_jump=proxy_jump,
            slots=entry.get("slots"),
            sim_gpus=pick("sim_gpus", None, 0),
            env=tuple(sorted(env.items())),
            transport=transport,
            connect_timeout=pick("connect_timeout", None, 10.0),
            keepalive=pick("keepalive", None, 15.0),
        )

    def inventory(self, hosts: list[HostSpec], lines: Sequence[int | None] = ()) -> Inventory:
        seen: dict[str, int] = {}
        for i, host in enumerate(hosts):
            if host.name in seen:
                first = seen[host.name]
                where = f"line {lines[first]}" if lines else f"hosts[{first}]"
                raise InventoryError(
                    self.path,
                    host.name,
                    "name",
                    f"a name no other host has ({where} has it too)",
                    host.name,
                    line=lines[i] if lines else None,
                )
            seen[host.name] = i
        inv = Inventory(tuple(hosts), self.path, self.known_hosts, self.ssh_path,
                        min_free_mb=self.defaults.get("min_free_mb", Inventory.min_free_mb),
                        retention=self.defaults.get("retention") or Retention())
        # Loops in proxy_jump are the file's fault: report them when it is loaded.
        for host in hosts:
            _jump_chain(inv, host, self.ssh)
        return inv


# ---------------------------------------------------------------------------------------------
# Loading.


def default_inventory_path() -> Path:
    """$RIGDECK_INVENTORY, or ~/.config/rigdeck/hosts.toml."""
    env = os.environ.get(INVENTORY_ENV)
    return Path(os.path.expanduser(env or DEFAULT_INVENTORY))


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(path, None, None, "an existing inventory file") from None
    except UnicodeDecodeError as e:
        raise InventoryError(path, None, None, f"UTF-8 text ({e})") from None
    except OSError as e:
        raise InventoryError(path, None, None, f"a readable file ({e.strerror or e})") from None


def _looks_like_hostfile(text: str) -> bool:
    lines = [ln.split("#", 1)[0].strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln]
    return bool(lines) and all(_HOSTFILE_LINE_RE.fullmatch(ln) for ln in lines)


def load_inventory(path: str | os.PathLike[str] | None = None) -> Inventory:
    """Load an inventory (TOML, or a hostfile); None means the default location.

    With no path and no $RIGDECK_INVENTORY, a missing default file means this machine alone.
    A path given explicitly (argument or $RIGDECK_INVENTORY) must exist.
    """
    if path is None:
        target = default_inventory_path()
        if not os.environ.get(INVENTORY_ENV) and not target.exists():
            return local_inventory()
    else:
        target = Path(os.path.expanduser(os.fspath(path)))
    text = _read(target)
    if target.suffix.lower() != ".toml" and _looks_like_hostfile(text):
        return _hostfile_inventory(text, target, None)
    return _toml_inventory(text, target)


def _toml_inventory(text: str, path: Path) -> Inventory:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InventoryError(path, None, None, f"valid TOML ({e})") from None
    for key in data:
        if key not in _TOP_LEVEL:
            expected = "only a [defaults] table and [[hosts]] entries at the top level"
            raise InventoryError(path, None, key, expected, data[key])
    defaults_raw = data.get("defaults", {})
    if not isinstance(defaults_raw, dict):
        raise InventoryError(path, None, "defaults", "a table ([defaults])", defaults_raw)
    hosts_raw = data.get("hosts", [])
    if not isinstance(hosts_raw, list):
        raise InventoryError(path, None, "hosts", "an array of tables ([[hosts]])", hosts_raw)
    resolver = _Resolver(path, _checked(defaults_raw, _DEFAULT_FIELDS, path, "[defaults]"))
    hosts = []
    for i, raw in enumerate(hosts_raw):
        name = raw.get("name") if isinstance(raw, dict) else None
        label = name if isinstance(name, str) and NAME_RE.fullmatch(name) else f"hosts[{i}]"
        hosts.append(resolver.resolve(raw, label))
    return resolver.inventory(hosts)


def local_inventory() -> Inventory:
    """This machine alone, run without SSH: what rigdeck uses when there is no inventory."""
    host = HostSpec(
        name=_sanitize(socket.gethostname()),
        address="localhost",
        transport="local",
        python=sys.executable or "python3",
        state_dir="~/.rigdeck",
    )
    return Inventory(
        hosts=(host,),
        path=None,
        known_hosts=Path(os.path.expanduser(DEFAULT_KNOWN_HOSTS)),
        ssh_config=Path(os.path.expanduser(DEFAULT_SSH_CONFIG)),
    )


# ---------------------------------------------------------------------------------------------
# Hostfiles (DeepSpeed: "host slots=N"; Open MPI: also "max_slots=M" and "user@host").

_HOSTFILE_EXPECTED = "a line 'HOSTNAME [slots=N] [max_slots=M]'"


def _sanitize(hostname: str) -> str:
    """An inventory name for a host name that may hold other characters (IPv6, brackets)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", hostname).strip("-") or "host"


def load_hostfile(
    path: str | os.PathLike[str], defaults: Mapping[str, Any] | None = None
) -> Inventory:
    """An inventory from a DeepSpeed/MPI hostfile; ``defaults`` is a [defaults] table."""
    target = Path(os.path.expanduser(os.fspath(path)))
    return _hostfile_inventory(_read(target), target, defaults)


def _hostfile_inventory(text: str, path: Path, defaults: Mapping[str, Any] | None) -> Inventory:
    resolver = _Resolver(path, _checked(defaults or {}, _DEFAULT_FIELDS, path, "[defaults]"))
    hosts: list[HostSpec] = []
    lines: list[int | None] = []
    for lineno, raw_line in enumerate(text.splitlines(), start=1):
        content = raw_line.split("#", 1)[0].strip()
        if not content:
            continue
        first, *rest = content.split()
        user, at, hostname = first.rpartition("@")
        if not hostname or "=" in first or (at and not user):
            raise InventoryError(path, None, None, _HOSTFILE_EXPECTED, content, line=lineno)
        name = _sanitize(hostname)
        try:  # "h5:2222" is host h5 on port 2222, as in an inventory's address
            host, port = _split_address(hostname)
        except _Bad as bad:
            raise InventoryError(
                path, name, "address", bad.expected or _ADDRESS_EXPECTED, hostname, line=lineno
            ) from None
        entry: dict[str, Any] = {"name": name, "slots": 1}
        if user:
            entry["user"] = user
        if port is not None:
            entry["port"] = port
        for token in rest:
            key, eq, value = token.partition("=")
            key = key.lower().replace("-", "_")
            if not eq or key not in ("slots", "max_slots"):
                raise InventoryError(
                    path,
                    name,
                    None,
                    f"slots=N or max_slots=M after the host name ({token!r})",
                    line=lineno,
                )
            # [0-9] and not isdigit(): "²" is a digit to Python but not to int().
            if not re.fullmatch(r"[0-9]+", value) or not 1 <= int(value) <= MAX_SLOTS:
                raise InventoryError(path, name, key, _SLOTS_EXPECTED, value, line=lineno)
            if key == "slots":
                entry["slots"] = int(value)
            # max_slots only caps oversubscription in Open MPI; rigdeck does not oversubscribe.
        hosts.append(
            resolver.resolve(entry, name, alias=host, fallback_address=host, line=lineno)
        )
        lines.append(lineno)
    if not hosts:
        raise InventoryError(path, None, None, f"at least one host: {_HOSTFILE_EXPECTED}")
    return resolver.inventory(hosts, lines)


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _toml_str(s: str) -> str:
    out = []
    for ch in s:
        if ch in _TOML_ESCAPES:
            out.append(_TOML_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return _toml_str(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        if not v:
            return "{}"
        return "{ " + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def hostfile_to_toml(inv: Inventory) -> str:
    """TOML text for ``inv`` that ``load_inventory`` reads back to the same hosts.

    Everything the ssh config resolved is written out explicitly, so later edits to the ssh
    config do not change these hosts; remove a line to have it resolved again.
    """
    ssh = _SshConfig(inv.ssh_config)
    source = str(inv.path).replace("\n", " ") if inv.path else "the built-in inventory"
    out = [
        f"# rigdeck inventory, imported from {source}",
        "# Values the ssh config resolved are written out; delete a line to resolve it again.",
        "",
        "[defaults]",
        f"known_hosts = {_toml_str(str(inv.known_hosts))}",
        f"ssh_config = {_toml_str(str(inv.ssh_config) if inv.ssh_config else '')}",
    ]
    builtin = HostSpec(name="-", address="-")
    for h in inv.hosts:
        options = ssh.lookup(h.name) if not h.is_local else {}
        fields: dict[str, Any] = {"name": h.name, "address": h.address}
        if h.is_local:
            fields["transport"] = h.transport
        fields["port"] = h.port
        fields["user"] = h.user
        # An empty list still has to be written when the ssh config would otherwise add one.
        if h.identity_files or "identityfile" in options:
            fields["identity_file"] = list(h.identity_files)
        if h.proxy_jump is not None:
            fields["proxy_jump"] = h.proxy_jump
        elif "proxyjump" in options and str(options["proxyjump"]).lower() != "none":
            fields["proxy_jump"] = "none"
        for key in (
            "python",
            "state_dir",
            "labels",
            "slots",
            "sim_gpus",
            "env",
            "connect_timeout",
            "keepalive",
        ):
            value = getattr(h, key)
            if value != getattr(builtin, key):
                fields[key] = dict(value) if key == "env" else value
        out += ["", "[[hosts]]"]
        out += [f"{key} = {_toml_value(value)}" for key, value in fields.items()]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Jump hosts.


def jump_chain(inv: Inventory, host: HostSpec) -> list[HostSpec]:
    """The hosts to go through to reach ``host``, first hop first; [] for a direct connection.

    Each element of ``proxy_jump`` is an inventory host's name or ``[user@]host[:port]``
    (resolved through the ssh config, with the target's user, keys and timeouts as defaults).
    As with OpenSSH, only the first hop's own jump setting is followed.
    """
    return _jump_chain(inv, host, _SshConfig(inv.ssh_config))


def _jump_chain(inv: Inventory, host: HostSpec, ssh: _SshConfig) -> list[HostSpec]:
    keyed = _hops(inv, host, host.proxy_jump, [host.name], ssh)
    keys = [host.name]
    for key, _hop in keyed:
        if key in keys:
            loop = " -> ".join([*keys, key])
            raise InventoryError(
                inv.path, host.name, "proxy_jump", f"a jump chain without loops ({loop})"
            )
        keys.append(key)
    return [hop for _key, hop in keyed]


def _hops(
    inv: Inventory,
    root: HostSpec,
    spec: str | None,
    trail: list[str],
    ssh: _SshConfig,
) -> list[tuple[str, HostSpec]]:
    """(identity, hop) pairs for ``spec``, recursing into the first hop's own jump setting.

    ``root`` is the host being reached: its name goes in errors, its settings are the defaults
    of ad-hoc hops.
    """
    if spec is None:
        return []
    out: list[tuple[str, HostSpec]] = []
    for position, element in enumerate(e.strip() for e in spec.split(",")):
        try:
            jump = _parse_jump(element)
        except _Bad as bad:
            raise InventoryError(
                inv.path, root.name, "proxy_jump", bad.expected or _JUMP_EXPECTED, element
            ) from None
        key, hop = _hop(inv, root, element, jump, ssh)
        if key in trail:
            loop = " -> ".join([*trail, key])
            raise InventoryError(
                inv.path, root.name, "proxy_jump", f"a jump chain without loops ({loop})"
            )
        if position == 0:
            out += _hops(inv, root, hop.proxy_jump, [*trail, key], ssh)
        out.append((key, hop))
    return out


def _hop(
    inv: Inventory, target: HostSpec, element: str, jump: _Jump, ssh: _SshConfig
) -> tuple[str, HostSpec]:
    if jump.host in inv.names:
        base = inv.get(jump.host)
        if jump.user is None and jump.port is None:
            return base.name, base
        return base.name, dataclasses.replace(
            base, name=element, user=jump.user or base.user, port=jump.port or base.port
        )
    options = ssh.lookup(jump.host)
    own_keys = _identity_files(options) or ()
    return jump.host, HostSpec(
        name=element,
        address=options.get("hostname", jump.host),
        port=jump.port or ssh.port(options, element) or 22,
        user=jump.user or options.get("user") or target.user,
        identity_files=own_keys + tuple(f for f in target.identity_files if f not in own_keys),
        proxy_jump=ssh.proxy_jump(options, element),
        connect_timeout=target.connect_timeout,
        keepalive=target.keepalive,
    )


def _show(value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = _toml_str(value)
    else:
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
