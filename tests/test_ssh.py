"""SSH transport, host keys, ProxyJump and agent deployment against real sshd hosts (test bed)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from tests._require import require
from tests.testbed import TestBed
from tui.control.hostlinks import HostLinks
from tui.control.monitor import Monitor
from tui.remote.bundle import build_agent
from tui.remote.inventoryfile import load_inventory
from tui.remote.transport import SSHTransport, make_transport

pytestmark = pytest.mark.testbed


def rigdeck(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "tui.cli", *args], capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"rigdeck {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def hosts_json(*args: str, check: bool = True) -> list[dict[str, Any]]:
    proc = rigdeck(*args, "--json", check=check)
    return json.loads(proc.stdout)


def ssh_keygen_fingerprint(pubkey: Path) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", str(pubkey)], capture_output=True, text=True, check=True)
    return out.stdout.split()[1]


def test_deploy_to_three_hosts_then_nothing_to_copy(testbed: TestBed) -> None:
    for h in testbed.hosts:
        shutil.rmtree(h.state_dir / "agent", ignore_errors=True)
    inv = str(testbed.inventory_path)
    bundle = build_agent()
    version = bundle.version

    first = hosts_json("deploy", "--inventory", inv)
    assert [r["name"] for r in first] == ["h1", "h2", "h3"]
    for r, h in zip(first, testbed.hosts, strict=True):
        assert r["reachable"] and r["error"] is None, r["error"]
        assert r["copied"] is True and r["bytes_copied"] == bundle.size
        assert r["agent_version"] == version
        # What it checked: the file on the host's disk (read back, hashed). Nothing ran there
        # (no daemon linked from this CLI), so no facts are claimed.
        assert r["checked"] == ["sha256"] and r["python"] is None and r["hostname"] is None
        # The file landed in that host's private state dir and nowhere else, whole.
        assert (h.state_dir / "agent" / version / "agent.pyz").read_bytes() == bundle.path.read_bytes()
        assert (h.state_dir / "agent" / "current").read_text() == f"{version}\n"
        assert not list((h.state_dir / "agent" / version).glob("*.part-*"))

    # A damaged copy (same size, one byte changed) is found by its hash and replaced.
    damaged = testbed.hosts[1].state_dir / "agent" / version / "agent.pyz"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    second = hosts_json("deploy", "--inventory", inv)
    assert [r["copied"] for r in second] == [False, True, False]
    assert [r["bytes_copied"] for r in second] == [0, bundle.size, 0]
    assert all(r["agent_version"] == version and r["checked"] == ["sha256"] for r in second)
    assert damaged.read_bytes() == bundle.path.read_bytes()

    probe = hosts_json("hosts", "--inventory", inv)
    for r, h in zip(probe, testbed.hosts, strict=True):
        assert r["agent_version"] == version and r["agent_current"] and "python" in r["checked"]
        # Each host speaks for itself: its own UTS hostname and its own address.
        assert r["hostname"] == h.hostname and h.address in r["addresses"]
        assert r["cpus"] == os.cpu_count() and r["memory_total_mb"] > 0
        assert len(r["gpus"]) == 4 and all(g["simulated"] for g in r["gpus"])


OLD_PYTHON = "/root/.pyenv/versions/3.6.15/bin/python3"


def test_a_host_python_that_cannot_run_the_agent_is_named_before_a_job_starts(
        testbed: TestBed, tmp_path: Path) -> None:
    """Deploy runs nothing on the hosts; the agent's first start does, and says clearly when
    the inventory's Python is missing (h2) or too old (h1, a real Python 3.6), before any job
    process starts there. h3's Python is fine and its host unaffected."""
    require(os.access(OLD_PYTHON, os.X_OK), f"no Python 3.6 at {OLD_PYTHON} (pyenv install 3.6.15)")
    # No daemon runs on h1 and h2 (an earlier test's would answer on its socket, started by a
    # good Python): the agent's first start there is the one this test is about.
    with HostLinks(load_inventory(testbed.inventory_path)) as ctl:
        for h in testbed.hosts[:2]:
            ctl.agent(h.name).shutdown(force=True)
    for h in testbed.hosts[:2]:
        sock = h.state_dir / "run" / "agent.sock"
        deadline = time.monotonic() + 30
        while sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not sock.exists(), f"{h.name}: the daemon did not stop"
    inv_path = testbed.write_inventory(tmp_path / "hosts.toml")
    text = inv_path.read_text()
    for h, python in ((testbed.hosts[0], OLD_PYTHON), (testbed.hosts[1], "/nonexistent/python3")):
        line = f'name = "{h.name}"\naddress = "{h.address}"'
        assert line in text
        text = text.replace(line, f'{line}\npython = "{python}"')
    inv_path.write_text(text)
    inv = str(inv_path)
    env = {**os.environ, "RIGDECK_INVENTORY": inv}

    deployed = hosts_json("deploy", "--inventory", inv)
    assert [(r["error"], r["checked"]) for r in deployed] == [(None, ["sha256"])] * 3

    spec = tmp_path / "old.toml"
    spec.write_text('name = "old"\ncommand = ["sleep", "61.5"]\nworkdir = "/"\nlauncher = "direct"\n'
                    'nodes = 1\nprocesses_per_node = 1\nhosts = ["h1"]\n')
    for host, needle in (("h1", f"needs Python 3.9 or newer; {OLD_PYTHON} is Python 3.6.15"),
                         ("h2", "/nonexistent/python3")):
        spec.write_text(spec.read_text().replace('hosts = ["h1"]', f'hosts = ["{host}"]'))
        launch = subprocess.run([sys.executable, "-m", "tui.cli", "launch", str(spec)], capture_output=True,
                                text=True, timeout=120, env={**env, "RIGDECK_HOME": str(tmp_path / host)})
        said = launch.stdout + launch.stderr
        # Not started: it waits, and says for what (the queue's line names the host and why).
        assert "queued" in said and f"host '{host}' is down" in said and needle in said, said
        assert "the agent cannot start" in said or host == "h2", said
        spec.write_text(spec.read_text().replace(f'hosts = ["{host}"]', 'hosts = ["h1"]'))
    # Nothing of a job started on either host: no rank process, no job directory of this one.
    for i in (1, 2):
        ps = testbed.exec(i, ["ps", "-ww", "-eo", "args"])
        assert "sleep 61.5" not in ps.stdout, ps.stdout
    probe = hosts_json("hosts", "--inventory", inv, check=False)
    assert "3.9" in (probe[0]["error"] or "") and "/nonexistent/python3" in (probe[1]["error"] or "")
    assert probe[2]["error"] is None and "python" in probe[2]["checked"]


def test_unknown_key_refused_then_accepted_then_changed_key_refused(
    testbed_factory: Any, tmp_path: Path
) -> None:
    bed: TestBed = testbed_factory(1)
    h = bed.hosts[0]
    known = tmp_path / "known_hosts"
    inv = bed.write_inventory(tmp_path / "hosts.toml", known_hosts=str(known))
    expected_fp = ssh_keygen_fingerprint(Path(str(h.host_key) + ".pub"))

    refused = hosts_json("hosts", "--inventory", str(inv), check=False)[0]
    assert refused["reachable"] is False
    assert refused["error_kind"] == "unknown-host-key"
    assert refused["host_key"] == {"type": "ssh-ed25519", "fingerprint": expected_fp}
    assert expected_fp in refused["error"]
    assert not known.exists() or h.address not in known.read_text()

    accepted = hosts_json("hosts", "--inventory", str(inv), "--accept-new")[0]
    assert accepted["reachable"] and accepted["hostname"] == h.hostname
    assert f"{h.address} ssh-ed25519 " in known.read_text()
    # Recorded: a plain run now succeeds.
    assert hosts_json("hosts", "--inventory", str(inv))[0]["reachable"]

    bed.regenerate_host_key(1)
    for extra in ((), ("--accept-new",)):
        changed = hosts_json("hosts", "--inventory", str(inv), *extra, check=False)[0]
        assert changed["reachable"] is False
        assert changed["error_kind"] == "host-key-changed"
        assert "HOST KEY HAS CHANGED" in changed["error"]
    human = rigdeck("hosts", "--inventory", str(inv), check=False)
    assert human.returncode == 1 and "HOST KEY HAS CHANGED" in human.stderr


def test_wrong_user_key_is_a_clear_authentication_error(testbed: TestBed, tmp_path: Path) -> None:
    key = tmp_path / "stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    inv = testbed.write_inventory(tmp_path / "hosts.toml", identity_file=str(key), hosts=[1])
    r = hosts_json("hosts", "--inventory", str(inv), check=False)[0]
    assert r["reachable"] is False and r["error_kind"] == "auth"
    assert "authentication failed for root@" in r["error"] and str(key) in r["error"]


def test_dead_sshd_and_dead_link_do_not_hold_up_the_others(testbed_factory: Any, tmp_path: Path) -> None:
    bed: TestBed = testbed_factory(3)
    timeout = 3.0
    inv = bed.write_inventory(tmp_path / "hosts.toml", connect_timeout=timeout)
    bed.stop_sshd(2)  # refused at once
    bed.link_down(3)  # silent: only the timeout ends it
    start = time.monotonic()
    reports = hosts_json("hosts", "--inventory", str(inv), check=False)
    wall = time.monotonic() - start
    by = {r["name"]: r for r in reports}
    assert by["h1"]["reachable"] and by["h1"]["error"] is None
    assert by["h2"]["reachable"] is False and by["h2"]["error_kind"] == "unreachable"
    assert by["h3"]["reachable"] is False and by["h3"]["error_kind"] == "unreachable"
    assert "did not answer within 3s" in by["h3"]["error"]
    # The live host did not wait for the dead ones; the silent one ended at its own timeout.
    assert by["h1"]["elapsed_s"] < timeout
    assert by["h3"]["elapsed_s"] < timeout + 2.0
    assert wall < timeout + 10.0  # interpreter start-up and the agent probe included
    bed.link_up(3)
    bed.start_sshd(2)
    again = hosts_json("hosts", "--inventory", str(inv))
    assert all(r["reachable"] for r in again)


def test_a_stream_calls_back_on_output_and_at_its_end(testbed: TestBed) -> None:
    """What the monitor's reader waits on instead of a descriptor per host: a call when output
    arrives (once at once for output already waiting), and one when the command ends."""
    import threading

    inv = load_inventory(testbed.inventory_path)
    t = make_transport(inv, inv.hosts[0])
    t.connect()
    try:
        # What a shell's start-up files may say on stderr: logged, never a call (paramiko's own
        # pipe was set by it for good, and the reader woke at once, forever).
        stream = t.open_stream(["sh", "-c", "echo 'warning: a login shell says' >&2; echo early; read a; "
                                "echo \"got $a\"; read b; exit 0"])
        calls = threading.Semaphore(0)
        deadline = time.monotonic() + 20
        while not stream.recv(0.0) and time.monotonic() < deadline:  # nothing yet: None, not b""
            time.sleep(0.05)
        stream.send(b"x\n")
        time.sleep(1.0)  # "got x" waits in the channel before anyone asks to be told
        assert stream.notify(calls.release)
        assert calls.acquire(timeout=10), "no call for the output already waiting"
        assert stream.recv(0.0) == b"got x\n"
        assert not calls.acquire(timeout=0.5)  # told once, for stdout; stderr tells no one
        with pytest.raises(RuntimeError):
            stream.fileno()  # paramiko's pipe would replace the hook
        stream.send(b"y\n")
        while True:  # the command ends: told, and the stream reads its end
            assert calls.acquire(timeout=10), "no call at the stream's end"
            got = stream.recv(0.0)
            if got == b"":
                break
            assert got is None
        stream.close()
    finally:
        t.close()


def test_proxy_jump_through_another_test_bed_host(testbed_factory: Any, tmp_path: Path) -> None:
    bed: TestBed = testbed_factory(2)
    jump, target = bed.hosts
    # Make the target unreachable from the controller's address: only the jump host gets in.
    blocked = bed.exec(
        2, ["iptables", "-A", "INPUT", "-s", bed.gateway, "-p", "tcp", "--dport", "22", "-j", "DROP"]
    )
    why = f"iptables unusable in the namespace: {blocked.stderr.strip()}"
    require(blocked.returncode == 0, why)
    direct = bed.write_inventory(tmp_path / "direct.toml", hosts=[2], connect_timeout=2.0)
    r = hosts_json("hosts", "--inventory", str(direct), check=False)[0]
    assert r["reachable"] is False  # proves the direct path is closed

    inv_path = bed.write_inventory(tmp_path / "hosts.toml")
    text = inv_path.read_text().replace(
        f'name = "h2"\naddress = "{target.address}"',
        f'name = "h2"\naddress = "{target.address}"\nproxy_jump = "h1"',
    )
    assert "proxy_jump" in text
    inv_path.write_text(text)
    inv = load_inventory(inv_path)
    t = make_transport(inv, inv.get("h2"))
    with t:
        res = t.run(["sh", "-c", 'echo "$SSH_CONNECTION"; hostname'])
    client_ip, _, server_ip, _ = res.stdout.split("\n")[0].split()
    assert client_ip == jump.address and server_ip == target.address
    assert res.stdout.split("\n")[1] == target.hostname

    with HostLinks(inv) as ctl:
        reports = ctl.deploy(["h2"])
    assert reports[0].error is None and reports[0].copied is True
    with HostLinks(inv) as ctl:  # the daemon, reached through the jump, is the target's
        assert ctl.agent("h2").facts().hostname == target.hostname


def test_malformed_inventory_from_the_cli(tmp_path: Path) -> None:
    bad = tmp_path / "hosts.toml"
    bad.write_text('[[hosts]]\nname = "gpu1"\naddress = "10.0.0.1"\nport = "22a"\n')
    proc = rigdeck("hosts", "--inventory", str(bad), check=False)
    assert proc.returncode == 2
    assert str(bad) in proc.stderr and "gpu1" in proc.stderr and "port" in proc.stderr
    assert proc.stdout == ""


def _attaches(bed: TestBed, i: int) -> list[str]:
    """The agent attach processes on host i (each bridges one link to the daemon)."""
    ps = bed.exec(i, ["ps", "-ww", "-eo", "args"])
    return [ln for ln in ps.stdout.splitlines() if "agent.pyz attach" in ln]


def test_a_running_daemon_is_linked_through_its_socket_and_an_sshd_that_refuses_gets_the_attach(
        testbed_factory: Any) -> None:
    """A link to a host whose daemon runs goes to the daemon's unix socket through the SSH
    connection: no login shell and no attach process on the host. Where sshd does not forward
    to unix sockets (AllowStreamLocalForwarding no), the link is the attach, as before."""
    bed: TestBed = testbed_factory(1, sim_gpus=2)
    inv = load_inventory(bed.inventory_path)
    with HostLinks(inv) as first:  # the first start: the attach starts the daemon
        assert first.agent("h1").ping() is not None
        assert len(_attaches(bed, 1)) == 1
    with HostLinks(inv) as ctl:
        assert ctl.agent("h1").facts().hostname == bed.hosts[0].hostname
        assert _attaches(bed, 1) == [], "linked through the socket: no process on the host"
        mon = Monitor(ctl, rate_hz=2.0)  # the app's telemetry stream: its own connection, same way
        mon.start()
        try:
            deadline = time.monotonic() + 60
            while not any(h.samples > 1 for h in mon.state.hosts.values()):
                assert time.monotonic() < deadline, "no telemetry came through the daemon's socket"
                time.sleep(0.1)
            assert _attaches(bed, 1) == [], "streaming through the socket: no process on the host"
        finally:
            mon.stop()
    # The archive is checked on the way: the daemon hashes its version's agent.pyz at each hello;
    # intact, nothing is read back over SFTP; damaged, it is put back (installed and read back
    # over SFTP) before the link is used.
    h = bed.hosts[0]
    pyz = h.state_dir / "agent" / build_agent().version / "agent.pyz"
    good = pyz.read_bytes()
    installs: list[str] = []
    real_install = SSHTransport.install_checked

    def counted(self: SSHTransport, data: bytes, path: str, sha256: str, mode: int = 0o600) -> bool:
        installs.append(path)
        return real_install(self, data, path, sha256, mode)

    with mock.patch.object(SSHTransport, "install_checked", counted):
        with HostLinks(inv) as ctl:
            hello = ctl.hello("h1")
            assert hello["archive"] == {"sha256": build_agent().sha256, "current": build_agent().version}, hello
            assert installs == [], "an intact archive is not read back over SFTP"
        pyz.write_bytes(good[:-10] + b"x" * 10)
        with HostLinks(inv) as ctl:
            assert ctl.agent("h1").ping() is not None
            assert pyz.read_bytes() == good
            assert installs and installs[0].endswith(f"/agent/{build_agent().version}/agent.pyz"), installs
    config = h.sshd_config.read_text().replace("AllowStreamLocalForwarding yes", "AllowStreamLocalForwarding no")
    h.sshd_config.write_text(config)
    bed.stop_sshd(1)
    bed.start_sshd(1)
    with HostLinks(inv) as ctl:
        try:
            assert ctl.agent("h1").facts().hostname == h.hostname
            assert len(_attaches(bed, 1)) == 1, "refused the socket: the attach bridges the link"
        finally:
            ctl.agent("h1").shutdown(force=True)
