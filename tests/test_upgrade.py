"""A newer agent meets an older daemon: it hands over at once when idle, and waits for its jobs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import bedclean
from tests.kit import wait_until
from tui.control.hostlinks import HostLinks
from tui.control.monitor import Monitor
from tui.model.inventory import HostSpec, Inventory
from tui.remote.bundle import REPO_ROOT, AgentBundle, build_agent


def old_bundle(tmp: Path) -> AgentBundle:
    """The same agent with one changed byte: a different version, as after an upgrade."""
    src = tmp / "old-src"
    for pkg in ("agent", "runtime"):
        shutil.copytree(REPO_ROOT / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    with open(src / "agent" / "__init__.py", "a") as f:
        f.write("# an older build\n")
    return build_agent(tmp / "old-cache", root=src)


@pytest.fixture
def local(tmp_path: Path) -> Iterator[tuple[Inventory, Path]]:
    state = tmp_path / "state"
    spec = HostSpec(name="here", address="localhost", transport="local", python=sys.executable,
                    state_dir=str(state), sim_gpus=1)
    yield Inventory(hosts=(spec,), path=None, known_hosts=tmp_path / "kh"), state
    # The pid file names the newest daemon; one an upgrade handed over from may linger too.
    bedclean.stop_daemons_under(state)


def start_old_daemon(inv: Inventory, old: AgentBundle) -> int:
    with HostLinks(inv, bundle_factory=lambda: old) as ctl:
        report = ctl.probe()[0] if ctl.deploy()[0].error is None else None
    assert report is not None and report.agent_version == old.version and report.agent_pid
    return report.agent_pid


def running_job(state: Path) -> subprocess.Popen[bytes]:
    """A job the daemon of ``state`` looks after: its job host process is alive until killed."""
    job_host = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    job_dir = state / "jobs" / "j1"
    job_dir.mkdir(parents=True)
    (job_dir / "state.json").write_text(json.dumps({"job_id": "j1", "state": "running", "jobhost_pid": job_host.pid}))
    return job_host


def test_idle_old_daemon_hands_over_to_the_new_agent(local: tuple[Inventory, Path], tmp_path: Path) -> None:
    inv, state = local
    old, new = old_bundle(tmp_path), build_agent(tmp_path / "new-cache")
    assert old.version != new.version
    old_pid = start_old_daemon(inv, old)
    with Monitor(HostLinks(inv, bundle_factory=lambda: new)) as mon:
        wait_until(lambda: mon.state.get("here").agent_version == new.version
                   and mon.state.get("here").samples > 0, 30, "the new daemon streaming")
        h = mon.state.get("here")
        assert h.agent_pid != old_pid and h.upgrade_pending is None
    assert "handing over to" in (state / "agent.log").read_text()


def test_busy_old_daemon_keeps_its_job_and_upgrades_when_idle(local: tuple[Inventory, Path], tmp_path: Path) -> None:
    inv, state = local
    old, new = old_bundle(tmp_path), build_agent(tmp_path / "new-cache")
    old_pid = start_old_daemon(inv, old)
    job_host = running_job(state)
    try:
        with Monitor(HostLinks(inv, bundle_factory=lambda: new)) as mon:
            wait_until(lambda: mon.state.get("here").upgrade_pending == new.version
                       and mon.state.get("here").samples > 0, 30, "upgrade pending, old daemon streaming")
            h = mon.state.get("here")
            assert h.agent_pid == old_pid and h.agent_version == old.version
            job_host.kill()  # the job ends
            job_host.wait()
            wait_until(lambda: mon.state.get("here").agent_version == new.version, 30, "handover after the job")
            assert mon.state.get("here").agent_pid != old_pid
    finally:
        if job_host.poll() is None:
            job_host.kill()


def _daemon_pid(state: Path) -> int:
    return int((state / "run" / "daemon.pid").read_text())


def _runs(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_command_alone_hands_an_idle_old_daemon_over(local: tuple[Inventory, Path], tmp_path: Path) -> None:
    """No app, no monitor: a request (any command's: launch, status, jobs) is the first contact
    after an upgrade, and the old daemon hands over at once; the request is answered by the new."""
    inv, state = local
    old, new = old_bundle(tmp_path), build_agent(tmp_path / "new-cache")
    old_pid = start_old_daemon(inv, old)
    assert old.version in _runs(old_pid)
    with HostLinks(inv, bundle_factory=lambda: new) as ctl:
        sample = ctl.agent("here").sample(timeout=10)
        assert sample.get("gpus"), sample  # answered (by the new daemon, its simulated GPU)
    wait_until(lambda: not _runs(old_pid), 10, "the old daemon gone")
    pid = _daemon_pid(state)
    assert pid != old_pid and new.version in _runs(pid), _runs(pid)
    assert "handing over to" in (state / "agent.log").read_text()


def test_a_command_leaves_a_busy_old_daemon_its_jobs_and_it_hands_over_when_they_end(
        local: tuple[Inventory, Path], tmp_path: Path) -> None:
    inv, state = local
    old, new = old_bundle(tmp_path), build_agent(tmp_path / "new-cache")
    old_pid = start_old_daemon(inv, old)
    job_host = running_job(state)
    try:
        with HostLinks(inv, bundle_factory=lambda: new) as ctl:
            sample = ctl.agent("here").sample(timeout=10)  # the old daemon answers, keeps its job
            assert sample.get("gpus"), sample
            assert _daemon_pid(state) == old_pid and old.version in _runs(old_pid)
            job_host.kill()  # the job ends: it hands over by itself (upgrade scheduled when idle)
            job_host.wait()
            wait_until(lambda: not _runs(old_pid), 30, "handover after the job")
        with HostLinks(inv, bundle_factory=lambda: new) as ctl:
            ctl.agent("here").sample(timeout=10)
        assert new.version in _runs(_daemon_pid(state))
    finally:
        if job_host.poll() is None:
            job_host.kill()
