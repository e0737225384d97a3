"""Loading an inventory: the file, the OpenSSH client config (paramiko's parser) and jump chains.

The data and its field checks live in ``tui.model.inventory``; this module resolves each host
through ``~/.ssh/config`` and so belongs with the other code that reaches hosts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import hashlib
import json
import os
import re
import socket
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import paramiko

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10
    import tomli as tomllib

from tui.model import tomlwrite
from tui.model.fields import Bad, valid
from tui.model.inventory import (  # noqa: F401  (the loader works with the model's checks)
    ADDRESS_EXPECTED,
    DEFAULT_FIELDS,
    DEFAULT_KNOWN_HOSTS,
    DEFAULT_SSH_CONFIG,
    HOST_FIELDS,
    HOSTFILE_EXPECTED,
    INVENTORY_ENV,
    INVENTORY_TABLES,
    JUMP_EXPECTED,
    MAX_SLOTS,
    NAME_RE,
    SLOTS_EXPECTED,
    HostSpec,
    Inventory,
    InventoryError,
    JumpHop,
    Retention,
    ServerSpec,
    SlurmSpec,
    checked_fields,
    checked_port,
    default_inventory_path,
    inventory_name,
    login_user,
    looks_like_hostfile,
    parse_jump,
    parse_proxy_jump,
    read_inventory_text,
    server_spec,
    slurm_spec,
    split_address,
)

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
        if not valid(checked_port, port):
            raise InventoryError(self.path, host, "Port", "an integer 1..65535", value)
        return port

    def proxy_jump(self, options: Mapping[str, Any], host: str) -> str | None:
        if "proxyjump" not in options:
            return None
        value = options["proxyjump"]
        try:
            return parse_proxy_jump(value)
        except Bad as bad:
            raise InventoryError(
                self.path, host, "ProxyJump", bad.expected or JUMP_EXPECTED, value
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
        entry = checked_fields(raw, HOST_FIELDS, self.path, label, line)
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

        address, address_port = self._address(raw, entry, options, alias or name, fallback_address, line)
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
            user=pick("user", options.get("user"), None) or login_user(),
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
            attach_only=pick("attach_only", None, False),
            prometheus_textfile=pick("prometheus_textfile", None, "") or None,
            claim_dir_owner=pick("claim_dir_owner", None, "") or None,
        )

    def _address(self, raw: Mapping[str, Any], entry: Mapping[str, Any], options: Mapping[str, Any], alias: str,
                 fallback_address: str | None, line: int | None) -> tuple[str, int | None]:
        """Where a host is reached, and the port its address names (None: none named): the
        entry's address, else the ssh config's HostName, else the fallback (a hostfile's name),
        else this machine for a local host."""
        name: str = entry["name"]
        transport: str = entry.get("transport", "ssh")
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
            return address, address_port
        if transport == "ssh" and self.ssh.has_hostname(alias):
            return options["hostname"], None
        if fallback_address is not None:
            return fallback_address, None
        if transport == "local":
            return "localhost", None
        where = f"the ssh config {self.ssh_path}" if self.ssh_path else "an ssh config"
        raise InventoryError(
            self.path,
            name,
            "address",
            f"a host name or IP address (required unless {where} has a "
            f"'Host {alias}' block with HostName)",
            line=line,
        )

    def inventory(self, hosts: list[HostSpec], lines: Sequence[int | None] = (),
                  server: ServerSpec | None = None, slurm: SlurmSpec | None = None) -> Inventory:
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
                        retention=self.defaults.get("retention") or Retention(), server=server,
                        slurm=slurm)
        # Loops in proxy_jump are the file's fault: report them when it is loaded.
        for host in hosts:
            _jump_chain(inv, host, self.ssh)
        return inv


# ---------------------------------------------------------------------------------------------
# Loading.








def load_inventory(path: str | os.PathLike[str] | None = None, *, read_slurm: bool = True, fresh: bool = False,
                   accept_new: bool = False) -> Inventory:
    """Load an inventory (TOML, or a hostfile); None means the default location.

    With no path and no $RIGDECK_INVENTORY, a missing default file means this machine alone.
    A path given explicitly (argument or $RIGDECK_INVENTORY) must exist. One with ``[slurm]``
    and no ``[[hosts]]`` gets Slurm's nodes as its hosts (``slurm_nodes_inventory``: read on
    the login host unless ``read_slurm`` is False, again now with ``fresh``; ``accept_new``: a
    login host key known_hosts lacks is accepted and recorded).
    """
    if path is None:
        target = default_inventory_path()
        if not os.environ.get(INVENTORY_ENV) and not target.exists():
            return local_inventory()
    else:
        target = Path(os.path.expanduser(os.fspath(path)))
    text = read_inventory_text(target)
    if target.suffix.lower() != ".toml" and looks_like_hostfile(text):
        return _hostfile_inventory(text, target, None)
    inv = _toml_inventory(text, target)
    if inv.slurm is not None and inv.slurm.read_hosts and read_slurm:
        inv = slurm_nodes_inventory(inv, text, fresh=fresh, accept_new=accept_new)
    return inv


def _toml_inventory(text: str, path: Path) -> Inventory:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InventoryError(path, None, None, f"valid TOML ({e})") from None
    for key in data:
        if key not in INVENTORY_TABLES:
            expected = ("only a [defaults] table, [[hosts]] entries, a [server] table and a [slurm] table "
                        "at the top level")
            raise InventoryError(path, None, key, expected, data[key])
    defaults_raw = data.get("defaults", {})
    if not isinstance(defaults_raw, dict):
        raise InventoryError(path, None, "defaults", "a table ([defaults])", defaults_raw)
    hosts_raw = data.get("hosts", [])
    if not isinstance(hosts_raw, list):
        raise InventoryError(path, None, "hosts", "an array of tables ([[hosts]])", hosts_raw)
    resolver = _Resolver(path, checked_fields(defaults_raw, DEFAULT_FIELDS, path, "[defaults]"))
    hosts = []
    for i, raw in enumerate(hosts_raw):
        name = raw.get("name") if isinstance(raw, dict) else None
        label = name if isinstance(name, str) and NAME_RE.fullmatch(name) else f"hosts[{i}]"
        hosts.append(resolver.resolve(raw, label))
    slurm = slurm_spec(data["slurm"], path) if "slurm" in data else None
    if slurm is not None and not hosts:
        # No [[hosts]]: Slurm's nodes are the hosts, read on the login host when loaded.
        if not slurm.login:
            raise InventoryError(path, "[slurm]", "login", "the host where Slurm's commands run (an "
                                 "~/.ssh/config alias or a host name) when the inventory lists no [[hosts]]: "
                                 "rigdeck reads the hosts from Slurm there")
        hosts = [resolver.resolve({"name": slurm.login}, "[slurm] login")]
        slurm = dataclasses.replace(slurm, read_hosts=True)
    elif slurm is not None and slurm.login and slurm.login not in {h.name for h in hosts}:
        # A login beside the listed hosts (an ~/.ssh/config alias, a host name): Slurm's commands
        # run there, through its agent, as on any host; it runs no job (Slurm places none there
        # unless it is one of Slurm's nodes, and then it is listed by its own name).
        hosts.append(resolver.resolve({"name": slurm.login}, "[slurm] login"))
    server = server_spec(data["server"], path, hosts) if "server" in data else None
    return resolver.inventory(hosts, server=server, slurm=slurm)


# ---------------------------------------------------------------------------------------------
# The hosts of a Slurm cluster, read from Slurm ([slurm] and no [[hosts]]).

SLURM_NODES_TTL_S = 300.0  # Slurm's node list read on the login host is used this long
SLURM_NODES_CACHE = "slurm-nodes.json"  # in RIGDECK_HOME: each inventory's last answer


def slurm_nodes_inventory(inv: Inventory, text: str, *, fresh: bool = False,
                          accept_new: bool = False) -> Inventory:
    """``inv`` (an inventory with ``[slurm]`` and no ``[[hosts]]``: its one host is the login)
    with Slurm's nodes as its hosts: ``scontrol -o show nodes`` on the login host (over SSH, a
    fixed command: no user value reaches its shell), the nodes of ``[slurm] partition`` (all,
    without one), each a host named as Slurm names it, at its NodeAddr, with the ``[defaults]``
    and what ``~/.ssh/config`` says for its name (a ``Host`` pattern with ProxyJump through the
    login, ...). A login that is one of the nodes becomes that node; else it stays the first host
    (Slurm's commands run there, no job does). The answer is kept in RIGDECK_HOME for
    ``SLURM_NODES_TTL_S`` (``fresh``: read again now); an error names the inventory, the field and
    what the login host said."""
    assert inv.slurm is not None and inv.slurm.read_hosts
    login = inv.hosts[0]
    key = str(inv.path)
    digest = hashlib.sha256(text.encode()).hexdigest()
    cache = _read_slurm_cache()
    entry = cache.get(key) if isinstance(cache.get(key), dict) else None
    said: str | None = None
    if (entry and not fresh and entry.get("inventory") == digest and isinstance(entry.get("nodes"), str)
            and 0 <= time.time() - float(entry.get("at") or 0) < SLURM_NODES_TTL_S):
        said = entry["nodes"]
    if said is None:
        said = _ask_slurm_nodes(inv, login, accept_new)
        cache[key] = {"inventory": digest, "at": time.time(), "nodes": said}
        _write_slurm_cache(cache)
    from tui.model.slurm import NODES_ARGS, SlurmParseError, parse_nodes

    try:
        nodes = parse_nodes(said, " ".join(NODES_ARGS))
    except SlurmParseError as e:
        raise InventoryError(inv.path, "[slurm]", "login", f"Slurm's nodes as scontrol lists them ({e})",
                             login.name) from None
    part = inv.slurm.partition
    wanted = [n for n in nodes if part is None or part in n.partitions]
    if not wanted:
        what = f"partition {part!r}" if part else "Slurm"
        raise InventoryError(inv.path, "[slurm]", "partition" if part else "login",
                             f"nodes to run jobs on: {' '.join(NODES_ARGS)} on {login.name} lists none "
                             f"in {what}", part or login.name)
    data = tomllib.loads(text)
    resolver = _Resolver(inv.path, checked_fields(data.get("defaults", {}), DEFAULT_FIELDS, inv.path,
                                                  "[defaults]"))
    hosts: list[HostSpec] = []
    merged: str | None = None
    for n in wanted:
        if not NAME_RE.fullmatch(n.name):
            raise InventoryError(inv.path, "[slurm]", "login", "Slurm node names of letters, digits, '.', '_' "
                                 "and '-'", n.name)
        address = n.address or n.hostname or n.name
        hosts.append(resolver.resolve({"name": n.name, "address": address}, f"Slurm node {n.name}"))
        if merged is None and {login.address, login.name} & {address, n.hostname, n.name}:
            merged = n.name
    if merged is None:
        hosts.insert(0, login)
    slurm = dataclasses.replace(inv.slurm, login=merged or login.name)
    return resolver.inventory(hosts, server=inv.server, slurm=slurm)


def _slurm_cache_path() -> Path:
    home = os.environ.get("RIGDECK_HOME") or os.path.expanduser("~/.local/share/rigdeck")
    return Path(home) / SLURM_NODES_CACHE


def _read_slurm_cache() -> dict[str, Any]:
    try:
        data = json.loads(_slurm_cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_slurm_cache(cache: dict[str, Any]) -> None:
    path = _slurm_cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(cache, f)
        os.replace(tmp, path)
    except OSError:  # no cache: the next load asks Slurm again
        pass


def _ask_slurm_nodes(inv: Inventory, login: HostSpec, accept_new: bool) -> str:
    """``scontrol -o show nodes`` as the login host prints it; an InventoryError naming the
    login and what went wrong when it cannot be read."""
    from tui.model.slurm import NODES_ARGS
    from tui.remote.transport import TransportError, make_transport

    transport = make_transport(inv, login, accept_new=accept_new)
    try:
        transport.connect()
        result = transport.run(list(NODES_ARGS), timeout=30.0)
    except TransportError as e:
        raise InventoryError(inv.path, "[slurm]", "login", "a login host rigdeck reaches over SSH to read "
                             f"Slurm's nodes there ({e})", login.name) from None
    finally:
        transport.close()
    if result.exit_code != 0:
        tail = " ".join((result.stderr or result.stdout).split())[:300]
        raise InventoryError(inv.path, "[slurm]", "login", f"a login host where {' '.join(NODES_ARGS)} "
                             f"lists Slurm's nodes (it exited {result.exit_code}: {tail})", login.name)
    return result.stdout


def local_inventory() -> Inventory:
    """This machine alone, run without SSH: what rigdeck uses when there is no inventory."""
    host = HostSpec(
        name=inventory_name(socket.gethostname()),
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





def load_hostfile(
    path: str | os.PathLike[str], defaults: Mapping[str, Any] | None = None
) -> Inventory:
    """An inventory from a DeepSpeed/MPI hostfile; ``defaults`` is a [defaults] table."""
    target = Path(os.path.expanduser(os.fspath(path)))
    return _hostfile_inventory(read_inventory_text(target), target, defaults)


def _hostfile_inventory(text: str, path: Path, defaults: Mapping[str, Any] | None) -> Inventory:
    resolver = _Resolver(path, checked_fields(defaults or {}, DEFAULT_FIELDS, path, "[defaults]"))
    hosts: list[HostSpec] = []
    lines: list[int | None] = []
    for lineno, raw_line in enumerate(text.splitlines(), start=1):
        content = raw_line.split("#", 1)[0].strip()
        if not content:
            continue
        first, *rest = content.split()
        user, at, hostname = first.rpartition("@")
        if not hostname or "=" in first or (at and not user):
            raise InventoryError(path, None, None, HOSTFILE_EXPECTED, content, line=lineno)
        name = inventory_name(hostname)
        try:  # "h5:2222" is host h5 on port 2222, as in an inventory's address
            host, port = split_address(hostname)
        except Bad as bad:
            raise InventoryError(
                path, name, "address", bad.expected or ADDRESS_EXPECTED, hostname, line=lineno
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
                raise InventoryError(path, name, key, SLOTS_EXPECTED, value, line=lineno)
            if key == "slots":
                entry["slots"] = int(value)
            # max_slots only caps oversubscription in Open MPI; rigdeck does not oversubscribe.
        hosts.append(
            resolver.resolve(entry, name, alias=host, fallback_address=host, line=lineno)
        )
        lines.append(lineno)
    if not hosts:
        raise InventoryError(path, None, None, f"at least one host: {HOSTFILE_EXPECTED}")
    return resolver.inventory(hosts, lines)


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
            jump = parse_jump(element)
        except Bad as bad:
            raise InventoryError(
                inv.path, root.name, "proxy_jump", bad.expected or JUMP_EXPECTED, element
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
    inv: Inventory, target: HostSpec, element: str, jump: JumpHop, ssh: _SshConfig
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


def hostfile_to_toml(inv: Inventory) -> str:
    """TOML text for ``inv`` that ``load_inventory`` reads back to the same hosts.

    Everything the ssh config resolved is written out explicitly, so later edits to the ssh
    config do not change these hosts; remove a line to have it resolved again.
    """
    ssh = _SshConfig(inv.ssh_config)
    source = str(inv.path).replace("\n", " ") if inv.path else "the built-in inventory"
    out = [
        f"# rigdeck inventory, imported from {source}\n",
        "# Values the ssh config resolved are written out; delete a line to resolve it again.\n",
        "\n",
        tomlwrite.table("defaults", {
            "known_hosts": str(inv.known_hosts),
            "ssh_config": str(inv.ssh_config) if inv.ssh_config else "",
        }),
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
            "attach_only",
        ):
            value = getattr(h, key)
            if value != getattr(builtin, key):
                fields[key] = dict(value) if key == "env" else value
        # One [[hosts]] table a host, one key a line; a table value (env) follows as [hosts.KEY].
        out += ["\n", tomlwrite.table("hosts", fields, array=True)]
    if inv.server is not None:
        server: dict[str, Any] = {"host": inv.server.host, "state_dir": inv.server.state_dir}
        if inv.server.python is not None:
            server["python"] = inv.server.python
        if inv.server.metrics_listen is not None:
            server["metrics_listen"] = inv.server.metrics_listen
        if inv.server.allow_jobs:
            server["allow_jobs"] = True
        if inv.server.members_need_join is not None:
            server["members_need_join"] = inv.server.members_need_join
        out += ["\n", tomlwrite.table("server", server)]
    if inv.slurm is not None:
        slurm = {k: v for k, v in dataclasses.asdict(inv.slurm).items() if v is not None and k != "read_hosts"}
        out += ["\n", tomlwrite.table("slurm", slurm)]
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Onboarding: hosts that are not in the inventory yet (from the ssh config, or named by the
# user), and adding them to the inventory file.


def ssh_config_aliases(path: Path | None) -> list[str]:
    """The concrete names of the ssh config's ``Host`` lines, in file order: patterns with
    wildcards (``*``, ``?``) and negations (``!name``) are not hosts one can pick."""
    ssh = _SshConfig(path)
    if ssh.config is None:
        return []
    out: list[str] = []
    for block in getattr(ssh.config, "_config", []):
        for pattern in block.get("host") or []:
            if any(c in pattern for c in "*?!") or pattern in out:
                continue
            out.append(pattern)
    return out


def _defaults_of(target: Path) -> tuple[dict[str, Any], Inventory | None]:
    """The target inventory's checked ``[defaults]`` and the inventory itself, or ({}, None)
    when the file does not exist yet. A file that is not a valid TOML inventory is an error:
    hosts are only ever added to one."""
    if not target.exists():
        return {}, None
    text = read_inventory_text(target)
    existing = _toml_inventory(text, target)
    raw = tomllib.loads(text).get("defaults", {})
    return checked_fields(raw, DEFAULT_FIELDS, target, "[defaults]"), existing


def new_hosts_inventory(
    target: str | os.PathLike[str] | None = None,
    entries: Sequence[Mapping[str, Any]] | None = None,
    skipped: list[str] | None = None,
) -> tuple[Inventory, list[str]]:
    """Hosts to add to the inventory file ``target`` (default: the usual location), resolved
    as the file would resolve them (its ``[defaults]``, then the ssh config): each of
    ``entries`` (a ``[[hosts]]`` table: ``name`` and any of address, user, port, proxy_jump,
    identity_file...), or with no entries every concrete ``Host`` of the ssh config. A name
    without HostName anywhere is its own address, as with ssh.

    Returns an inventory of the file's hosts followed by the new ones (so jump hosts can be
    either), with ``path`` = target, and the new hosts' names. A name the file already has
    is an error naming the file. With ``skipped`` (a list), a host that does not resolve, or
    (ssh config hosts) one the file has already, is left out, its error appended there.
    """
    path = Path(os.path.expanduser(os.fspath(target))) if target is not None else default_inventory_path()
    defaults, existing = _defaults_of(path)
    resolver = _Resolver(path, defaults)
    if entries is None:
        entries = [{"name": inventory_name(alias), "_alias": alias}
                   for alias in ssh_config_aliases(resolver.ssh_path)]
    have = list(existing.hosts) if existing is not None else []
    new: list[HostSpec] = []
    for raw in entries:
        entry = {k: v for k, v in raw.items() if k != "_alias"}
        alias = raw.get("_alias") or entry.get("name")
        label = entry.get("name") if isinstance(entry.get("name"), str) else "hosts[new]"
        try:
            spec = resolver.resolve(entry, str(label), alias=str(alias),
                                    fallback_address=str(alias) if isinstance(alias, str) else None)
        except InventoryError as e:
            if skipped is None:
                raise
            skipped.append(str(e))  # one bad Host block does not hide the others
            continue
        if skipped is not None and any(h.name == spec.name for h in have):
            continue  # offering the ssh config's hosts: those already in the file are not new
        if any(h.name == spec.name for h in have):
            raise InventoryError(path, spec.name, "name", "a name no host of this inventory "
                                 "has yet (it is there already)", spec.name)
        if any(h.name == spec.name for h in new):
            continue
        new.append(spec)
    inv = resolver.inventory([*have, *new], server=existing.server if existing else None)
    return inv, [h.name for h in new]


def _host_table(spec: HostSpec) -> dict[str, Any]:
    """What one new host is written as: everything that was resolved for it, spelled out,
    so that a later change of the ssh config does not change the host."""
    fields: dict[str, Any] = {"name": spec.name, "address": spec.address, "port": spec.port,
                              "user": spec.user}
    if spec.identity_files:
        fields["identity_file"] = list(spec.identity_files)
    if spec.proxy_jump is not None:
        fields["proxy_jump"] = spec.proxy_jump
    return fields


def append_hosts(target: str | os.PathLike[str], hosts: Sequence[HostSpec]) -> Path:
    """Add ``hosts`` to the inventory file ``target`` (created when missing), keeping the
    file's own text as it is (comments and all) and adding one ``[[hosts]]`` table each
    (written with tomli-w). The result is loaded with the real loader before it replaces
    the file (a temporary file in the same directory, then a rename): a name it has already,
    or a result that does not load back to the same hosts, writes nothing."""
    path = Path(os.path.expanduser(os.fspath(target)))
    old = read_inventory_text(path) if path.exists() else (
        "# rigdeck inventory (written by rigdeck's onboarding; edit freely)\n")
    text = old if old.endswith("\n") else old + "\n"
    for spec in hosts:
        text += "\n" + tomlwrite.table("hosts", _host_table(spec), array=True)
    loaded = _toml_inventory(text, path)  # duplicates and bad values fail here, before writing
    for spec in hosts:
        got = loaded.get(spec.name)
        for key in ("address", "port", "user", "identity_files", "proxy_jump"):
            if getattr(got, key) != getattr(spec, key):
                raise InventoryError(path, spec.name, key, f"{getattr(spec, key)!r} once written "
                                     "(the file's other settings change it)", getattr(got, key))
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path
