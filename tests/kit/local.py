"""A one-host cluster on this machine, without SSH (``transport = "local"``): its inventory as an
object or as a file with the environment a ``rigdeck`` command line needs, that command line,
and a client of the agent daemon's Unix socket."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.kit import ROOT
from tui.model.inventory import HostSpec, Inventory


def local_inventory(state_dir: Path, **kw: object) -> Inventory:
    """One host, ``here``, this machine through the local transport, its agent's state in
    ``state_dir``; ``kw``: more of its HostSpec."""
    spec = HostSpec(name="here", address="localhost", transport="local", python=sys.executable,
                    state_dir=str(state_dir), **kw)  # type: ignore[arg-type]
    return Inventory(hosts=(spec,), path=None, known_hosts=state_dir / "known_hosts")


def local_cluster(tmp_path: Path) -> dict[str, str]:
    """The environment of a ``rigdeck`` command line whose inventory is this machine alone, with
    2 simulated GPUs; its home, state and claims all under ``tmp_path``."""
    inv = tmp_path / "hosts.toml"
    inv.write_text(
        "[[hosts]]\n"
        f'name = "here"\naddress = "localhost"\ntransport = "local"\npython = "{sys.executable}"\n'
        f'state_dir = "{tmp_path / "state"}"\nsim_gpus = 2\n'
        # GPU claims in this test's own directory: the simulated GPUs are this test's alone.
        f'env = {{ RIGDECK_CLAIM_DIR = "{tmp_path / "claims"}" }}\n'
    )
    return {**os.environ, "RIGDECK_HOME": str(tmp_path / "home"), "RIGDECK_INVENTORY": str(inv)}


def rigdeck_out(env: dict[str, str], *args: str, ok: tuple[int, ...] = (0,)) -> str:
    """``rigdeck ARGS``' output; its exit status one of ``ok``."""
    res = subprocess.run([sys.executable, "-m", "tui.cli", *args], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=180)
    assert res.returncode in ok, f"rigdeck {' '.join(args)} exited {res.returncode}:\n{res.stdout}\n{res.stderr}"
    return res.stdout


class SocketClient:
    """The agent daemon's Unix socket, one JSON line a message; ``hello`` is its greeting."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.file = self.sock.makefile("rb")
        self.hello = json.loads(self.file.readline())

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self) -> dict:
        line = self.file.readline()
        assert line, "daemon closed the connection"
        return json.loads(line)
