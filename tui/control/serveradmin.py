"""Administering the rigdeck server, for the faces (``rigdeck server ...``, ``rigdeck attach``).

A thin facade: the CLI imports this module, never ``tui.remote`` or ``tui.control`` directly.
It wires the controller's deploy into ``tui.remote.serverhost`` (which, in ``remote``, may not
import ``control``) and runs ``tui.control.attach`` for ``rigdeck attach``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tui.model.inventory import HostSpec, Inventory
from tui.model.serverlayout import DEFAULT_SERVER_STATE_DIR
from tui.model.userconfig import UserConfig, load_config
from tui.remote import serverhost
from tui.remote.serverhost import AgentPlace, ServerHostError, ServerStatus, ServerUser, SetupReport

__all__ = [
    "DEFAULT_SERVER_STATE_DIR",
    "ServerHostError",
    "ServerStatus",
    "ServerUser",
    "SetupReport",
    "add_user",
    "attach",
    "join",
    "leave",
    "load",
    "logs",
    "remove_user",
    "setup",
    "start",
    "status",
    "stop",
    "users",
]


def load(path: str | os.PathLike[str] | None) -> Inventory:
    """The inventory at ``path`` (None: the default one); InventoryError when it is wrong."""
    from tui.remote.inventoryfile import load_inventory

    return load_inventory(path)


def setup(inventory: Inventory, *, progress: Callable[[str], None] | None = None,
          config: UserConfig | None = None) -> SetupReport:
    """``rigdeck server setup``: deploy the agent everywhere, then install, key and configure
    the server on the [server] host (``serverhost.setup``), with the user's ``[notify]``
    (``config``, default: ``load_config()``; checked before anything is touched)."""
    from tui.control.hostlinks import HostLinks

    config = config if config is not None else load_config()

    with HostLinks(inventory) as ctl:

        def deploy(hosts: Sequence[HostSpec]) -> Mapping[str, AgentPlace]:
            places: dict[str, AgentPlace] = {}

            def body(report, t) -> None:  # type: ignore[no-untyped-def]
                places[t.spec.name] = AgentPlace(*ctl._deploy_one(report, t, ctl.bundle))

            reports = ctl._parallel(list(hosts), lambda s: ctl._guarded(s, body))
            errors = [r.error for r in reports if r.error]
            if errors:
                raise ServerHostError("deploying the agent failed: " + "; ".join(errors))
            return places

        return serverhost.setup(
            inventory,
            deploy=deploy,
            agent_env=ctl.agent_env,
            transport=ctl.transport,
            progress=progress or (lambda _: None),
            notify=config.notify,
            policy=config.queue,
        )


@dataclass(frozen=True)
class JoinReport:
    """What ``rigdeck server join`` did: who the server knows the caller as, the key line's
    state on each host (added, replaced, current), and every account the server records for them
    now (host -> {"account", "python", "state_dir"}, as each agent said them)."""

    server_host: str
    user: str
    accounts: dict[str, dict[str, str]]

    def to_json(self) -> dict[str, Any]:
        return {"server_host": self.server_host, "user": self.user, "accounts": dict(self.accounts)}


def join(inventory: Inventory, hosts: Sequence[str] | None = None, *,
         progress: Callable[[str], None] | None = None) -> JoinReport:
    """``rigdeck server join``, run by a person with their own access to the hosts (their
    inventory: their account, their key): their agent deployed where missing, the server's
    public key installed in their own ``authorized_keys`` on each host restricted to that agent's
    attach, then the server told (over their own forced attach) which account it is on which
    host; it checks each before recording it. ``hosts``: default every host but the server's."""
    from tui.client import Membership, RemoteClient, ServerError, TransportError
    from tui.control.hostlinks import HostLinks

    say = progress or (lambda _: None)
    srv = inventory.server
    if srv is None:
        raise ServerHostError(f"{inventory.path or 'the inventory'} has no [server] table: join needs the server")
    names = list(hosts) if hosts else [h for h in inventory.names if h != srv.host]
    try:
        specs = inventory.select(names)
    except ValueError as e:  # InventoryError: a host the inventory does not have
        raise ServerHostError(f"join: {e}") from None
    if not specs:
        raise ServerHostError("join: no host to join (name the hosts: rigdeck server join HOST ...)")
    client = RemoteClient(inventory)
    server = Membership(client)
    try:
        said = server.key()
        key, person = str(said["public_key"]), str(said["user"])
        with HostLinks(inventory) as ctl:
            say(f"deploying your agent to {', '.join(s.name for s in specs)}")
            places: dict[str, AgentPlace] = {}

            def body(report, t) -> None:  # type: ignore[no-untyped-def]
                places[t.spec.name] = AgentPlace(*ctl._deploy_one(report, t, ctl.bundle))

            errors = [r.error for r in ctl._parallel(list(specs), lambda s: ctl._guarded(s, body)) if r.error]
            if errors:
                raise ServerHostError("deploying your agent failed: " + "; ".join(errors))
            say(f"installing {said['server_host']}'s key for your agent only")
            accounts = serverhost.authorize_member(
                inventory, specs, key, serverhost.member_comment(str(said["server_host"]), person),
                places, ctl.agent_env, transport=ctl.transport, join_tag=said.get("join_tag"))
        say("asking the server to check and record " + ", ".join(f"{h} as {a}" for h, a in accounts.items()))
        got = server.join(accounts)
    except (ServerError, TransportError) as e:  # the server's refusal, or no way to it: said plainly
        raise ServerHostError(str(e)) from None
    finally:
        client.close()
    return JoinReport(str(said["server_host"]), str(got["user"]), dict(got["accounts"]))


def leave(inventory: Inventory, hosts: Sequence[str] | None = None) -> tuple[JoinReport, list[str]]:
    """``rigdeck server leave``: the server forgets the caller's accounts on ``hosts`` (None:
    every one it records) and closes its links to them (refused while a job of theirs runs
    there), then the server's key line comes out of the caller's own ``authorized_keys`` on each
    of those hosts their inventory reaches. (what is still joined, the hosts left)."""
    from tui.client import Membership, RemoteClient, ServerError, TransportError

    client = RemoteClient(inventory)
    server = Membership(client)
    try:
        said = server.key()
        got = server.leave(list(hosts) if hosts else None)
    except (ServerError, TransportError) as e:
        raise ServerHostError(str(e)) from None
    finally:
        client.close()
    left = [str(h) for h in got["left"]]
    comment = serverhost.member_comment(str(said["server_host"]), str(said["user"]))
    reach = [h for h in left if h in inventory.names]
    serverhost.deauthorize_member(inventory, inventory.select(reach), comment)
    return JoinReport(str(said["server_host"]), str(got["user"]), dict(got["accounts"])), left


def start(inventory: Inventory, *, timeout: float = serverhost.START_TIMEOUT) -> ServerStatus:
    return serverhost.start(inventory, timeout=timeout)


def stop(
    inventory: Inventory, *, timeout: float = serverhost.STOP_TIMEOUT
) -> tuple[ServerStatus, bool]:
    return serverhost.stop(inventory, timeout=timeout)


def status(inventory: Inventory) -> ServerStatus:
    return serverhost.status(inventory)


def logs(
    inventory: Inventory, write: Callable[[bytes], None], *, lines: int = 50, follow: bool = False
) -> None:
    serverhost.logs(inventory, write, lines=lines, follow=follow)


def add_user(inventory: Inventory, name: str, public_key: str, *, admin: bool = False) -> tuple[ServerUser, bool]:
    return serverhost.add_user(inventory, name, public_key, admin=admin)


def remove_user(inventory: Inventory, name: str, *, stop: bool = False,
                progress: Callable[[str], None] | None = None) -> dict[str, list[str]]:
    """``rigdeck server remove-user NAME``: refused while a job, sweep or pipeline of theirs runs
    or waits, naming them (once their accounts' links are gone the server could reach none of
    their jobs, and a sweep or pipeline would go on starting more), unless ``stop``: then their
    sweeps and pipelines are stopped first (no new job of theirs starts), then each job, by the
    server through their own links, and waited for. The operator's own connection to the server
    asks. Returns what was stopped: {"sweeps", "pipelines", "jobs"} -> ids."""
    from tui.client import RemoteClient, ServerError, TransportError
    from tui.model.jobstate import TERMINAL
    from tui.model.pipelineview import PIPELINE_FINAL
    from tui.model.sweepview import SWEEP_FINAL

    say = progress or (lambda _: None)
    client = RemoteClient(inventory)
    stopped: dict[str, list[str]] = {"sweeps": [], "pipelines": [], "jobs": []}
    try:
        sweeps = [r for r in client.sweeps() if r.user == name and r.state not in SWEEP_FINAL]
        pipelines = [r for r in client.pipelines() if r.user == name and r.state not in PIPELINE_FINAL]
        live = [v for v in client.list_jobs() if v.user == name and v.state not in TERMINAL]
        if (live or sweeps or pipelines) and not stop:
            what = [f"their {kind} {', '.join(items)}" for kind, items in (
                ("sweeps", [f"{r.sweep_id} ({r.state})" for r in sweeps]),
                ("pipelines", [f"{r.pipeline_id} ({r.state})" for r in pipelines]),
                ("jobs", [f"{v.job_id} ({v.state})" for v in live])) if items]
            raise ServerHostError(
                f"remove-user {name}: refused: {'; '.join(what)} have not ended; stop them first, or "
                f"run `rigdeck server remove-user {name} --stop` (the server stops them through their own "
                f"links, then removes them)")
        for r in sweeps:  # first: a running sweep or pipeline would start more jobs of theirs
            say(f"stopping {name}'s sweep {r.sweep_id} ({r.state})")
            client.sweep_stop(r.sweep_id)
            stopped["sweeps"].append(r.sweep_id)
        for p in pipelines:
            say(f"stopping {name}'s pipeline {p.pipeline_id} ({p.state})")
            client.pipeline_stop(p.pipeline_id)
            stopped["pipelines"].append(p.pipeline_id)
        if sweeps or pipelines:  # the jobs they had running, as they are now
            live = [v for v in client.list_jobs() if v.user == name and v.state not in TERMINAL]
        for v in live:
            say(f"stopping {name}'s job {v.job_id} ({v.state})")
            client.stop(v.job_id, yes=True)
            stopped["jobs"].append(v.job_id)
    except (ServerError, TransportError) as e:
        raise ServerHostError(f"remove-user {name}: cannot ask the server which of their jobs run "
                              f"(start it first: rigdeck server start): {e}") from None
    finally:
        client.close()
    serverhost.remove_user(inventory, name)
    return stopped


def users(inventory: Inventory) -> list[ServerUser]:
    return serverhost.users(inventory)


def attach(state_dir: str = DEFAULT_SERVER_STATE_DIR, user: str | None = None) -> int:
    """``rigdeck attach``, on the server host: stdin/stdout <-> the server's socket; ``user``:
    the person a key's forced command names (the server takes them from here, never from the
    client)."""
    from tui.control.attach import main

    return main(state_dir, user=user)
