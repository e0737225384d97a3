"""The local transport and the controller on this machine alone (no SSH), as `make run` uses them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit.local import local_inventory
from tui.control.hostlinks import HostLinks
from tui.model.inventory import HostSpec, Inventory
from tui.remote.bundle import build_agent
from tui.remote.transport import Backoff, CommandTimeout, LocalTransport, TransportError


def test_local_transport_runs_argument_lists_without_a_shell(tmp_path: Path) -> None:
    t = LocalTransport(local_inventory(tmp_path).hosts[0])
    with t:
        # A value full of shell syntax arrives as one literal argument.
        res = t.run([sys.executable, "-c", "import sys; print(sys.argv[1])", "$(rm -rf x); `id` *"])
        assert res.ok and res.stdout.strip() == "$(rm -rf x); `id` *"
        res = t.run(["sh", "-c", "exit 7"])
        assert res.exit_code == 7
        res = t.run([sys.executable, "-c", "import os; print(os.environ['RD_X'])"], env={"RD_X": "y z"})
        assert res.stdout.strip() == "y z"
        with pytest.raises(CommandTimeout):
            t.run(["sleep", "5"], timeout=0.3)
        src = tmp_path / "f"
        src.write_bytes(b"payload")
        t.put_file(src, str(tmp_path / "a" / "b" / "f"), mode=0o600)
        assert (tmp_path / "a" / "b" / "f").read_bytes() == b"payload"
        assert (tmp_path / "a" / "b" / "f").stat().st_mode & 0o777 == 0o600
        assert t.remote_path("~/x") == os.path.expanduser("~/x")


def test_backoff_grows_and_is_capped() -> None:
    b = Backoff(initial=0.5, factor=2, maximum=4)
    delays = [b.next_delay() for _ in range(8)]
    assert 0.25 <= delays[0] <= 0.5
    assert all(d <= 4 for d in delays)
    assert delays[-1] >= 2  # reached the cap's half-range
    b.reset()
    assert b.next_delay() <= 0.5


def test_local_deploy_installs_once_then_copies_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    inv = local_inventory(state, sim_gpus=2)
    bundle = build_agent(tmp_path / "cache")
    with HostLinks(inv, bundle_factory=lambda: bundle) as ctl:
        first = ctl.deploy()[0]
        assert first.error is None, first.error
        assert first.reachable and first.copied is True and first.agent_version == bundle.version
        assert first.bytes_copied == bundle.size
        assert (state / "agent" / bundle.version / "agent.pyz").read_bytes() == bundle.path.read_bytes()
        assert (state / "agent" / "current").read_text().strip() == bundle.version
        # What it verified: the file on the host's disk. No agent ran: Python is not checked,
        # and no facts are claimed.
        assert first.checked == ["sha256"] and first.python is None and first.gpus == []
        second = ctl.deploy()[0]
        assert second.copied is False and second.bytes_copied == 0
        assert second.agent_version == bundle.version
        probe = ctl.probe()[0]
        assert probe.agent_version == bundle.version and probe.agent_current
        assert "python" in probe.checked and len(probe.gpus) == 2 and probe.gpu_source == "simulated"
        # With a daemon linked (the app, a server), deploy asks it: Python checked, facts told.
        assert ctl.agent("here").ping() is not None
        try:
            third = ctl.deploy()[0]
            assert third.checked == ["sha256", "python"] and third.copied is False
            assert len(third.gpus) == 2 and third.python
        finally:
            ctl.agent("here").shutdown(force=True)


def test_deploy_replaces_a_tampered_agent(tmp_path: Path) -> None:
    state = tmp_path / "state"
    bundle = build_agent(tmp_path / "cache")
    with HostLinks(local_inventory(state), bundle_factory=lambda: bundle) as ctl:
        assert ctl.deploy()[0].copied
        pyz = state / "agent" / bundle.version / "agent.pyz"
        pyz.write_bytes(pyz.read_bytes() + b"tampered")
        again = ctl.deploy()[0]
        assert again.copied is True and again.error is None
        assert pyz.read_bytes() == bundle.path.read_bytes()


def test_connecting_checks_the_installed_agent_and_deploys_again_when_it_is_not_whole(tmp_path: Path) -> None:
    """A connection starts with one command when the agent is installed: its attach, which
    checks the archive's SHA-256 first. A damaged or cut archive is refused there, and the
    controller deploys (hash-checked again) before attaching."""
    state = tmp_path / "state"
    bundle = build_agent(tmp_path / "cache")
    pyz = state / "agent" / bundle.version / "agent.pyz"
    with HostLinks(local_inventory(state), bundle_factory=lambda: bundle) as ctl:
        try:
            assert ctl.deploy()[0].copied
            for damage in (lambda b: b + b"tampered", lambda b: b[: len(b) // 2]):
                ctl.close()
                pyz.write_bytes(damage(bundle.path.read_bytes()))
                (state / "agent" / "current").write_text("older\n")
                assert ctl.agent("here").ping() is not None
                assert pyz.read_bytes() == bundle.path.read_bytes()
                assert (state / "agent" / "current").read_text().strip() == bundle.version
            # Whole and installed: the attach alone, which makes its version the current one.
            ctl.close()
            (state / "agent" / "current").write_text("older\n")
            before = pyz.stat().st_mtime_ns
            assert ctl.agent("here").ping() is not None
            assert pyz.stat().st_mtime_ns == before
            assert (state / "agent" / "current").read_text().strip() == bundle.version
        finally:
            ctl.agent("here").shutdown(force=True)


def test_missing_python_is_reported_not_raised(tmp_path: Path) -> None:
    spec = HostSpec(name="here", address="localhost", transport="local",
                    python="/nonexistent/python3", state_dir=str(tmp_path))
    inv = Inventory(hosts=(spec,), path=None, known_hosts=tmp_path / "kh")
    with HostLinks(inv) as ctl:
        r = ctl.probe()[0]
    assert r.error and "/nonexistent/python3" in r.error


def test_cli_hosts_json_on_the_local_machine(tmp_path: Path) -> None:
    inv = tmp_path / "hosts.toml"
    inv.write_text(
        "[[hosts]]\n"
        f'name = "here"\naddress = "localhost"\ntransport = "local"\npython = "{sys.executable}"\n'
        f'state_dir = "{tmp_path / "state"}"\n'
    )
    out = subprocess.run(
        [sys.executable, "-m", "tui.cli", "hosts", "--json", "--inventory", str(inv)],
        capture_output=True, text=True, check=True,
    )
    data = json.loads(out.stdout)
    assert isinstance(data, list) and len(data) == 1
    h = data[0]
    for key in ("name", "address", "reachable", "error", "agent_version", "python", "cpus",
                "memory_total_mb", "gpus"):
        assert key in h
    assert h["name"] == "here" and h["reachable"] is True and h["error"] is None
    assert h["cpus"] == os.cpu_count()


OLD_PYTHON = "/root/.pyenv/versions/3.6.15/bin/python3"


def test_a_python_too_old_for_the_agent_is_a_clear_error_at_its_first_start(tmp_path: Path) -> None:
    """Deploy copies and hash-checks the archive without running it; the first start (any
    request) runs it, and a host Python older than the agent's is named, with its version."""
    if not os.access(OLD_PYTHON, os.X_OK):
        pytest.skip(f"no Python 3.6 at {OLD_PYTHON} (pyenv install 3.6.15)")
    state = tmp_path / "state"
    spec = HostSpec(name="here", address="localhost", transport="local", python=OLD_PYTHON,
                    state_dir=str(state))
    inv = Inventory(hosts=(spec,), path=None, known_hosts=tmp_path / "kh")
    bundle = build_agent(tmp_path / "cache")
    with HostLinks(inv, bundle_factory=lambda: bundle) as ctl:
        report = ctl.deploy()[0]
        assert report.error is None and report.copied and report.checked == ["sha256"]
        with pytest.raises(TransportError) as e:
            ctl.agent("here").ping()
    msg = str(e.value)
    assert "needs Python 3.9 or newer" in msg and "3.6.15" in msg and OLD_PYTHON in msg, msg
    assert not (state / "run").exists() or not any((state / "run").iterdir())  # nothing started


def test_the_readmes_first_job_is_in_the_repo_and_runs_as_shown_on_the_one_host_cluster(tmp_path: Path) -> None:
    """The README's first spec is examples/ddp/first.toml, word for word, and `rigdeck launch
    examples/ddp/first.toml --wait`, with no inventory (the one-host cluster `make run` opens),
    trains it to its 60th step."""
    import re

    from tests.bedclean import stop_daemons_under

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    section = readme.split("## The first job", 1)[1]
    shown = re.search(r"```toml\n(.*?)```", section, re.S)
    assert shown and "examples/ddp/first.toml" in section.split("```toml", 1)[0]
    assert shown.group(1) == (root / "examples" / "ddp" / "first.toml").read_text()
    env = {k: v for k, v in os.environ.items() if k not in ("RIGDECK_INVENTORY", "RIGDECK_HOME", "RIGDECK_SERVER")}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data"))
    try:
        proc = subprocess.run([sys.executable, "-m", "tui.cli", "launch", "examples/ddp/first.toml", "--wait",
                               "--json"], capture_output=True, text=True, cwd=root, env=env, timeout=300)
    finally:
        stop_daemons_under(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    view = json.loads(proc.stdout)
    assert view["state"] == "succeeded" and view["name"] == "first", view
    assert view["last_step"] == 59 and view["goodput"]["steps"] == 60, view  # steps 0..59


def test_only_a_hello_that_names_this_archive_current_and_whole_spares_the_sftp_check() -> None:
    """A daemon's hello vouches for the archive (tui.control.hostlinks ``archive_vouched``) only
    when its version, the archive's SHA-256 on the host's disk and ``agent/current`` are all this
    controller's; an older daemon's hello (no ``archive``), a damaged or missing archive, another
    current version or a malformed field each get the SFTP check."""
    from tui.control.hostlinks import archive_vouched

    bundle = build_agent()
    good = {"agent_version": bundle.version, "archive": {"sha256": bundle.sha256, "current": bundle.version}}
    assert archive_vouched(good, bundle)
    assert not archive_vouched(None, bundle)
    assert not archive_vouched({"agent_version": bundle.version}, bundle)  # an older daemon says nothing
    assert not archive_vouched(dict(good, agent_version="0123456789abcdef"), bundle)
    for archive in ({"sha256": "0" * 64, "current": bundle.version}, {"sha256": None, "current": bundle.version},
                    {"sha256": bundle.sha256, "current": "0123456789abcdef"}, {"sha256": bundle.sha256},
                    [bundle.sha256, bundle.version], "yes", {"sha256": [bundle.sha256], "current": bundle.version}):
        assert not archive_vouched(dict(good, archive=archive), bundle), archive


def test_closing_while_a_connect_attempt_adds_its_link_does_not_raise(tmp_path: Path) -> None:
    """A connect attempt (its own thread) may add its link and transport while the controller
    closes: the close goes over what it found and the attempt closes what it made itself. (A CLI
    refused early, with links to every host still being made, ended with `dictionary changed size
    during iteration` in the close, exit 1 instead of 2.)"""
    ctl = HostLinks(local_inventory(tmp_path))
    closed: list[str] = []

    class Late:
        def __init__(self, name: str) -> None:
            self.name = name

        def close(self) -> None:
            closed.append(self.name)
            if self.name == "first":  # meanwhile another host's attempt ends and adds its link
                ctl._links["other"] = Late("other")
                ctl._transports["other"] = Late("other-transport")  # type: ignore[assignment]

    ctl._links["h"] = Late("first")
    ctl._transports["h"] = Late("transport")  # type: ignore[assignment]
    ctl.close()
    assert closed[:2] == ["first", "transport"] and ctl._links == {} and ctl._transports == {}, closed
