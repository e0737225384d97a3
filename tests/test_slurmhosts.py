"""An inventory of a Slurm cluster with no [[hosts]] (issue 47): the hosts are Slurm's nodes, read
on the login host (an ~/.ssh/config alias) when the inventory is loaded.

Here on recorded ``scontrol -o show nodes`` output (tests/data/slurm, Slurm 22.05.8 on the bed),
kept as the loader keeps its last answer; the real read over SSH on the bed's real Slurm is in
tests/test_slurmbed.py."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tui.remote import inventoryfile
from tui.remote.inventoryfile import SLURM_NODES_CACHE, SLURM_NODES_TTL_S, InventoryError, load_inventory

NODES = (Path(__file__).parent / "data" / "slurm" / "nodes-22.05.8-do.txt").read_text()


def write(tmp_path: Path, slurm: str, ssh_config: str = "") -> Path:
    ssh = tmp_path / "ssh_config"
    ssh.write_text(ssh_config or "Host cluster\n    HostName 10.213.1.11\n    User alice\n"
                   "Host tb1-*\n    ProxyJump cluster\n")
    inv = tmp_path / "hosts.toml"
    inv.write_text(f'[defaults]\nssh_config = "{ssh}"\nknown_hosts = "{tmp_path / "known_hosts"}"\n'
                   f'python = "/opt/py/bin/python3"\n\n[slurm]\n{slurm}')
    return inv


def cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inv: Path, nodes: str = NODES,
           age: float = 0.0) -> list[int]:
    """The loader's last answer for ``inv`` (``nodes``, ``age`` s old) in a fresh RIGDECK_HOME;
    every read of the login host counted (none must happen while the answer is fresh)."""
    import hashlib

    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    monkeypatch.setenv("RIGDECK_HOME", str(home))
    digest = hashlib.sha256(inv.read_text().encode()).hexdigest()
    (home / SLURM_NODES_CACHE).write_text(json.dumps(
        {str(inv): {"inventory": digest, "at": time.time() - age, "nodes": nodes}}))
    asked: list[int] = []

    def ask(inventory: object, login: object, accept_new: bool) -> str:
        asked.append(1)
        return nodes
    monkeypatch.setattr(inventoryfile, "_ask_slurm_nodes", ask)
    return asked


def test_the_nodes_are_the_hosts_and_a_login_that_is_a_node_becomes_it(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    inv_path = write(tmp_path, 'login = "cluster"\npartition = "bed"\n')
    asked = cached(tmp_path, monkeypatch, inv_path)
    inv = load_inventory(inv_path)
    assert asked == []  # the last answer is fresh: nothing asked
    assert inv.names == ["tb1-h1", "tb1-h2", "tb1-h3"]
    assert [h.address for h in inv.hosts] == ["10.213.1.11", "10.213.1.12", "10.213.1.13"]
    # the [defaults] and the ssh config's pattern for the nodes' names apply to each
    assert {h.python for h in inv.hosts} == {"/opt/py/bin/python3"}
    assert inv.hosts[1].proxy_jump is not None
    # the login alias reaches 10.213.1.11, tb1-h1's NodeAddr: Slurm's commands run there
    assert inv.slurm is not None and inv.slurm.login == "tb1-h1" and inv.slurm.read_hosts


def test_a_login_that_is_no_node_stays_the_first_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv_path = write(tmp_path, 'login = "cluster"\n', "Host cluster\n    HostName 10.9.9.9\n")
    cached(tmp_path, monkeypatch, inv_path)
    inv = load_inventory(inv_path)
    assert inv.names == ["cluster", "tb1-h1", "tb1-h2", "tb1-h3"]
    assert inv.hosts[0].address == "10.9.9.9" and inv.slurm is not None and inv.slurm.login == "cluster"


def test_an_old_answer_or_a_changed_inventory_or_hosts_asks_slurm_again(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    inv_path = write(tmp_path, 'login = "cluster"\n')
    asked = cached(tmp_path, monkeypatch, inv_path, age=SLURM_NODES_TTL_S + 1)
    assert load_inventory(inv_path).names == ["tb1-h1", "tb1-h2", "tb1-h3"] and len(asked) == 1
    load_inventory(inv_path)
    assert len(asked) == 1  # kept from the read just made
    load_inventory(inv_path, fresh=True)  # rigdeck hosts
    assert len(asked) == 2
    inv_path.write_text(inv_path.read_text() + 'partition = "bed"\n')
    load_inventory(inv_path)
    assert len(asked) == 3
    assert load_inventory(inv_path, read_slurm=False).names == ["cluster"]
    assert len(asked) == 3


def test_no_hosts_and_no_login_is_refused_naming_the_field(tmp_path: Path) -> None:
    inv_path = write(tmp_path, 'partition = "bed"\n')
    with pytest.raises(InventoryError, match=r"hosts.toml: \[slurm\]: field 'login': expected the host where Slurm's "
                                             r"commands run .* when the inventory lists no \[\[hosts\]\]"):
        load_inventory(inv_path)


def test_a_partition_with_no_node_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv_path = write(tmp_path, 'login = "cluster"\npartition = "gpu"\n')
    cached(tmp_path, monkeypatch, inv_path)
    with pytest.raises(InventoryError, match=r"\[slurm\]: field 'partition': expected nodes to run jobs on: "
                                             r"scontrol -o show nodes on cluster lists none in partition 'gpu', "
                                             r"got \"gpu\" \(str\)"):
        load_inventory(inv_path)


@pytest.mark.parametrize("nodes, said", [
    ("garbage\n", "Slurm's nodes as scontrol lists them"),
    (NODES.replace("NodeName=tb1-h2", "NodeName=tb1 h2"), "Slurm node names of letters"),
    (NODES.replace("State=MIXED", "State=", 1), "Slurm's nodes as scontrol lists them"),
    (NODES.replace("NodeName=tb1-h2", "NodeName=tb1;h2"), "Slurm node names of letters"),
])
def test_what_slurm_printed_that_rigdeck_cannot_use_is_an_error_not_a_host(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nodes: str, said: str) -> None:
    inv_path = write(tmp_path, 'login = "cluster"\n')
    cached(tmp_path, monkeypatch, inv_path, nodes=nodes)
    with pytest.raises(InventoryError, match=said):
        load_inventory(inv_path)


def test_a_login_it_cannot_reach_is_said_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real SSH attempt (a closed port on this machine): the error names the login and why."""
    inv_path = write(tmp_path, 'login = "cluster"\n', "Host cluster\n    HostName 127.0.0.1\n    Port 1\n")
    monkeypatch.setenv("RIGDECK_HOME", str(tmp_path / "home"))
    with pytest.raises(InventoryError, match=r"\[slurm\]: field 'login': expected a login host rigdeck reaches "
                                             r"over SSH to read Slurm's nodes there \(cluster: cannot connect to "
                                             r"127.0.0.1:1: .*\), got \"cluster\" \(str\)"):
        load_inventory(inv_path)
    assert not (tmp_path / "home" / SLURM_NODES_CACHE).exists()  # nothing kept of a failed read


def test_a_login_alias_beside_listed_hosts_is_a_host_of_its_own(tmp_path: Path) -> None:
    """[[hosts]] listed, and ``login`` an ~/.ssh/config alias that is none of them: the alias
    is added after them (its address and user from the ssh config), where Slurm's commands run;
    no Slurm read is needed to load it. A login that is a listed host stays that host."""
    ssh = tmp_path / "ssh_config"
    ssh.write_text("Host cluster\n    HostName 10.9.9.9\n    User alice\n")
    inv_path = tmp_path / "hosts.toml"
    hosts = '[[hosts]]\nname = "n1"\naddress = "10.0.0.1"\n\n[[hosts]]\nname = "n2"\naddress = "10.0.0.2"\n\n'
    inv_path.write_text(f'[defaults]\nssh_config = "{ssh}"\nknown_hosts = "{tmp_path / "known_hosts"}"\n\n'
                        f'{hosts}[slurm]\nlogin = "cluster"\npartition = "gpu"\n')
    inv = load_inventory(inv_path)
    assert inv.names == ["n1", "n2", "cluster"]
    login = inv.get("cluster")
    assert (login.address, login.user) == ("10.9.9.9", "alice")
    assert inv.slurm is not None and inv.slurm.login == "cluster" and not inv.slurm.read_hosts
    inv_path.write_text(inv_path.read_text().replace('login = "cluster"', 'login = "n2"'))
    assert load_inventory(inv_path).names == ["n1", "n2"]
