"""Putting the controller on one of the user's own hosts: ``rigdeck server setup|start|stop|...``.

Runs on the operator's workstation and reaches the server host (the inventory's ``[server]``
table) with the operator's own transport. Nothing needs root, Docker or an open TCP port:

* ``setup`` installs rigdeck in a venv under the server's state dir, from wheels built here
  (``tui.remote.serverwheels``): the workstation's own rigdeck and the installed versions of its
  server-side dependencies, repacked, plus pip, which the host runs from its wheel. The host
  installs them with ``pip install --no-index``, offline: GPU hosts often cannot reach an index,
  and the server host usually has the workstation's platform and Python, so the wheels that
  run here run there. Only when the platforms differ (``Platform.fits``) does the host's own
  index supply the dependencies (rigdeck's wheel, pure Python, is still shipped). Then it gives
  the server an ed25519 key pair of its own, made on the server host (the private key never
  leaves it), installs the public key on every inventory host restricted to the agent's attach
  (``restrict,command="..."``), and writes the server's known_hosts (the operator's recorded
  keys: the server never trusts on first use) and inventory (that key, that known_hosts,
  ``attach_only`` on every host).
* ``start`` runs ``rigdeck serve`` there so that it outlives the SSH session: a
  ``systemd-run --user`` unit where the user's systemd manager answers and lingers, else a
  detached process in its own session; then waits until its unix socket accepts.
* ``stop``, ``status`` and ``logs`` do what they say.

Every command on a host is one ``python -c`` run of ``serverhost``'s helper script
(``agent/serverhelper.py``) with its arguments as argv words, sent through the transport's
base64 ``/bin/sh`` wrapper (``transport.remote_command``): no login shell parses a user value.
The layout of the server's directory is ``tui.model.serverlayout.ServerLayout``.
"""

from __future__ import annotations

import functools
import json
import logging
import posixpath
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from agent import serverhelper
from tui.model import tomlwrite
from tui.model.fairshare import QueuePolicy, policy_to_toml
from tui.model.inventory import HostSpec, Inventory, ServerSpec
from tui.model.serverlayout import ServerLayout
from tui.model.userconfig import NotifyConfig
from tui.remote.serverwheels import Platform, WheelSet, build_wheels
from tui.remote.transport import (
    CommandResult,
    Stream,
    Transport,
    TransportError,
    hostkey_name,
    last_json_object,
    load_host_keys,
    make_transport,
    remote_command,
)

log = logging.getLogger(__name__)

__all__ = [
    "AgentPlace",
    "ServerUser",
    "add_user",
    "attach_command",
    "authorize_member",
    "deauthorize_member",
    "member_comment",
    "ServerHostError",
    "ServerStatus",
    "SetupReport",
    "authorized_key_line",
    "forced_command",
    "key_comment",
    "logs",
    "recorded_host_keys",
    "remove_user",
    "server_config",
    "server_inventory",
    "setup",
    "start",
    "status",
    "stop",
    "user_comment",
    "users",
]

HELPER_SOURCE = Path(serverhelper.__file__).read_text()  # stdlib, 3.9: host-side code lives in agent/
COMMAND_TIMEOUT = 60.0
INSTALL_TIMEOUT = 600.0
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
# Words a forced command may carry unquoted: they mean the same to sh, bash, zsh, fish and csh.
_PLAIN_WORD = re.compile(r"[A-Za-z0-9_./=:,+-]+")


class ServerHostError(Exception):
    """Setting up or running the server failed; the message says where and why."""


class AgentPlace(NamedTuple):
    """Where the controller's deploy put the agent on a host (``HostLinks._deploy_one``)."""

    state_dir: str
    pyz: str


TransportFactory = Callable[[HostSpec], Transport]
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


# ---------------------------------------------------------------------------------------------
# Reports


@dataclass
class ServerStatus:
    """What ``rigdeck server status`` says; ``to_json`` is its --json output."""

    host: str
    state_dir: str
    socket: str
    log: str
    running: bool = False
    listening: bool = False
    pid: int | None = None
    since: str | None = None
    mode: str | None = None  # "systemd" or "process"
    version: str | None = None
    build: str | None = None
    set_up: bool = False
    started: bool | None = None  # start: True when this call started it
    error: str | None = None
    log_tail: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "state_dir": self.state_dir,
            "socket": self.socket,
            "log": self.log,
            "running": self.running,
            "listening": self.listening,
            "pid": self.pid,
            "since": self.since,
            "mode": self.mode,
            "version": self.version,
            "build": self.build,
            "set_up": self.set_up,
        }

    @classmethod
    def _from(cls, host: str, data: Mapping[str, Any]) -> ServerStatus:
        return cls(
            host=host,
            state_dir=str(data.get("state_dir", "")),
            socket=str(data.get("socket", "")),
            log=str(data.get("log", "")),
            running=bool(data.get("running")),
            listening=bool(data.get("listening")),
            pid=data.get("pid"),
            since=data.get("since"),
            mode=data.get("mode"),
            version=data.get("version"),
            build=data.get("build"),
            set_up=bool(data.get("set_up")),
            started=data.get("started"),
            error=data.get("error"),
            log_tail=data.get("log_tail"),
        )


@dataclass
class SetupReport:
    """What ``rigdeck server setup`` did."""

    host: str
    state_dir: str
    python: str
    install: str  # "offline", "index" or "current" (nothing to install)
    platform: str
    version: str
    build: str
    wheels_copied: list[str] = field(default_factory=list)
    key_created: bool = False
    public_key: str = ""
    authorized: dict[str, str] = field(default_factory=dict)  # host -> added/replaced/current
    known_hosts: str = ""
    inventory: str = ""
    elapsed_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "state_dir": self.state_dir,
            "python": self.python,
            "install": self.install,
            "platform": self.platform,
            "version": self.version,
            "build": self.build,
            "wheels_copied": list(self.wheels_copied),
            "key_created": self.key_created,
            "public_key": self.public_key,
            "authorized": dict(self.authorized),
            "known_hosts": self.known_hosts,
            "inventory": self.inventory,
            "elapsed_s": round(self.elapsed_s, 3),
        }


# ---------------------------------------------------------------------------------------------
# Pieces (pure)


def server_of(inventory: Inventory) -> tuple[ServerSpec, HostSpec]:
    """The [server] table and its host; ServerHostError when the inventory has none."""
    srv = inventory.server
    if srv is None:
        where = inventory.path or "the built-in inventory"
        raise ServerHostError(
            f"{where} has no [server] table: add one naming the host that runs the server, "
            'e.g.\n  [server]\n  host = "gpu1"'
        )
    return srv, inventory.get(srv.host)


def key_comment(server_host: str) -> str:
    """The comment that marks the server's key line on every host (one line per server)."""
    return f"rigdeck-server@{server_host}"


def forced_command(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """The command sshd runs for the server's key, through the user's login shell.

    Plain words (``env K=V python3 /path/agent.pyz attach --state-dir /path``) when every word
    means the same to sh, bash, zsh, fish and csh, so that whoever reads authorized_keys sees
    what the key may do; otherwise the transport's base64 ``/bin/sh`` wrapper."""
    words = ["env", *(f"{k}={v}" for k, v in env.items()), *argv] if env else list(argv)
    if words and not words[0].startswith("-") and all(_PLAIN_WORD.fullmatch(w) for w in words):
        return " ".join(words)
    return remote_command(argv, env)


def authorized_key_line(public_key: str, command: str, comment: str) -> str:
    """``restrict,command="..." <type> <base64> <comment>``: the key may run ``command`` and
    nothing else (no pty, no forwarding of ports, agents or X11). Inside sshd's quotes only
    ``\\"`` is an escape, so double quotes are backslash-escaped and nothing else is needed."""
    words = public_key.split()
    if len(words) < 2 or not words[0].startswith("ssh-"):
        raise ServerHostError(f"not an OpenSSH public key: {public_key[:60]!r}")
    if "\n" in command or "\r" in command or command.endswith("\\"):
        raise ServerHostError("a forced command cannot hold a newline or end with a backslash")
    quoted = command.replace('"', '\\"')
    return f'restrict,command="{quoted}" {words[0]} {words[1]} {comment}'


def recorded_host_keys(inventory: Inventory, hosts: Sequence[HostSpec]) -> str:
    """The operator's known_hosts lines for ``hosts`` (as the names ssh looks up), in known_hosts
    format; ServerHostError naming every host whose key is not recorded."""
    keys = load_host_keys(inventory.known_hosts)
    lines: list[str] = []
    missing: list[str] = []
    for spec in hosts:
        name = hostkey_name(spec.address, spec.port)
        entry = keys.lookup(name)
        if not entry:
            missing.append(f"{spec.name} ({name})")
            continue
        for key_type in sorted(entry.keys()):
            lines.append(f"{name} {key_type} {entry[key_type].get_base64()}")
    if missing:
        raise ServerHostError(
            f"setup refused: no recorded host key for {', '.join(missing)} in "
            f"{inventory.known_hosts}. The server trusts only the keys you recorded, never a "
            "key on first use: check the fingerprint out of band, record it with "
            f"`rigdeck hosts {' '.join(m.split()[0] for m in missing)} --accept-new`, then run "
            "setup again."
        )
    return "".join(line + "\n" for line in lines)


def server_inventory(
    inventory: Inventory, layout: ServerLayout, server_host: str
) -> str:
    """The TOML inventory the server uses: every host with its settings written out (the
    server has no ssh config), the server's key and known_hosts, ``attach_only``. Jump hosts
    are dropped: a restricted key cannot forward, and the server reaches hosts directly."""
    defaults: dict[str, Any] = {
        "identity_file": layout.key,
        "known_hosts": layout.known_hosts,
        "ssh_config": "",
        "attach_only": True,
        "min_free_mb": inventory.min_free_mb,
        "retention": {
            "max_age_days": inventory.retention.max_age_days,
            "max_jobs": inventory.retention.max_jobs,
        },
    }
    hosts: list[dict[str, Any]] = []
    for h in inventory.hosts:
        entry: dict[str, Any] = {"name": h.name}
        if h.is_local:
            if h.name != server_host:
                raise ServerHostError(
                    f"host {h.name!r} is this workstation (transport = \"local\"): a server on "
                    f"{server_host} cannot reach it; give it an address, or leave it out"
                )
            entry.update(transport="local", attach_only=False)
        else:
            entry.update(address=h.address, port=h.port, user=h.user)
        entry.update(python=h.python, state_dir=h.state_dir)
        if h.labels:
            entry["labels"] = list(h.labels)
        if h.slots is not None:
            entry["slots"] = h.slots
        if h.sim_gpus:
            entry["sim_gpus"] = h.sim_gpus
        entry.update(connect_timeout=h.connect_timeout, keepalive=h.keepalive)
        if h.prometheus_textfile:
            entry["prometheus_textfile"] = h.prometheus_textfile
        if h.claim_dir_owner:
            entry["claim_dir_owner"] = h.claim_dir_owner
        if h.env:
            entry["env"] = dict(h.env)
        hosts.append(entry)
    head = (
        "# The inventory of the rigdeck server on "
        f"{server_host}, written by `rigdeck server setup`\n"
        "# from the operator's; setup overwrites it.\n"
    )
    data: dict[str, Any] = {"defaults": defaults, "hosts": hosts}
    # The server places jobs: it must know which host is its own and whether jobs may go there.
    allow = bool(inventory.server.allow_jobs) if inventory.server is not None else False
    data["server"] = {"host": server_host, "state_dir": layout.state_dir, "allow_jobs": allow}
    need = inventory.server.members_need_join if inventory.server is not None else None
    if need is not None:  # absent: the default, which the server works out itself
        data["server"]["members_need_join"] = need
    return head + tomlwrite.dumps(data)


def server_config(notify: NotifyConfig | None, server_host: str, policy: QueuePolicy | None = None) -> str:
    """The server's config.toml: the operator's ``[notify]`` table, when there is one, and the
    queue's rules (``[queue]``, ``[[group]]``, ``[[quota]]``) when they are not the defaults."""
    head = (f"# The rigdeck server's config on {server_host}, written by `rigdeck server setup`\n"
            "# from the operator's [notify], [queue], [[group]] and [[quota]]; setup overwrites it.\n")
    data: dict[str, Any] = {}
    if notify is not None and notify.sends:
        data["notify"] = notify.to_toml()
    if policy is not None and policy != QueuePolicy():
        data.update(policy_to_toml(policy))
    return head + tomlwrite.dumps(data) if data else head


# ---------------------------------------------------------------------------------------------
# Running the helper on a host


def _helper(
    t: Transport,
    python: str,
    *args: str,
    input: bytes | None = None,
    timeout: float = COMMAND_TIMEOUT,
    what: str = "",
) -> dict[str, Any]:
    res = _wrap(lambda: t.run([python, "-c", HELPER_SOURCE, *args], input=input, timeout=timeout))
    return _parse(t.name, res, what or args[0])


def _parse(host: str, res: CommandResult, what: str) -> dict[str, Any]:
    value = last_json_object(res.stdout)
    if value is not None:
        if value.get("ok") is False:
            raise ServerHostError(f"{host}: {what} failed: {value.get('error')}")
        return value
    detail = (res.stderr or res.stdout).strip()[-600:]
    raise ServerHostError(f"{host}: {what} failed (exit {res.exit_code}): {detail}")


@contextmanager
def _connected(t: Transport) -> Iterator[Transport]:
    try:
        t.connect()
    except TransportError as e:
        raise ServerHostError(str(e)) from None
    yield t


class _Server(NamedTuple):
    spec: ServerSpec
    host: HostSpec
    python: str
    transport: Transport
    layout: ServerLayout  # absolute paths


@contextmanager
def _host(inventory: Inventory, spec: HostSpec,
          transport: TransportFactory | None) -> Iterator[Transport]:
    """A connected transport to ``spec``: the caller's (left open), or one of our own."""
    t = transport(spec) if transport is not None else make_transport(inventory, spec)
    try:
        with _connected(t):
            yield t
    finally:
        if transport is None:
            t.close()


@contextmanager
def _server(inventory: Inventory, transport: TransportFactory | None) -> Iterator[_Server]:
    srv, host = server_of(inventory)
    with _host(inventory, host, transport) as t:
        state_dir = _wrap(lambda: t.remote_path(srv.state_dir))
        yield _Server(srv, host, srv.python or host.python, t, ServerLayout(state_dir))


def _wrap(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except TransportError as e:
        raise ServerHostError(str(e)) from None


# ---------------------------------------------------------------------------------------------
# setup


def setup(
    inventory: Inventory,
    *,
    deploy: Callable[[Sequence[HostSpec]], Mapping[str, AgentPlace]],
    agent_env: Callable[[HostSpec], Mapping[str, str]],
    transport: TransportFactory | None = None,
    wheels: Callable[[], WheelSet] = build_wheels,
    progress: Progress = _quiet,
    notify: NotifyConfig | None = None,
    policy: QueuePolicy | None = None,
) -> SetupReport:
    """Install, key and configure the server on the [server] host (see the module docstring).

    ``deploy(hosts)`` puts the current agent on those hosts and says where it is on each (the
    controller's deploy); ``agent_env(host)`` is the environment the agent runs with there.
    ``transport(host)`` reaches a host (default: a transport of its own per host). ``notify``:
    the operator's ``[notify]`` table, written to the server's config.toml (none: an empty one,
    so a table the operator removed stops there too). Safe to run again: what is current is
    left alone, the key lines are replaced, never duplicated. ``policy``: the queue's rules,
    written there too.
    """
    t0 = time.monotonic()
    srv, server_host = server_of(inventory)
    ssh_hosts = [h for h in inventory.hosts if not h.is_local]
    # Refuse before touching anything: every host's key must be recorded.
    known_hosts_text = recorded_host_keys(inventory, ssh_hosts)
    server_inventory(inventory, ServerLayout(srv.state_dir), srv.host)  # refuses local hosts
    with _server(inventory, transport) as server:
        t, layout = server.transport, server.layout

        progress(f"{srv.host}: preparing {layout.state_dir}")
        prep = _helper(t, server.python, "prepare", layout.state_dir)
        host_platform = Platform.from_json(prep["platform"])
        if _version(host_platform.python) < (3, 10):
            raise ServerHostError(
                f"{srv.host}: the server needs Python 3.10 or newer, and {server.python} there "
                f"is {host_platform.python}: set python in the [server] table")

        progress(f"deploying the agent to {len(inventory.hosts)} host(s)")
        places = deploy(inventory.hosts)
        missing = [h.name for h in inventory.hosts if h.name not in places]
        if missing:
            raise ServerHostError(f"the agent was not deployed to {', '.join(missing)}")

        progress("building wheels")
        try:
            ws = wheels()
        except Exception as e:  # WheelError, or pip's own failure
            raise ServerHostError(f"building the server's wheels failed: {e}") from None
        report = SetupReport(
            host=srv.host, state_dir=layout.state_dir, python=server.python, install="current",
            platform=host_platform.describe(), version=ws.version, build=ws.build,
        )
        _install(t, server.python, layout, ws, prep, host_platform, report, progress)

        progress(f"{srv.host}: the server's key pair")
        comment = key_comment(srv.host)
        key = _helper(t, layout.venv_python, "keygen", layout.key, comment)
        report.key_created = bool(key.get("created"))
        report.public_key = str(key["public_key"])

        progress(f"installing the server's key on {len(ssh_hosts)} host(s)")
        report.authorized = _authorize_all(
            inventory, ssh_hosts, transport, report.public_key, comment, places, agent_env
        )

        record = {"version": ws.version, "build": ws.build, "server_host": srv.host,
                  "set_up": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "public_key": report.public_key}
        _write(t, server.python, {
            layout.known_hosts: known_hosts_text,
            layout.inventory: server_inventory(inventory, layout, srv.host),
            layout.setup_record: json.dumps(record, indent=1) + "\n",
            layout.config: server_config(notify, srv.host, policy),
        })
        report.known_hosts = layout.known_hosts
        report.inventory = layout.inventory
    report.elapsed_s = time.monotonic() - t0
    return report


def _write(t: Transport, python: str, files: Mapping[str, str]) -> None:
    """Write text files on the host (0600, each atomically), in one command."""
    _helper(t, python, "write", input=json.dumps(dict(files)).encode(),
            what=f"writing {', '.join(files)}")


def _install(
    t: Transport,
    python: str,
    layout: ServerLayout,
    ws: WheelSet,
    prep: Mapping[str, Any],
    host_platform: Platform,
    report: SetupReport,
    progress: Progress,
) -> None:
    offline = ws.platform.fits(host_platform)
    if not offline:
        log.warning("%s: %s differs from this machine's %s: dependencies come from the host's "
                    "own index", t.name, host_platform.describe(), ws.platform.describe())
    there: Mapping[str, str] = prep.get("wheels") or {}
    shas = {p.name: _file_sha256(p) for p in ws.files}
    for p in ws.files:
        if there.get(p.name) != shas[p.name]:
            progress(f"{t.name}: copying {p.name}")
            _wrap(functools.partial(t.put_file, p, posixpath.join(layout.wheels, p.name), mode=0o600))
            report.wheels_copied.append(p.name)
    wanted: dict[str, Any] = {"mode": "offline" if offline else "index", "wheels": shas}
    installed = prep.get("installed") or {}
    if installed == wanted:
        return
    same_mode = installed.get("mode") == wanted["mode"]
    before: Mapping[str, str] = (installed.get("wheels") or {}) if same_mode else {}
    if offline:
        # Only what changed, exactly these files (--no-deps: the set is already complete).
        names = [p.name for p in (*ws.dependencies, ws.rigdeck) if before.get(p.name) != shas[p.name]]
        plan = {"pip": ws.pip.name, "offline": names, "index": [], "record": wanted}
    else:
        plan = {"pip": ws.pip.name, "offline": [ws.rigdeck.name],
                "index": list(ws.requirements), "record": wanted}
    report.install = wanted["mode"]
    progress(f"{t.name}: installing {len(plan['offline'])} wheel(s) into {layout.venv}"
             + ("" if offline else " and the dependencies from the host's index"))
    _helper(t, python, "install", layout.state_dir, json.dumps(plan),
            timeout=INSTALL_TIMEOUT, what="installing the server's venv")


def _file_sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _authorize_all(
    inventory: Inventory,
    hosts: Sequence[HostSpec],
    transport: TransportFactory | None,
    public_key: str,
    comment: str,
    places: Mapping[str, AgentPlace],
    agent_env: Callable[[HostSpec], Mapping[str, str]],
) -> dict[str, str]:
    said = _authorize_each(inventory, hosts, transport, public_key, comment, places, agent_env)
    return {h: "current" if not out.get("changed") else "replaced" if out.get("removed") else "added"
            for h, out in said.items()}


def member_comment(server_host: str, person: str) -> str:
    """The comment that marks the server's key line in a person's own authorized_keys on a host
    (``rigdeck server join``): one line per server and person."""
    return f"rigdeck-server:{server_host}:{person}"


def authorize_member(
    inventory: Inventory,
    hosts: Sequence[HostSpec],
    public_key: str,
    comment: str,
    places: Mapping[str, AgentPlace],
    agent_env: Callable[[HostSpec], Mapping[str, str]],
    transport: TransportFactory | None = None,
    join_tag: Any = None,
) -> dict[str, str]:
    """``rigdeck server join``'s part on the hosts, run with the person's own access: the server's
    ``public_key`` in the person's own ``~/.ssh/authorized_keys`` on each of ``hosts``, restricted
    to their own agent's attach (``places``: where their agent is) with the tag the server issued
    to them (``join_tag``: its attach says it to the server, which accepts the join only through a
    line carrying the person's own tag). Returns host -> the account the line went to (as the
    host says it)."""
    if not isinstance(join_tag, str) or not re.fullmatch(r"[0-9a-f]{32}", join_tag):
        raise ServerHostError("join: the server gave no key line tag (32 hex digits): a server older than "
                              "this rigdeck? (rigdeck server setup, then start it again)")
    said = _authorize_each(inventory, hosts, transport, public_key, comment, places, agent_env, join_tag)
    missing = [h for h, out in said.items() if not isinstance(out.get("user"), str)]
    if missing:
        raise ServerHostError(f"{', '.join(missing)}: the host did not say which account the key went to")
    return {h: str(out["user"]) for h, out in said.items()}


def deauthorize_member(inventory: Inventory, hosts: Sequence[HostSpec], comment: str,
                       transport: TransportFactory | None = None) -> None:
    """``rigdeck server leave``'s part on the hosts, with the person's own access: the server's
    key line (``comment``) out of their own ``authorized_keys`` on each of ``hosts``."""
    errors = []
    for spec in hosts:
        try:
            with _host(inventory, spec, transport) as t:
                _helper(t, spec.python, "deauthorize", comment, what="removing the server's key")
        except (ServerHostError, TransportError) as e:
            errors.append(str(e))
    if errors:
        raise ServerHostError("removing the server's key failed: " + "; ".join(errors))


def _authorize_each(
    inventory: Inventory,
    hosts: Sequence[HostSpec],
    transport: TransportFactory | None,
    public_key: str,
    comment: str,
    places: Mapping[str, AgentPlace],
    agent_env: Callable[[HostSpec], Mapping[str, str]],
    join_tag: str | None = None,
) -> dict[str, dict[str, Any]]:
    """The key line on each host (in parallel): host -> what the helper's ``authorize`` said.
    ``join_tag``: a person's line (``rigdeck server join``) carries the tag issued to them."""
    def one(spec: HostSpec) -> dict[str, Any]:
        place = places[spec.name]
        argv = [spec.python, place.pyz, "attach", "--state-dir", place.state_dir, "--role", "server",
                *(["--join-tag", join_tag] if join_tag else [])]
        line = authorized_key_line(public_key, forced_command(argv, agent_env(spec)), comment)
        with _host(inventory, spec, transport) as t:
            return dict(_helper(t, spec.python, "authorize", line, comment,
                                what="installing the server's key"))

    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(hosts)), thread_name_prefix="authz") as pool:
        futures = {h.name: pool.submit(one, h) for h in hosts}
        results: dict[str, dict[str, Any]] = {}
        errors: list[str] = []
        for name, fut in futures.items():
            try:
                results[name] = fut.result()
            except (ServerHostError, TransportError) as e:
                errors.append(str(e))
    if errors:
        raise ServerHostError("installing the server's key failed: " + "; ".join(errors))
    return results


# ---------------------------------------------------------------------------------------------
# start / stop / status / logs


def start(
    inventory: Inventory,
    *,
    command: Sequence[str] | None = None,
    timeout: float = START_TIMEOUT,
    transport: TransportFactory | None = None,
) -> ServerStatus:
    """Start the server on its host unless it runs (``started`` says which), and wait until
    its socket accepts. ``command`` replaces ``<venv>/bin/rigdeck serve --state-dir DIR
    [--metrics-listen ADDR:PORT]`` (the latter from the [server] table's ``metrics_listen``)."""
    with _server(inventory, transport) as server:
        argv = list(command) if command is not None else server.layout.serve_argv(server.spec.metrics_listen)
        out = _helper(server.transport, server.python, "start", server.layout.state_dir,
                      f"{timeout:g}", json.dumps(argv), timeout=timeout + COMMAND_TIMEOUT)
    st = ServerStatus._from(server.spec.host, out)
    if st.error:
        tail = f"\n--- last lines of {st.log} ---\n{st.log_tail.rstrip()}" if st.log_tail else ""
        raise ServerHostError(f"{server.spec.host}: {st.error}{tail}")
    return st


def stop(
    inventory: Inventory,
    *,
    timeout: float = STOP_TIMEOUT,
    transport: TransportFactory | None = None,
) -> tuple[ServerStatus, bool]:
    """Stop the server (SIGTERM, then SIGKILL after ``timeout``); (status, whether it ran)."""
    with _server(inventory, transport) as server:
        out = _helper(server.transport, server.python, "stop", server.layout.state_dir,
                      f"{timeout:g}", timeout=timeout + COMMAND_TIMEOUT)
    return ServerStatus._from(server.spec.host, out), bool(out.get("was_running"))


def status(inventory: Inventory, *, transport: TransportFactory | None = None) -> ServerStatus:
    with _server(inventory, transport) as server:
        out = _helper(server.transport, server.python, "status", server.layout.state_dir)
    return ServerStatus._from(server.spec.host, out)


def logs(
    inventory: Inventory,
    write: Callable[[bytes], None],
    *,
    lines: int = 50,
    follow: bool = False,
    transport: TransportFactory | None = None,
) -> None:
    """The last ``lines`` lines of server.log to ``write``; with ``follow``, then what is
    appended, until interrupted (KeyboardInterrupt closes the stream and is re-raised)."""
    with _server(inventory, transport) as server:
        argv = [server.python, "-c", HELPER_SOURCE, "logs", server.layout.state_dir,
                str(max(0, lines)), "1" if follow else "0"]
        if not follow:
            res = _wrap(lambda: server.transport.run(argv, timeout=COMMAND_TIMEOUT))
            if res.exit_code != 0:
                raise ServerHostError(f"{server.spec.host}: reading {server.layout.log} failed: "
                                      f"{res.stderr.strip()[-300:]}")
            write(res.stdout.encode(errors="surrogateescape"))
            return
        stream: Stream = _wrap(lambda: server.transport.open_stream(argv))
        try:
            while True:
                data = _wrap(lambda: stream.recv(1.0))
                if data is None:
                    continue
                if not data:
                    return
                write(data)
        finally:
            stream.close()


# ---------------------------------------------------------------------------------------------
# the people: add-user / remove-user / users


def user_comment(name: str, server_host: str) -> str:
    """The comment that marks a person's key line on the server host."""
    return f"rigdeck-user:{name}@{server_host}"


@dataclass(frozen=True)
class ServerUser:
    """One person ``rigdeck server users`` lists."""

    name: str
    admin: bool
    fingerprint: str
    added: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "admin": self.admin, "fingerprint": self.fingerprint, "added": self.added}


def add_user(inventory: Inventory, name: str, public_key: str, *, admin: bool = False,
             transport: TransportFactory | None = None) -> tuple[ServerUser, bool]:
    """Install ``public_key`` on the server host as ``name``'s: a line in authorized_keys whose
    forced command is the server's ``rigdeck attach --user NAME`` (``restrict``: no shell, no
    pty, no forwarding), and ``name`` (an ``admin`` or a member) in the server's users.json.
    (the person, whether an earlier key of theirs was replaced). The name and key are checked
    before the host is reached (ServerHostError naming what was expected)."""
    from tui.model.identity import UserError, check_public_key, check_user_name, key_fingerprint

    try:
        check_user_name(name)
        key = check_public_key(public_key)
    except UserError as e:
        raise ServerHostError(str(e)) from None
    with _server(inventory, transport) as server:
        comment = user_comment(name, server.spec.host)
        line = authorized_key_line(key, forced_command(server.layout.attach_argv(user=name)), comment)
        payload = {"name": name, "admin": admin, "key": key, "fingerprint": key_fingerprint(key),
                   "line": line, "comment": comment}
        out = _helper(server.transport, server.python, "add-user", server.layout.state_dir,
                      json.dumps(payload), what=f"adding user {name}")
    u = out["user"]
    return ServerUser(name, bool(u["admin"]), str(u["fingerprint"]), str(u.get("added") or "")), bool(out["replaced"])


def remove_user(inventory: Inventory, name: str, *, transport: TransportFactory | None = None) -> None:
    """Take ``name``'s key line out of authorized_keys and ``name`` out of users.json."""
    with _server(inventory, transport) as server:
        _helper(server.transport, server.python, "remove-user", server.layout.state_dir, name,
                what=f"removing user {name}")


def users(inventory: Inventory, *, transport: TransportFactory | None = None) -> list[ServerUser]:
    """The server's people, by name."""
    with _server(inventory, transport) as server:
        out = _helper(server.transport, server.python, "users", server.layout.state_dir)
    return [ServerUser(n, bool(u.get("admin")), str(u.get("fingerprint") or ""), str(u.get("added") or ""))
            for n, u in sorted((out.get("users") or {}).items())]


def attach_command(inventory: Inventory, t: Transport) -> list[str]:
    """What a client runs on the server host, over ``t`` (connected to it), to reach the
    server: the venv's ``rigdeck attach`` with the server's state dir, as absolute paths."""
    srv, _host = server_of(inventory)
    return ServerLayout(_wrap(lambda: t.remote_path(srv.state_dir))).attach_argv()


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"[0-9]+", text))
