"""Administering the rigdeck server, for the faces (``rigdeck server ...``, ``rigdeck attach``).

A thin facade: the CLI imports this module, never ``tui.remote`` or ``tui.control`` directly.
It wires the controller's deploy into ``tui.remote.serverhost`` (which, in ``remote``, may not
import ``control``) and runs ``tui.control.attach`` for ``rigdeck attach``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

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
    from tui.remote.sshconfig import load_inventory

    return load_inventory(path)


def setup(inventory: Inventory, *, progress: Callable[[str], None] | None = None,
          config: UserConfig | None = None) -> SetupReport:
    """``rigdeck server setup``: deploy the agent everywhere, then install, key and configure
    the server on the [server] host (``serverhost.setup``), with the user's ``[notify]``
    (``config``, default: ``load_config()``; checked before anything is touched)."""
    from tui.control.controller import Controller

    config = config if config is not None else load_config()

    with Controller(inventory) as ctl:

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


def remove_user(inventory: Inventory, name: str) -> None:
    serverhost.remove_user(inventory, name)


def users(inventory: Inventory) -> list[ServerUser]:
    return serverhost.users(inventory)


def attach(state_dir: str = DEFAULT_SERVER_STATE_DIR, user: str | None = None) -> int:
    """``rigdeck attach``, on the server host: stdin/stdout <-> the server's socket; ``user``:
    the person a key's forced command names (the server takes them from here, never from the
    client)."""
    from tui.control.attach import main

    return main(state_dir, user=user)
