"""Live telemetry across test bed hosts: streaming, simulated GPUs that follow work, stale/down/up,
daemon survival, and no TCP listener."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.testbed import TestBed
from tui.control.hostlinks import HostLinks
from tui.control.monitor import Monitor
from tui.model.hostviews import GpuView
from tui.model.state import HostStatus
from tui.remote.inventoryfile import load_inventory

pytestmark = pytest.mark.testbed


def wait_until(cond: Callable[[], Any], timeout: float, what: str, step: float = 0.1) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if cond():
            return time.monotonic() - start
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def netns_pids(bed: TestBed, index: int, needle: str) -> list[int]:
    """Processes of test bed host ``index`` (same network namespace) whose command line has ``needle``."""
    host_ns = os.readlink(f"/proc/{bed.hosts[index - 1].sshd_pid}/ns/net")
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/net") != host_ns:
                continue
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmd:
            out.append(int(entry))
    return out


@pytest.fixture
def monitored(testbed: TestBed, tmp_path: Path) -> Iterator[tuple[TestBed, Monitor]]:
    inv = load_inventory(testbed.write_inventory(tmp_path / "hosts.toml", connect_timeout=5.0))
    mon = Monitor(HostLinks(inv), rate_hz=1.0)
    mon.start()
    try:
        wait_until(lambda: all(h.status == "up" for h in mon.state.snapshot()), 60, "all hosts up")
        yield testbed, mon
    finally:
        mon.stop()
        mon.controller.close()


def test_twelve_simulated_gpus_stream_and_follow_a_cpu_burner(monitored: tuple[TestBed, Monitor]) -> None:
    bed, mon = monitored
    wait_until(lambda: mon.state.gpu_count() == 12, 10, "12 GPUs")
    snap = mon.state.snapshot()
    assert all(g.simulated for h in snap for g in h.gpus or ())
    assert sorted(str(h.hostname) for h in snap) == sorted(h.hostname for h in bed.hosts)

    before = {h.name: h.samples for h in snap}
    time.sleep(4.0)
    after = {h.name: h.samples for h in mon.state.snapshot()}
    for name in before:
        assert 3 <= after[name] - before[name] <= 6, (name, before[name], after[name])  # ~1 Hz

    burner = bed.popen(
        2,
        ["env", "RIGDECK_SIM_GPU=2", sys.executable, "-c",
         "import os; print(os.getpid(), flush=True)\nwhile True: pass"],
        stdout=subprocess.PIPE, text=True,
    )
    assert burner.stdout is not None
    burner_pid = int(burner.stdout.readline())  # its pid inside the host's PID namespace
    try:
        def gpu(host: str, idx: int) -> GpuView:
            view = mon.state.gpu(host, idx)
            assert view is not None and view.index == idx
            return view

        wait_until(lambda: (gpu("h2", 2).utilization_pct or 0) > 25, 20, "h2 GPU 2 busy")
        busy = gpu("h2", 2)
        assert burner_pid in [p.pid for p in busy.processes]
        assert (busy.memory_used_mb or 0) > 0
        # The others stay idle: on that host, and the same GPU index on the other hosts.
        assert (gpu("h2", 0).utilization_pct or 0) == 0
        assert (gpu("h1", 2).utilization_pct or 0) == 0
        assert (gpu("h3", 2).utilization_pct or 0) == 0
    finally:
        burner.kill()
        burner.wait()


def test_a_cut_link_goes_stale_then_down_and_comes_back(monitored: tuple[TestBed, Monitor]) -> None:
    bed, mon = monitored
    state = mon.state
    bed.link_down(3)
    try:
        stale_in = wait_until(lambda: state.get("h3").status == HostStatus.STALE, 10, "h3 stale", 0.05)
        assert stale_in <= 3.0, f"stale only after {stale_in:.2f}s"
        others = {n: state.get(n).samples for n in ("h1", "h2")}
        wait_until(lambda: state.get("h3").status == HostStatus.DOWN, 15, "h3 down")
        # Meanwhile the others kept streaming.
        assert all(state.get(n).samples >= others[n] + 2 for n in others)
        assert all(state.get(n).status == HostStatus.UP for n in others)
        assert state.get("h3").gpus, "the last good values are kept"
        assert all(g.stale for g in next(h for h in state.snapshot() if h.name == "h3").gpus or ())
    finally:
        bed.link_up(3)
    wait_until(lambda: state.get("h3").status == HostStatus.UP, 30, "h3 back up")


def test_daemon_survives_killed_ssh_sessions_and_controller(monitored: tuple[TestBed, Monitor]) -> None:
    bed, mon = monitored
    pid = mon.state.get("h1").agent_pid  # as the host sees it (its own PID namespace)
    assert pid

    def daemon_alive() -> bool:
        return bed.exec(1, ["kill", "-0", str(pid)]).returncode == 0

    # Every SSH session to h1 (sshd's process for each connection, not its listener) dies hard:
    # the telemetry stream's, which goes to the daemon's socket, and any attach with them.
    sessions = [p for p in netns_pids(bed, 1, "sshd: ") if p != bed.hosts[0].sshd_pid]
    assert sessions, "the controller's SSH sessions should be open on h1"
    for p in sessions:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass  # one of a connection's pair (privileged and user side) went with the other
    time.sleep(0.5)
    assert daemon_alive()
    wait_until(lambda: mon.state.get("h1").samples > 0 and mon.state.get("h1").status == HostStatus.UP, 30,
               "h1 up again")
    # A brand-new controller finds the same daemon.
    mon.stop()
    mon.controller.close()
    assert daemon_alive()
    inv = load_inventory(bed.inventory_path)
    with HostLinks(inv) as ctl:
        reports = ctl.probe(["h1"])
    assert reports[0].agent_pid == pid
    assert reports[0].sample is not None and len(reports[0].sample["gpus"]) == 4


def test_no_tcp_listener_and_private_socket_on_hosts(monitored: tuple[TestBed, Monitor]) -> None:
    bed, mon = monitored
    for i, h in enumerate(bed.hosts, start=1):
        daemon_pid = mon.state.get(h.name).agent_pid
        listeners = bed.exec(i, ["ss", "-ltnpH"]).stdout
        assert f"pid={daemon_pid}," not in listeners, listeners
        assert "python" not in listeners, listeners
        run = h.state_dir / "run"
        assert stat.S_IMODE(run.stat().st_mode) == 0o700
        sock = run / "agent.sock"
        assert stat.S_ISSOCK(sock.stat().st_mode) and stat.S_IMODE(sock.stat().st_mode) == 0o600


def test_hosts_json_includes_the_latest_sample(testbed: TestBed) -> None:
    inventory = str(testbed.inventory_path)
    # Deploy here: whether an earlier test of the shared bed did depends on which tests run.
    subprocess.run([sys.executable, "-m", "tui.cli", "deploy", "--inventory", inventory],
                   capture_output=True, text=True, timeout=180, check=True)
    out = subprocess.run(
        [sys.executable, "-m", "tui.cli", "hosts", "--json", "--inventory", inventory],
        capture_output=True, text=True, timeout=120,
    )
    data = json.loads(out.stdout)
    assert len(data) == 3
    for h in data:
        assert h["agent_version"] is not None, h
        s = h["sample"]
        assert s and s["simulated"] is True and len(s["gpus"]) == 4
        assert {"utilization_pct", "memory_used_mb", "temperature_c", "power_w"} <= set(s["gpus"][0])
        assert s["host"]["mem_total_mb"] > 0
