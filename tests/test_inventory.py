"""tui.model.inventory: TOML inventories, hostfiles, ssh config resolution and jump chains."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tui.model.inventory import (
    INVENTORY_ENV,
    HostSpec,
    Inventory,
    InventoryError,
    ServerSpec,
    SlurmSpec,
    UnknownHostError,
    default_inventory_path,
)
from tui.remote.inventoryfile import (
    hostfile_to_toml,
    jump_chain,
    load_hostfile,
    load_inventory,
    local_inventory,
)


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake home (so ~/.ssh/config and ~/.config are ours) and a fixed local user."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv(INVENTORY_ENV, raising=False)
    monkeypatch.setenv("LOGNAME", "tester")
    monkeypatch.setenv("USER", "tester")
    return home


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def inventory(tmp_path: Path, body: str, *, ssh_config: str | None = "") -> Path:
    """An inventory file whose [defaults] points at ``ssh_config`` ("" disables it)."""
    text = textwrap.dedent(body).lstrip()
    if ssh_config is not None:
        line = f"ssh_config = {ssh_config!r}\n"
        if "[defaults]" in text:
            text = text.replace("[defaults]\n", "[defaults]\n" + line, 1)
        else:
            text = "[defaults]\n" + line + "\n" + text
    path = tmp_path / "hosts.toml"
    path.write_text(text)
    return path


def ssh_config(tmp_path: Path, text: str) -> str:
    return str(write(tmp_path / "ssh_config", text))


# ---------------------------------------------------------------------------------------------
# Valid files


def test_full_file(tmp_path: Path, _isolated: Path) -> None:
    path = inventory(
        tmp_path,
        """
        [defaults]
        user = "root"
        port = 2200
        identity_file = ["~/.ssh/id_ed25519", "/keys/other"]
        known_hosts = "~/kh"
        python = "python3.11"
        state_dir = "~/.rd"
        connect_timeout = 5
        keepalive = 0
        labels = ["all"]
        sim_gpus = 2
        env = { NCCL_DEBUG = "INFO", SHARED = "defaults" }

        [[hosts]]
        name = "gpu1"
        address = "10.0.0.5"
        port = 22
        user = "alice"
        identity_file = "~/.ssh/gpu1"
        python = "/usr/bin/python3"
        state_dir = "/srv/rigdeck"
        labels = ["a100", "rack2"]
        proxy_jump = "bastion"
        slots = 8
        sim_gpus = 4
        env = { SHARED = "host", CUDA_VISIBLE_DEVICES = "0,1" }
        transport = "ssh"
        connect_timeout = 2.5
        keepalive = 30

        [[hosts]]
        name = "bastion"
        address = "bastion.example.com"

        [[hosts]]
        name = "me"
        transport = "local"
        """,
    )
    inv = load_inventory(path)
    home = str(_isolated)
    assert inv.path == path
    assert inv.known_hosts == Path(home) / "kh"
    assert inv.names == ["gpu1", "bastion", "me"]
    assert inv.get("gpu1") == HostSpec(
        name="gpu1",
        address="10.0.0.5",
        port=22,
        user="alice",
        identity_files=(f"{home}/.ssh/gpu1",),
        python="/usr/bin/python3",
        state_dir="/srv/rigdeck",
        labels=("a100", "rack2"),
        proxy_jump="bastion",
        slots=8,
        sim_gpus=4,
        # defaults' env is merged under the host's; pairs are sorted
        env=(("CUDA_VISIBLE_DEVICES", "0,1"), ("NCCL_DEBUG", "INFO"), ("SHARED", "host")),
        transport="ssh",
        connect_timeout=2.5,
        keepalive=30.0,
    )
    bastion = inv.get("bastion")
    assert bastion == HostSpec(
        name="bastion",
        address="bastion.example.com",
        port=2200,
        user="root",
        identity_files=(f"{home}/.ssh/id_ed25519", "/keys/other"),
        python="python3.11",
        state_dir="~/.rd",  # remote: '~' stays for the host to expand
        labels=("all",),
        sim_gpus=2,
        env=(("NCCL_DEBUG", "INFO"), ("SHARED", "defaults")),
        connect_timeout=5.0,
        keepalive=0.0,
    )
    assert isinstance(bastion.connect_timeout, float)
    me = inv.get("me")
    assert me.is_local and not bastion.is_local
    assert me.address == "localhost"
    hash(inv)  # frozen all the way down


def test_builtin_defaults(tmp_path: Path, _isolated: Path) -> None:
    inv = load_inventory(inventory(tmp_path, '[[hosts]]\nname = "a"\naddress = "h"\n'))
    assert inv.hosts == (HostSpec(name="a", address="h", user="tester"),)
    host = inv.hosts[0]
    assert (host.port, host.python, host.state_dir, host.transport) == (
        22,
        "python3",
        "~/.rigdeck",
        "ssh",
    )
    assert (host.connect_timeout, host.keepalive, host.slots, host.proxy_jump) == (
        10.0,
        15.0,
        None,
        None,
    )
    assert inv.known_hosts == _isolated / ".ssh" / "known_hosts"
    assert inv.ssh_config is None


def test_defaults_overridden_per_host(tmp_path: Path) -> None:
    path = inventory(
        tmp_path,
        """
        [defaults]
        user = "root"
        labels = ["x"]
        sim_gpus = 1

        [[hosts]]
        name = "a"
        address = "a.lan"

        [[hosts]]
        name = "b"
        address = "b.lan"
        user = "bob"
        labels = []
        sim_gpus = 0
        """,
    )
    a, b = load_inventory(path).hosts
    assert (a.user, a.labels, a.sim_gpus) == ("root", ("x",), 1)
    assert (b.user, b.labels, b.sim_gpus) == ("bob", (), 0)


def test_empty_inventory_has_no_hosts(tmp_path: Path) -> None:
    inv = load_inventory(inventory(tmp_path, ""))
    assert inv.hosts == () and inv.names == []


# ---------------------------------------------------------------------------------------------
# Errors: each names the file, the host, the field and what was expected.

MALFORMED = [
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nprot = 22\n',
        "host 'gpu2'",
        "field 'prot'",
        "did you mean 'port'?",
        id="unknown-host-field",
    ),
    pytest.param(
        '[defaults]\ncolour = "red"\n',
        "[defaults]",
        "field 'colour'",
        "one of the known fields",
        id="unknown-defaults-field",
    ),
    pytest.param(
        '[defaults]\nproxy_jump = "b"\n',
        "[defaults]",
        "field 'proxy_jump'",
        "one of the known fields",
        id="host-only-field-in-defaults",
    ),
    pytest.param(
        "extra = 1\n",
        "hosts.toml",
        "field 'extra'",
        "only a [defaults] table, [[hosts]] entries, a [server] table and a [slurm] table",
        id="unknown-top-level",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\n',
        "host 'gpu2'",
        "field 'address'",
        "expected a host name or IP address (required unless",
        id="missing-address",
    ),
    pytest.param(
        '[[hosts]]\naddress = "h"\n',
        "hosts[0]",
        "field 'name'",
        "a host name (required)",
        id="missing-name",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nport = "22a"\n',
        "host 'gpu2'",
        "field 'port'",
        'expected an integer 1..65535, got "22a" (str)',
        id="port-string",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nport = 70000\n',
        "host 'gpu2'",
        "field 'port'",
        "expected an integer 1..65535, got 70000 (int)",
        id="port-range",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nport = true\n',
        "host 'gpu2'",
        "field 'port'",
        "got true (bool)",
        id="port-bool",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nlabels = "a100"\n',
        "host 'gpu2'",
        "field 'labels'",
        'expected a list of strings, got "a100" (str)',
        id="labels-not-list",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nlabels = ["a", 1]\n',
        "host 'gpu2'",
        "field 'labels'",
        "expected a list of strings",
        id="labels-not-strings",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nsim_gpus = -1\n',
        "host 'gpu2'",
        "field 'sim_gpus'",
        "expected an integer >= 0, got -1 (int)",
        id="sim-gpus-negative",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nslots = 0\n',
        "host 'gpu2'",
        "field 'slots'",
        "expected an integer 1..4096",
        id="slots-zero",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nconnect_timeout = 0\n',
        "host 'gpu2'",
        "field 'connect_timeout'",
        "a number of seconds > 0",
        id="timeout-zero",
    ),
    pytest.param(
        "[defaults]\nkeepalive = -1.0\n",
        "[defaults]",
        "field 'keepalive'",
        "a number of seconds >= 0",
        id="keepalive-negative",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nconnect_timeout = inf\n',
        "host 'gpu2'",
        "field 'connect_timeout'",
        "got inf (float)",
        id="timeout-inf",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nenv = { A = 1 }\n',
        "host 'gpu2'",
        "field 'env.A'",
        "expected a string, got 1 (int)",
        id="env-value",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nenv = { "BAD-NAME" = "x" }\n',
        "host 'gpu2'",
        "field 'env'",
        "environment variable names",
        id="env-key",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nenv = "A=1"\n',
        "host 'gpu2'",
        "field 'env'",
        "a table of strings",
        id="env-not-table",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\ntransport = "mosh"\n',
        "host 'gpu2'",
        "field 'transport'",
        'expected "ssh" or "local", got "mosh"',
        id="transport",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nidentity_file = 7\n',
        "host 'gpu2'",
        "field 'identity_file'",
        "a path or a list of paths",
        id="identity-file",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "has space"\n',
        "host 'gpu2'",
        "field 'address'",
        "a host name or IP address",
        id="address-space",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nproxy_jump = "b:99999"\n',
        "host 'gpu2'",
        "field 'proxy_jump'",
        "port 1..65535",
        id="jump-port",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\naddress = "h"\nproxy_jump = "a,,b"\n',
        "host 'gpu2'",
        "field 'proxy_jump'",
        "[user@]host[:port]",
        id="jump-empty-element",
    ),
    pytest.param(
        '[[hosts]]\nname = "gpu2"\ntransport = "local"\nproxy_jump = "b"\n',
        "host 'gpu2'",
        "field 'proxy_jump'",
        'no jump host for transport = "local"',
        id="jump-on-local",
    ),
    pytest.param(
        '[[hosts]]\nname = "a"\naddress = "h"\n\n[[hosts]]\nname = "a"\naddress = "i"\n',
        "host 'a'",
        "field 'name'",
        "a name no other host has (hosts[0] has it too)",
        id="duplicate-name",
    ),
    pytest.param(
        '[[hosts]]\nname = "a"\naddress = "h"\n\n[[hosts]]\nname = "bad name!"\naddress = "i"\n',
        "hosts[1]",
        "field 'name'",
        "expected a name of letters, digits, '.', '_' and '-', got \"bad name!\" (str)",
        id="bad-name",
    ),
    pytest.param(
        '[[hosts]]\nname = 5\naddress = "i"\n',
        "hosts[0]",
        "field 'name'",
        "got 5 (int)",
        id="name-not-string",
    ),
    pytest.param(
        'hosts = ["gpu1"]\n',
        "hosts[0]",
        "",
        "expected a table ([[hosts]])",
        id="host-not-table",
    ),
    pytest.param(
        '[hosts]\nname = "a"\n',
        "hosts.toml",
        "field 'hosts'",
        "an array of tables ([[hosts]])",
        id="hosts-is-table",
    ),
    pytest.param(
        "defaults = 1\n",
        "hosts.toml",
        "field 'defaults'",
        "a table ([defaults])",
        id="defaults-not-table",
    ),
]


@pytest.mark.parametrize(("body", "host", "field", "expected"), MALFORMED)
def test_malformed(tmp_path: Path, body: str, host: str, field: str, expected: str) -> None:
    # No ssh_config line here: 'defaults = 1' must stay the only [defaults].
    path = tmp_path / "hosts.toml"
    path.write_text(body)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    for part in (host, field, expected):
        assert part in message, message


def test_error_message_format(tmp_path: Path) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text('[[hosts]]\nname = "gpu2"\naddress = "h"\nport = "22a"\n')
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    err = info.value
    assert (
        str(err)
        == f"{path}: host 'gpu2': field 'port': expected an integer 1..65535, got \"22a\" (str)"
    )
    assert isinstance(err, ValueError)
    assert (err.path, err.host, err.field, err.got) == (path, "gpu2", "port", "22a")


def test_bad_toml(tmp_path: Path) -> None:
    path = tmp_path / "hosts.toml"
    path.write_text('[[hosts]]\nname = "a"\naddress = \n')
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    message = str(info.value)
    assert message.startswith(f"{path}: expected valid TOML")
    assert "line 3" in message and "column" in message
    assert info.value.field is None


def test_explicit_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="nope.toml: expected an existing inventory file"):
        load_inventory(tmp_path / "nope.toml")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "hosts.toml"
    path.write_bytes(b"\xff\xfe[[hosts]]")
    with pytest.raises(InventoryError, match="UTF-8"):
        load_inventory(path)


# ---------------------------------------------------------------------------------------------
# ssh config


def test_ssh_config_alias_resolution(tmp_path: Path, _isolated: Path) -> None:
    cfg = ssh_config(
        tmp_path,
        """
        Host gpu1
            HostName 10.1.2.3
            User carol
            Port 2222
            IdentityFile ~/.ssh/gpu1_key
            IdentityFile /keys/second
            ProxyJump jumpbox

        Host jumpbox
            HostName 192.0.2.1
        """,
    )
    path = inventory(tmp_path, '[[hosts]]\nname = "gpu1"\n', ssh_config=cfg)
    (host,) = load_inventory(path).hosts
    assert host.address == "10.1.2.3"
    assert host.user == "carol"
    assert host.port == 2222
    assert host.identity_files == (f"{_isolated}/.ssh/gpu1_key", "/keys/second")
    assert host.proxy_jump == "jumpbox"


def test_ssh_config_precedence(tmp_path: Path) -> None:
    """host entry > ssh config > [defaults] > built-in."""
    cfg = ssh_config(
        tmp_path,
        """
        Host gpu1 gpu2
            HostName %h.cluster
            User fromssh
            Port 2222
            IdentityFile /keys/ssh
        """,
    )
    path = inventory(
        tmp_path,
        """
        [defaults]
        user = "fromdefaults"
        port = 2200
        identity_file = "/keys/defaults"
        python = "python3.12"

        [[hosts]]
        name = "gpu1"

        [[hosts]]
        name = "gpu2"
        address = "10.0.0.2"
        user = "fromhost"
        port = 22
        identity_file = []

        [[hosts]]
        name = "gpu3"
        address = "10.0.0.3"
        """,
        ssh_config=cfg,
    )
    gpu1, gpu2, gpu3 = load_inventory(path).hosts
    assert (gpu1.address, gpu1.user, gpu1.port, gpu1.identity_files, gpu1.python) == (
        "gpu1.cluster",
        "fromssh",
        2222,
        ("/keys/ssh",),
        "python3.12",
    )
    assert (gpu2.address, gpu2.user, gpu2.port, gpu2.identity_files) == (
        "10.0.0.2",
        "fromhost",
        22,
        (),
    )
    assert (gpu3.user, gpu3.port, gpu3.identity_files) == (
        "fromdefaults",
        2200,
        ("/keys/defaults",),
    )


def test_ssh_config_wildcards_apply_but_do_not_supply_an_address(tmp_path: Path) -> None:
    cfg = ssh_config(
        tmp_path,
        """
        Host gpu*
            User wild
        Host *
            HostName everything.example
        """,
    )
    ok = inventory(tmp_path, '[[hosts]]\nname = "gpu1"\naddress = "h"\n', ssh_config=cfg)
    assert load_inventory(ok).hosts[0].user == "wild"
    missing = inventory(tmp_path, '[[hosts]]\nname = "gpu1"\n', ssh_config=cfg)
    with pytest.raises(InventoryError) as info:
        load_inventory(missing)
    message = str(info.value)
    assert "host 'gpu1'" in message and "field 'address'" in message
    assert f"the ssh config {cfg} has a 'Host gpu1' block with HostName" in message


def test_missing_address_needs_a_literal_host_block_with_hostname(tmp_path: Path) -> None:
    cfg = ssh_config(tmp_path, "Host gpu1\n    User someone\n")
    path = inventory(tmp_path, '[[hosts]]\nname = "gpu1"\n', ssh_config=cfg)
    with pytest.raises(InventoryError, match="field 'address'"):
        load_inventory(path)
    negated = ssh_config(tmp_path, "Host gpu1 !gpu1\n    HostName 10.0.0.1\n")
    path = inventory(tmp_path, '[[hosts]]\nname = "gpu1"\n', ssh_config=negated)
    with pytest.raises(InventoryError, match="field 'address'"):
        load_inventory(path)


def test_default_ssh_config_is_home_ssh_config(tmp_path: Path, _isolated: Path) -> None:
    write(_isolated / ".ssh" / "config", "Host gpu1\n    HostName 10.9.9.9\n")
    path = inventory(tmp_path, '[[hosts]]\nname = "gpu1"\n', ssh_config=None)
    inv = load_inventory(path)
    assert inv.hosts[0].address == "10.9.9.9"
    assert inv.ssh_config == _isolated / ".ssh" / "config"


def test_ssh_config_disabled_and_missing(tmp_path: Path, _isolated: Path) -> None:
    write(_isolated / ".ssh" / "config", "Host gpu1\n    HostName 10.9.9.9\n")
    disabled = inventory(tmp_path, '[[hosts]]\nname = "gpu1"\n', ssh_config="")
    with pytest.raises(InventoryError, match="field 'address'"):
        load_inventory(disabled)
    absent = inventory(
        tmp_path, '[[hosts]]\nname = "gpu1"\naddress = "h"\n', ssh_config=str(tmp_path / "none")
    )
    assert load_inventory(absent).hosts[0].address == "h"


def test_ssh_config_bad_port_names_the_ssh_config(tmp_path: Path) -> None:
    cfg = ssh_config(tmp_path, "Host gpu1\n    HostName h\n    Port twentytwo\n")
    path = inventory(tmp_path, '[[hosts]]\nname = "gpu1"\n', ssh_config=cfg)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert str(info.value) == (
        f"{cfg}: host 'gpu1': field 'Port': expected an integer 1..65535, got \"twentytwo\" (str)"
    )


def test_ssh_config_unparsable(tmp_path: Path) -> None:
    cfg = ssh_config(tmp_path, "Host gpu1\n    =broken\n")
    path = inventory(tmp_path, '[[hosts]]\nname = "gpu1"\naddress = "h"\n', ssh_config=cfg)
    with pytest.raises(InventoryError, match="a valid OpenSSH client config"):
        load_inventory(path)


def test_local_hosts_ignore_ssh_config(tmp_path: Path) -> None:
    cfg = ssh_config(tmp_path, "Host *\n    User wild\n    ProxyJump somewhere\n")
    path = inventory(tmp_path, '[[hosts]]\nname = "me"\ntransport = "local"\n', ssh_config=cfg)
    (me,) = load_inventory(path).hosts
    assert me.user == "tester" and me.proxy_jump is None and me.address == "localhost"


def test_proxy_jump_none_overrides_ssh_config(tmp_path: Path) -> None:
    cfg = ssh_config(tmp_path, "Host gpu1\n    HostName h\n    ProxyJump bastion\n")
    path = inventory(tmp_path, '[[hosts]]\nname = "gpu1"\nproxy_jump = "none"\n', ssh_config=cfg)
    assert load_inventory(path).hosts[0].proxy_jump is None


# ---------------------------------------------------------------------------------------------
# Where the inventory comes from


def test_missing_default_file_means_local_inventory(_isolated: Path) -> None:
    assert default_inventory_path() == _isolated / ".config" / "rigdeck" / "hosts.toml"
    inv = load_inventory()
    assert inv == local_inventory()
    (host,) = inv.hosts
    assert inv.path is None
    assert host.is_local and host.address == "localhost"
    assert host.python == sys.executable
    assert host.state_dir == "~/.rigdeck"
    assert host.name  # derived from the hostname, made a valid name
    assert set(host.name) <= set(
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
    )
    assert inv.known_hosts == _isolated / ".ssh" / "known_hosts"


def test_local_inventory_sanitizes_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "my box (1)")
    assert local_inventory().hosts[0].name == "my-box-1"


def test_default_file_is_used(_isolated: Path) -> None:
    write(
        _isolated / ".config" / "rigdeck" / "hosts.toml",
        '[defaults]\nssh_config = ""\n[[hosts]]\nname = "a"\naddress = "h"\n',
    )
    assert load_inventory().names == ["a"]


def test_env_var_overrides_default_and_explicit_path_overrides_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _isolated: Path
) -> None:
    write(
        _isolated / ".config" / "rigdeck" / "hosts.toml",
        '[[hosts]]\nname = "default"\naddress = "h"\n',
    )
    from_env = write(tmp_path / "env.toml", '[[hosts]]\nname = "fromenv"\naddress = "h"\n')
    explicit = write(tmp_path / "explicit.toml", '[[hosts]]\nname = "explicit"\naddress = "h"\n')
    monkeypatch.setenv(INVENTORY_ENV, str(from_env))
    assert default_inventory_path() == from_env
    assert load_inventory().names == ["fromenv"]
    assert load_inventory(None).path == from_env
    assert load_inventory(explicit).names == ["explicit"]
    assert load_inventory(str(explicit)).names == ["explicit"]


def test_env_var_pointing_nowhere_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(INVENTORY_ENV, str(tmp_path / "typo.toml"))
    with pytest.raises(InventoryError, match="typo.toml: expected an existing inventory file"):
        load_inventory()


def test_tilde_in_explicit_path(_isolated: Path) -> None:
    write(_isolated / "inv.toml", '[[hosts]]\nname = "a"\naddress = "h"\n')
    assert load_inventory("~/inv.toml").names == ["a"]


# ---------------------------------------------------------------------------------------------
# Inventory lookups


def _three(tmp_path: Path) -> Inventory:
    return load_inventory(
        inventory(
            tmp_path,
            """
            [[hosts]]
            name = "a"
            address = "h1"
            [[hosts]]
            name = "b"
            address = "h2"
            [[hosts]]
            name = "c"
            address = "h3"
            """,
        )
    )


def test_get_and_names(tmp_path: Path) -> None:
    inv = _three(tmp_path)
    assert inv.names == ["a", "b", "c"]
    assert inv.get("b").address == "h2"
    with pytest.raises(KeyError) as info:
        inv.get("zz")
    assert isinstance(info.value, UnknownHostError)
    assert str(info.value) == f"no host 'zz' in {inv.path}; known hosts: a, b, c"


def test_select(tmp_path: Path) -> None:
    inv = _three(tmp_path)
    assert [h.name for h in inv.select(["c", "a"])] == ["c", "a"]
    assert [h.name for h in inv.select(["b", "b"])] == ["b"]
    assert inv.select([]) == ()
    with pytest.raises(InventoryError) as info:
        inv.select(["a", "gpux"])
    message = str(info.value)
    assert "host 'gpux'" in message and "known: a, b, c" in message
    assert str(inv.path) in message
    with pytest.raises(InventoryError, match="host 'not a name'"):
        inv.select(["not a name"])


# ---------------------------------------------------------------------------------------------
# Hostfiles


def test_hostfile(tmp_path: Path) -> None:
    path = write(
        tmp_path / "hostfile",
        """
        # DeepSpeed style
        worker-1 slots=8
        worker-2   slots=4  # trailing comment

        10.0.0.7
        admin@node_3 slots=2 max_slots=4
        weird[1] slots=1 max-slots=2
        """,
    )
    inv = load_hostfile(path, {"ssh_config": "", "user": "root", "sim_gpus": 2})
    assert inv.path == path
    assert [(h.name, h.address, h.slots, h.user) for h in inv.hosts] == [
        ("worker-1", "worker-1", 8, "root"),
        ("worker-2", "worker-2", 4, "root"),
        ("10.0.0.7", "10.0.0.7", 1, "root"),
        ("node_3", "node_3", 2, "admin"),
        ("weird-1", "weird[1]", 1, "root"),
    ]
    assert all(h.sim_gpus == 2 for h in inv.hosts)


def test_hostfile_resolves_through_ssh_config(tmp_path: Path) -> None:
    cfg = ssh_config(
        tmp_path, "Host worker-1\n    HostName 10.0.0.1\n    User deploy\n    Port 2222\n"
    )
    path = write(tmp_path / "hostfile", "worker-1 slots=8\nworker-2 slots=8\n")
    w1, w2 = load_hostfile(path, {"ssh_config": cfg}).hosts
    assert (w1.address, w1.user, w1.port) == ("10.0.0.1", "deploy", 2222)
    assert (w2.address, w2.user, w2.port) == ("worker-2", "tester", 22)


def test_load_inventory_detects_hostfiles(tmp_path: Path) -> None:
    path = write(tmp_path / "hostfile", "a slots=2\nb\n")
    assert [(h.name, h.slots) for h in load_inventory(path).hosts] == [("a", 2), ("b", 1)]
    # A .toml name is always read as TOML.
    as_toml = write(tmp_path / "odd.toml", "a slots=2\n")
    with pytest.raises(InventoryError, match="valid TOML"):
        load_inventory(as_toml)
    # TOML without the extension is still TOML.
    toml_text = write(
        tmp_path / "inventory",
        '[defaults]\nssh_config = ""\n[[hosts]]\nname = "x"\naddress = "h"\n',
    )
    assert load_inventory(toml_text).names == ["x"]


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        (
            "a slots=2\nb slots=x\n",
            2,
            "host 'b': field 'slots': expected an integer 1..4096, got \"x\" (str)",
        ),
        ("a slots=0\n", 1, "field 'slots': expected an integer 1..4096"),
        ("# c\n\na slots=2\nb slots 4\n", 4, "host 'b': expected slots=N or max_slots=M"),
        ("a cpus=4\n", 1, "expected slots=N or max_slots=M after the host name ('cpus=4')"),
        ("a max_slots=z\n", 1, "field 'max_slots'"),
        ("a slots=1\n@b slots=1\n", 2, "expected a line 'HOSTNAME [slots=N] [max_slots=M]'"),
        (
            "a slots=1\n\na slots=2\n",
            3,
            "host 'a': field 'name': expected a name no other host has (line 1",
        ),
    ],
)
def test_hostfile_bad_lines(tmp_path: Path, text: str, line: int, needle: str) -> None:
    path = write(tmp_path / "hostfile", text)
    with pytest.raises(InventoryError) as info:
        load_hostfile(path, {"ssh_config": ""})
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: "), message
    assert needle in message, message
    assert info.value.line == line


def test_hostfile_without_hosts(tmp_path: Path) -> None:
    path = write(tmp_path / "hostfile", "# nothing here\n\n")
    with pytest.raises(InventoryError, match="at least one host"):
        load_hostfile(path)


def test_hostfile_bad_defaults(tmp_path: Path) -> None:
    path = write(tmp_path / "hostfile", "a slots=1\n")
    with pytest.raises(InventoryError, match=r"\[defaults\]: field 'port'"):
        load_hostfile(path, {"port": "x"})


def test_hostfile_to_toml_round_trip(tmp_path: Path, _isolated: Path) -> None:
    cfg = ssh_config(
        tmp_path,
        """
        Host worker-1
            HostName 10.0.0.1
            User deploy
            Port 2222
            IdentityFile ~/.ssh/w1
            ProxyJump bastion
        Host bastion
            HostName 192.0.2.1
        """,
    )
    path = write(tmp_path / "hostfile", "worker-1 slots=8\nroot@worker-2 slots=4\nodd[3]\n")
    inv = load_hostfile(path, {"ssh_config": cfg, "env": {"A": 'quote " back \\ slash'}})
    text = hostfile_to_toml(inv)
    out = write(tmp_path / "imported.toml", text)
    again = load_inventory(out)
    assert again.hosts == inv.hosts
    assert again.known_hosts == inv.known_hosts
    assert again.ssh_config == inv.ssh_config
    assert again.get("worker-1").proxy_jump == "bastion"
    assert again.get("worker-1").identity_files == (f"{_isolated}/.ssh/w1",)
    assert jump_chain(again, again.get("worker-1"))[0].address == "192.0.2.1"


def test_toml_round_trip_keeps_explicit_overrides_of_ssh_config(tmp_path: Path) -> None:
    """Values that differ from what the ssh config would give must survive the round trip."""
    cfg = ssh_config(
        tmp_path,
        "Host *\n    IdentityFile /keys/all\n    ProxyJump gw\nHost gw\n    ProxyJump none\n",
    )
    path = inventory(
        tmp_path,
        """
        [[hosts]]
        name = "a"
        address = "h"
        identity_file = []
        proxy_jump = "none"
        labels = ["x", "y"]
        slots = 2
        sim_gpus = 3
        env = { B = "2", A = "1" }
        connect_timeout = 1.5
        keepalive = 0
        python = "/opt/py"
        state_dir = "/srv/rd"

        [[hosts]]
        name = "me"
        transport = "local"
        """,
        ssh_config=cfg,
    )
    inv = load_inventory(path)
    assert inv.get("a").identity_files == () and inv.get("a").proxy_jump is None
    again = load_inventory(write(tmp_path / "again.toml", hostfile_to_toml(inv)))
    assert again.hosts == inv.hosts


def test_local_inventory_round_trip(tmp_path: Path) -> None:
    inv = local_inventory()
    again = load_inventory(write(tmp_path / "local.toml", hostfile_to_toml(inv)))
    assert again.hosts == inv.hosts


_label_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)


@settings(max_examples=60, deadline=None)
@given(
    labels=st.lists(_label_text, max_size=4),
    value=st.text(alphabet=st.characters(blacklist_categories=("Cs",))),
)
def test_toml_strings_round_trip(
    tmp_path_factory: pytest.TempPathFactory, labels: list[str], value: str
) -> None:
    host = HostSpec(name="h", address="h", user="u", labels=tuple(labels), env=(("V", value),))
    inv = Inventory(hosts=(host,), path=None, known_hosts=Path("/kh"), ssh_config=None)
    path = tmp_path_factory.mktemp("rt") / "inv.toml"
    path.write_text(hostfile_to_toml(inv), encoding="utf-8")
    assert load_inventory(path).hosts == (host,)


# ---------------------------------------------------------------------------------------------
# Jump hosts


def test_jump_chain_by_name_and_nested(tmp_path: Path) -> None:
    path = inventory(
        tmp_path,
        """
        [[hosts]]
        name = "gw"
        address = "gw.example.com"
        [[hosts]]
        name = "bastion"
        address = "10.0.0.1"
        proxy_jump = "gw"
        [[hosts]]
        name = "gpu1"
        address = "10.0.1.1"
        proxy_jump = "bastion"
        [[hosts]]
        name = "direct"
        address = "10.0.1.2"
        """,
    )
    inv = load_inventory(path)
    assert jump_chain(inv, inv.get("direct")) == []
    assert jump_chain(inv, inv.get("bastion")) == [inv.get("gw")]
    assert jump_chain(inv, inv.get("gpu1")) == [inv.get("gw"), inv.get("bastion")]


def test_jump_chain_list_follows_only_the_first_hops_own_jump(tmp_path: Path) -> None:
    path = inventory(
        tmp_path,
        """
        [[hosts]]
        name = "outer"
        address = "o"
        [[hosts]]
        name = "first"
        address = "f"
        proxy_jump = "outer"
        [[hosts]]
        name = "second"
        address = "s"
        proxy_jump = "elsewhere"
        [[hosts]]
        name = "gpu1"
        address = "g"
        proxy_jump = "first, second"
        """,
    )
    inv = load_inventory(path)
    assert [h.name for h in jump_chain(inv, inv.get("gpu1"))] == ["outer", "first", "second"]


def test_jump_chain_ad_hoc_hops(tmp_path: Path) -> None:
    path = inventory(
        tmp_path,
        """
        [[hosts]]
        name = "gpu1"
        address = "10.0.1.1"
        user = "alice"
        identity_file = "/keys/alice"
        connect_timeout = 3
        keepalive = 7
        proxy_jump = "jump@gate.example.com:2222,inner,ssh://[2001:db8::1]:23"
        """,
    )
    inv = load_inventory(path)
    gate, inner, v6 = jump_chain(inv, inv.get("gpu1"))
    assert gate == HostSpec(
        name="jump@gate.example.com:2222",
        address="gate.example.com",
        port=2222,
        user="jump",
        identity_files=("/keys/alice",),
        connect_timeout=3.0,
        keepalive=7.0,
    )
    assert (inner.name, inner.address, inner.port, inner.user) == ("inner", "inner", 22, "alice")
    assert (v6.address, v6.port) == ("2001:db8::1", 23)
    assert all(not hop.is_local for hop in (gate, inner, v6))


def test_jump_chain_ad_hoc_through_ssh_config(tmp_path: Path) -> None:
    cfg = ssh_config(
        tmp_path,
        """
        Host bastion
            HostName 192.0.2.1
            User ops
            Port 2200
            IdentityFile /keys/ops
            ProxyJump gw
        Host gw
            HostName 192.0.2.254
        """,
    )
    path = inventory(
        tmp_path,
        """
        [[hosts]]
        name = "gpu1"
        address = "10.0.1.1"
        identity_file = "/keys/me"
        proxy_jump = "bastion"
        """,
        ssh_config=cfg,
    )
    inv = load_inventory(path)
    gw, bastion = jump_chain(inv, inv.get("gpu1"))
    assert (bastion.address, bastion.user, bastion.port) == ("192.0.2.1", "ops", 2200)
    assert bastion.identity_files == ("/keys/ops", "/keys/me")
    assert gw.address == "192.0.2.254" and gw.user == "tester"


def test_jump_chain_user_at_inventory_host(tmp_path: Path) -> None:
    path = inventory(
        tmp_path,
        """
        [[hosts]]
        name = "bastion"
        address = "10.0.0.1"
        user = "root"
        port = 2200
        [[hosts]]
        name = "gpu1"
        address = "10.0.1.1"
        proxy_jump = "ops@bastion"
        """,
    )
    inv = load_inventory(path)
    (hop,) = jump_chain(inv, inv.get("gpu1"))
    assert (hop.name, hop.address, hop.user, hop.port) == ("ops@bastion", "10.0.0.1", "ops", 2200)


@pytest.mark.parametrize(
    ("hosts", "loop"),
    [
        ([("a", "a")], "a -> a"),
        ([("a", "b"), ("b", "a")], "a -> b -> a"),
        ([("a", "b"), ("b", "c"), ("c", "a")], "a -> b -> c -> a"),
        ([("a", "b,b"), ("b", None)], "a -> b -> b"),
        ([("a", "root@a:2200")], "a -> a"),
    ],
)
def test_jump_cycles_are_errors_at_load(
    tmp_path: Path, hosts: list[tuple[str, str | None]], loop: str
) -> None:
    body = ""
    for name, jump in hosts:
        body += f'[[hosts]]\nname = "{name}"\naddress = "{name}.lan"\n'
        if jump:
            body += f'proxy_jump = "{jump}"\n'
    path = inventory(tmp_path, body)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    message = str(info.value)
    assert message.startswith(f"{path}: host 'a': field 'proxy_jump': ")
    assert f"a jump chain without loops ({loop})" in message


def test_jump_chain_detects_cycles_in_hand_built_inventories() -> None:
    a = HostSpec(name="a", address="a", user="u", proxy_jump="b")
    b = HostSpec(name="b", address="b", user="u", proxy_jump="a")
    inv = Inventory(hosts=(a, b), path=None, known_hosts=Path("/kh"))
    with pytest.raises(InventoryError, match=r"field 'proxy_jump'.*\(a -> b -> a\)"):
        jump_chain(inv, a)


def test_jump_cycle_through_ssh_config(tmp_path: Path) -> None:
    cfg = ssh_config(tmp_path, "Host j1\n    ProxyJump j2\nHost j2\n    ProxyJump j1\n")
    path = inventory(
        tmp_path, '[[hosts]]\nname = "a"\naddress = "h"\nproxy_jump = "j1"\n', ssh_config=cfg
    )
    with pytest.raises(InventoryError, match=r"a -> j1 -> j2 -> j1"):
        load_inventory(path)


# ---------------------------------------------------------------------------------------------
# Architecture


def test_inventory_does_not_import_textual() -> None:
    code = "import sys, tui.model.inventory; sys.exit('textual' in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# Ports written in an address, and slot counts


@pytest.mark.parametrize(
    ("address", "extra", "want"),
    [
        ("h5:2222", "", ("h5", 2222)),
        ("10.0.0.5:2200", "", ("10.0.0.5", 2200)),
        ("[fe80::1]:2222", "", ("fe80::1", 2222)),
        ("[fe80::1]", "", ("fe80::1", 22)),
        ("fe80::1", "", ("fe80::1", 22)),  # a bare IPv6 address has no port
        ("h5", "port = 2201\n", ("h5", 2201)),
        ("h5:2222", "port = 2222\n", ("h5", 2222)),  # the same port twice agrees
    ],
)
def test_an_address_may_carry_its_port(
    tmp_path: Path, address: str, extra: str, want: tuple[str, int]
) -> None:
    path = inventory(tmp_path, f'[[hosts]]\nname = "h"\naddress = "{address}"\n{extra}')
    (host,) = load_inventory(path).hosts
    assert (host.address, host.port) == want


def test_a_port_in_the_address_beats_defaults_and_ssh_config(tmp_path: Path) -> None:
    cfg = ssh_config(tmp_path, "Host h\n    Port 2000\n")
    path = inventory(
        tmp_path,
        '[defaults]\nport = 2100\n[[hosts]]\nname = "h"\naddress = "h5:2222"\n',
        ssh_config=cfg,
    )
    assert load_inventory(path).hosts[0].port == 2222


@pytest.mark.parametrize(
    ("address", "extra", "field", "needle"),
    [
        ("h5:2222", "port = 22\n", "port", "the port the address names (2222)"),
        ("h5:0", "", "address", "a port 1..65535"),
        ("h5:65536", "", "address", "a port 1..65535"),
        ("h5:", "", "address", "a port 1..65535"),
        ("h5:ssh", "", "address", "a port 1..65535"),
        ("h5:99999999999999999999", "", "address", "a port 1..65535"),
        (":2222", "", "address", "host:port"),
        ("[fe80::1", "", "address", "[IPv6]:port"),
        ("[fe80::1]x", "", "address", "[IPv6]:port"),
        ("[]:22", "", "address", "[IPv6]:port"),
    ],
)
def test_a_bad_or_conflicting_port_in_an_address_is_refused(
    tmp_path: Path, address: str, extra: str, field: str, needle: str
) -> None:
    path = inventory(tmp_path, f'[[hosts]]\nname = "gpu5"\naddress = "{address}"\n{extra}')
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    message = str(info.value)
    assert message.startswith(f"{path}: host 'gpu5': field '{field}': expected "), message
    assert needle in message, message


def test_toml_slots_have_an_upper_bound(tmp_path: Path) -> None:
    ok = inventory(tmp_path, '[[hosts]]\nname = "h"\naddress = "h"\nslots = 4096\n')
    assert load_inventory(ok).hosts[0].slots == 4096
    bad = inventory(tmp_path, '[[hosts]]\nname = "h"\naddress = "h"\nslots = 99999999\n')
    with pytest.raises(InventoryError, match="field .slots.: expected an integer 1..4096"):
        load_inventory(bad)


def test_hostfile_host_port_is_the_address_and_port(tmp_path: Path) -> None:
    path = write(tmp_path / "hostfile", "h5:2222 slots=2\nroot@[fe80::1]:2200\nh6\n")
    inv = load_hostfile(path, {"ssh_config": ""})
    assert [(h.name, h.address, h.port, h.slots) for h in inv.hosts] == [
        ("h5-2222", "h5", 2222, 2),
        ("fe80-1-2200", "fe80::1", 2200, 1),
        ("h6", "h6", 22, 1),
    ]
    # The import writes what was meant, and reads back the same.
    again = write(tmp_path / "again.toml", hostfile_to_toml(inv))
    assert [(h.address, h.port) for h in load_inventory(again).hosts] == [
        ("h5", 2222), ("fe80::1", 2200), ("h6", 22)
    ]


@pytest.mark.parametrize(
    ("text", "line", "field", "got"),
    [
        ("a slots=2\nb slots=99999999999999999999\n", 2, "slots", "99999999999999999999"),
        ("a slots=4097\n", 1, "slots", "4097"),
        ("a max_slots=99999999999999999999\n", 1, "max_slots", "99999999999999999999"),
        ("a slots=\u00b2\n", 1, "slots", "\u00b2"),  # a digit to str.isdigit, not to int()
        ("a slots=-1\n", 1, "slots", "-1"),
        ("# x\nh5:0 slots=1\n", 2, "address", "h5:0"),
    ],
)
def test_hostfile_slots_and_ports_are_sane(
    tmp_path: Path, text: str, line: int, field: str, got: str
) -> None:
    path = write(tmp_path / "hostfile", text)
    with pytest.raises(InventoryError) as info:
        load_hostfile(path, {"ssh_config": ""})
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: host "), message
    assert f"field '{field}': expected " in message and repr(got).strip("'") in message, message
    assert (info.value.line, info.value.field, info.value.got) == (line, field, got)


# ---------------------------------------------------------------------------------------------
# [server] (where `rigdeck serve` runs) and attach_only


TWO_HOSTS = """
[[hosts]]
name = "head"
address = "10.0.0.1"
python = "/opt/py/bin/python3"

[[hosts]]
name = "gpu1"
address = "10.0.0.2"
"""


def test_server_table_defaults_and_values(tmp_path: Path) -> None:
    inv = load_inventory(inventory(tmp_path, TWO_HOSTS))
    assert inv.server is None
    inv = load_inventory(inventory(tmp_path, TWO_HOSTS + '\n[server]\nhost = "head"\n'))
    assert inv.server == ServerSpec(host="head", python=None, state_dir="~/.rigdeck/server")
    inv = load_inventory(inventory(
        tmp_path,
        TWO_HOSTS + '\n[server]\nhost = "gpu1"\npython = "python3.12"\nstate_dir = "/srv/rd"\n'))
    assert inv.server == ServerSpec(host="gpu1", python="python3.12", state_dir="/srv/rd")
    assert inv.server.metrics_listen is None  # opt-in: no /metrics unless asked
    hash(inv)
    for listen in ("127.0.0.1:9464", "[::1]:9100", "0.0.0.0:9464", "head.example:9464"):
        text = TWO_HOSTS + f'\n[server]\nhost = "head"\nmetrics_listen = "{listen}"\n'
        inv = load_inventory(inventory(tmp_path, text))
        assert inv.server == ServerSpec(host="head", metrics_listen=listen)
    assert inv.server.allow_jobs is False  # no jobs on the server's host unless the inventory says so
    inv = load_inventory(inventory(tmp_path, TWO_HOSTS + '\n[server]\nhost = "head"\nallow_jobs = true\n'))
    assert inv.server == ServerSpec(host="head", allow_jobs=True)
    assert inv.server.members_need_join is None  # the default: the server works it out (security.md)
    for said in (True, False):
        inv = load_inventory(inventory(tmp_path, TWO_HOSTS + f'\n[server]\nhost = "head"\nmembers_need_join = '
                                                          f'{str(said).lower()}\n'))
        assert inv.server == ServerSpec(host="head", members_need_join=said)
    # The table may come before the hosts it names.
    inv = load_inventory(inventory(tmp_path, '[server]\nhost = "head"\n' + TWO_HOSTS))
    assert inv.server is not None and inv.server.host == "head"


@pytest.mark.parametrize(
    ("server", "field", "expected"),
    [
        ('host = "nope"', "field 'host'",
         'expected the name of a host in this inventory (head, gpu1), got "nope" (str)'),
        ('python = "python3"', "field 'host'", "(required; hosts: head, gpu1)"),
        ("host = 5", "field 'host'", "expected the name of a host in this inventory, got 5 (int)"),
        ('host = "head"\npython = ""', "field 'python'", "a Python interpreter command or path"),
        ('host = "head"\nstate_dir = 3', "field 'state_dir'", "a directory path on the server host"),
        ('host = "head"\nport = 22', "field 'port'",
         "one of the known fields allow_jobs, host, members_need_join, metrics_listen, python, state_dir"),
        ('host = "head"\nallow_jobs = "yes"', "field 'allow_jobs'", "expected true or false (may jobs be placed"),
        ('host = "head"\nmembers_need_join = 1', "field 'members_need_join'",
         "expected true or false (must a member join before their jobs run"),
        ('host = "head"\nmetrics_listen = 9464', "field 'metrics_listen'",
         "expected ADDR:PORT on the server host where its /metrics is served, a TCP port from 1 to 65535, "
         "e.g. 127.0.0.1:9464 or [::1]:9464, got 9464 (int)"),
        ('host = "head"\nmetrics_listen = ":9464"', "field 'metrics_listen'",
         "(no address: write it out, 0.0.0.0 for every interface)"),
        ('host = "head"\nmetrics_listen = "127.0.0.1:0"', "field 'metrics_listen'",
         '(port 0 would be any free one, which nobody could find), got "127.0.0.1:0"'),
        ('host = "head"\nmetrics_listen = "::1:9464"', "field 'metrics_listen'", "(an IPv6 address goes in brackets)"),
        ('host = "head"\nmetrics_listen = "localhost:http"', "field 'metrics_listen'",
         "(the port is 'http', not a number from 0 to 65535)"),
    ],
)
def test_server_table_errors(tmp_path: Path, server: str, field: str, expected: str) -> None:
    path = inventory(tmp_path, TWO_HOSTS + "\n[server]\n" + server + "\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    message = str(info.value)
    assert message.startswith(f"{path}: [server]: {field}: "), message
    assert expected in message, message


def test_server_must_be_a_table(tmp_path: Path) -> None:
    path = write(tmp_path / "hosts.toml", 'server = "head"\n' + TWO_HOSTS)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert str(info.value) == f"{path}: field 'server': expected a table ([server]), got \"head\" (str)"


def test_attach_only_per_host_and_in_defaults(tmp_path: Path) -> None:
    inv = load_inventory(inventory(tmp_path, TWO_HOSTS))
    assert [h.attach_only for h in inv.hosts] == [False, False]
    body = "[defaults]\nattach_only = true\n" + TWO_HOSTS + "attach_only = false\n"
    inv = load_inventory(inventory(tmp_path, body))
    assert [h.attach_only for h in inv.hosts] == [True, False]
    path = inventory(tmp_path, TWO_HOSTS + 'attach_only = "yes"\n')
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert str(info.value) == (
        f"{path}: host 'gpu1': field 'attach_only': expected true or false, got \"yes\" (str)")


def test_server_and_attach_only_round_trip(tmp_path: Path) -> None:
    body = (TWO_HOSTS + "attach_only = true\n"
            + '\n[server]\nhost = "head"\npython = "python3.12"\nstate_dir = "/srv/rd"\n'
            + 'metrics_listen = "127.0.0.1:9464"\nallow_jobs = true\n')
    inv = load_inventory(inventory(tmp_path, body))
    again = load_inventory(write(tmp_path / "again.toml", hostfile_to_toml(inv)))
    assert again.hosts == inv.hosts
    assert again.server == inv.server


# ---------------------------------------------------------------------------------------------
# [slurm]: the hosts are a Slurm cluster's


def test_slurm_table_defaults_values_and_round_trip(tmp_path: Path) -> None:
    assert load_inventory(inventory(tmp_path, TWO_HOSTS)).slurm is None
    inv = load_inventory(inventory(tmp_path, TWO_HOSTS + "\n[slurm]\n"))
    assert inv.slurm == SlurmSpec() and inv.slurm.login_host(inv.hosts) == "head"  # the first host
    body = (TWO_HOSTS + '\n[slurm]\nlogin = "hpc-login"\npartition = "gpu"\naccount = "proj-17"\n'
            'qos = "normal"\nconstraint = "a100&ib"\n')
    ssh = tmp_path / "ssh_config"
    ssh.write_text("Host hpc-login\n    HostName 10.0.0.9\n")
    inv = load_inventory(inventory(tmp_path, body, ssh_config=str(ssh)))
    assert inv.slurm == SlurmSpec("hpc-login", "gpu", "proj-17", "normal", "a100&ib")
    assert inv.slurm.login_host(inv.hosts) == "hpc-login"  # an ~/.ssh/config alias is allowed
    assert inv.names == ["head", "gpu1", "hpc-login"] and inv.get("hpc-login").address == "10.0.0.9"
    with pytest.raises(InventoryError, match="hpc-login"):  # an alias no ssh config knows: said
        load_inventory(inventory(tmp_path, body))
    hash(inv)
    again = load_inventory(write(tmp_path / "again.toml", hostfile_to_toml(inv)))
    assert again.slurm == inv.slurm


@pytest.mark.parametrize(
    ("slurm", "field", "expected"),
    [
        ('partition = "gpu; rm -rf /"', "field 'partition'",
         "expected a Slurm partition name (letters, digits, '.', '_', '-'), got \"gpu; rm -rf /\" (str)"),
        ("account = 17", "field 'account'", "expected a Slurm account name (letters, digits, '.', '_', '-'), got 17"),
        ('qos = ""', "field 'qos'", "expected a Slurm QOS name"),
        ('constraint = "a100 & ib"', "field 'constraint'",
         'expected a Slurm --constraint expression: feature names joined by &, | or \',\' (no spaces), e.g. "a100&ib"'),
        ('login = "user@host"', "field 'login'", "expected the name of an inventory host or ~/.ssh/config alias"),
        ('partitions = "gpu"', "field 'partitions'",
         "one of the known fields account, constraint, login, partition, qos"),
    ],
)
def test_slurm_table_errors(tmp_path: Path, slurm: str, field: str, expected: str) -> None:
    path = inventory(tmp_path, TWO_HOSTS + "\n[slurm]\n" + slurm + "\n")
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    message = str(info.value)
    assert message.startswith(f"{path}: [slurm]: {field}: "), message
    assert expected in message, message


def test_slurm_must_be_a_table(tmp_path: Path) -> None:
    path = write(tmp_path / "hosts.toml", 'slurm = "gpu"\n' + TWO_HOSTS)
    with pytest.raises(InventoryError) as info:
        load_inventory(path)
    assert str(info.value) == f"{path}: field 'slurm': expected a table ([slurm]), got \"gpu\" (str)"


def test_match_exec_lines_run_though_invoke_is_imported_late(tmp_path: Path) -> None:
    """paramiko's ``Match exec`` runs through ``invoke``, which rigdeck imports only on first use
    (tui/remote/__init__.py): in a fresh process importing the SSH room leaves invoke unloaded,
    and a config whose ``Match exec`` lines pass or fail still resolves as OpenSSH would."""
    cfg = ssh_config(
        tmp_path,
        """
        Match exec "test -e {flag}"
            User flagged
        Host gpu1
            HostName 10.1.2.3
        """.format(flag=tmp_path / "flag"),
    )
    path = inventory(tmp_path, '[[hosts]]\nname = "gpu1"\n', ssh_config=cfg)
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from tui.remote.inventoryfile import load_inventory
        print("invoke ran before the lookup:", "invoke.tasks" in sys.modules)
        print("user:", load_inventory(Path({str(path)!r})).hosts[0].user)
        Path({str(tmp_path / "flag")!r}).touch()
        print("user:", load_inventory(Path({str(path)!r})).hosts[0].user)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["invoke ran before the lookup: False", "user: tester", "user: flagged"]


def test_paramikos_moved_cipher_warnings_are_not_shown_and_other_warnings_are() -> None:
    """paramiko 3.4 (the oldest the pin allows) reads TripleDES and Blowfish where newer
    ``cryptography`` warns that they moved: the SSH room hides those warnings from paramiko's own
    modules (each rigdeck command's stderr began with them: ``rigdeck: ...`` was no longer its
    first line), not the same words from elsewhere, nor paramiko's other warnings."""
    code = textwrap.dedent("""
        import warnings
        import tui.remote.transport
        from cryptography.utils import CryptographyDeprecationWarning as W
        moved = "TripleDES has been moved to cryptography.hazmat.decrepit.ciphers.algorithms.TripleDES"
        warnings.warn_explicit(moved, W, "paramiko/pkey.py", 100, module="paramiko.pkey")
        warnings.warn_explicit("Blowfish has been deprecated", W, "paramiko/transport.py", 259,
                               module="paramiko.transport")
        warnings.warn_explicit(moved, W, "mine.py", 1, module="mine")
        warnings.warn_explicit("something else", UserWarning, "paramiko/client.py", 7, module="paramiko.client")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    shown = [line for line in out.stderr.splitlines() if "Warning" in line]
    assert len(shown) == 2, out.stderr
    assert shown[0].startswith("mine.py:1: CryptographyDeprecationWarning: TripleDES has been moved"), shown
    assert shown[1].startswith("paramiko/client.py:7: UserWarning: something else"), shown
