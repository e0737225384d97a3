"""Honest answers on the test bed: a job whose hosts cannot be reached is `unknown`, never
`starting`, and what history knows is never overwritten by a guess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.kit import ROOT, TICKER, wait_until
from tests.kit.bedcli import Cli
from tests.testbed import TestBed
from tui.control.history import History

pytestmark = pytest.mark.testbed
# Status calls at once: every one is a CLI process that connects to the 3 hosts, on 2 cores.
# RIGDECK_STATUS_CALLS=20 makes it the heavier burst the defect was first seen with.
CALLS = int(os.environ.get("RIGDECK_STATUS_CALLS", "8"))


def _history_state(cli: Cli, job_id: str) -> str:
    """The job's row as history holds it (read directly, not through a refreshing command)."""
    rec = History(Path(cli.env["RIGDECK_HOME"]) / "history.sqlite").get(job_id)
    assert rec is not None
    return str(rec["state"])


def test_unreachable_hosts_make_the_state_unknown_and_history_keeps_what_it_knew(cli: Cli) -> None:
    spec = cli.spec("honest", f"""
command = ["{{python}}", "{TICKER}", "--steps", "100000"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 3
processes_per_node = 1
""")
    job_id = cli.json("launch", str(spec))["job_id"]
    try:
        wait_until(lambda: cli.json("status", job_id)["state"] == "running", 60, "the job running")
        # Eight status calls at once (on two cores, some hosts may not answer all of them in
        # time): each says running, or unknown naming who did not answer; none says starting,
        # and none writes anything over what history knows.
        def status(_: int) -> tuple[int, dict]:
            res = cli.run("status", job_id, "--json", check=False, timeout=180)
            return res.returncode, json.loads(res.stdout)

        with ThreadPoolExecutor(CALLS) as pool:
            answers = list(pool.map(status, range(CALLS)))
        for code, st in answers:
            assert (code, st["state"]) in ((0, "running"), (1, "unknown")), (code, st["state"])
            assert (st["state"] == "unknown") == bool(st["unreachable"])
        print(f"{CALLS} parallel status calls:", sorted(st["state"] for _, st in answers))
        assert _history_state(cli, job_id) == "running"
        cli.bed.link_down(2)
        cli.bed.link_down(3)
        try:
            res = cli.run("status", job_id, check=False, timeout=120)
            assert res.returncode == 1, res.stdout + res.stderr
            assert "state    unknown (h2, h3 unreachable)" in res.stdout
            js = cli.run("status", job_id, "--json", check=False, timeout=120)
            assert js.returncode == 1
            data = json.loads(js.stdout)
            assert data["state"] == "unknown" and data["unreachable"] == ["h2", "h3"]
            assert _history_state(cli, job_id) == "running"  # not overwritten
        finally:
            cli.bed.link_up(2)
            cli.bed.link_up(3)
        wait_until(lambda: cli.run("status", job_id, check=False).returncode == 0, 60, "the hosts back")
        assert cli.json("status", job_id)["state"] == "running"
    finally:
        subprocess.run([sys.executable, "-m", "tui.cli", "stop", job_id, "--grace", "1"], env=cli.env, cwd=ROOT,
                       capture_output=True, timeout=120)


def test_values_reach_a_host_whose_login_shell_is_fish_exactly(testbed: TestBed, tmp_path: Path) -> None:
    assert Path("/usr/bin/fish").exists() and "fish" in testbed.login_shells.get(3, "")
    login = subprocess.run(testbed.ssh_argv(3, "echo", "$FISH_VERSION"), capture_output=True, text=True, timeout=60)
    assert login.returncode == 0 and login.stdout.strip(), login  # h3 really logs in to fish
    tricky = {"BACKSLASH": "a\\\\b", "QUOTE": "it\\'s \"q\" $HOME `x` ; (y) *", "UNICODE": "ünï ✓"}
    cli = Cli(testbed, tmp_path)
    cli.inventory = testbed.write_inventory(tmp_path / "hosts.toml", python=sys.executable, connect_timeout=5.0,
                                            env=tricky)
    hosts = cli.json("hosts", "h3")
    assert hosts[0]["reachable"] and not hosts[0]["error"], hosts
    arg = "--lr=1 'x' \\\\ $(whoami)"
    spec = cli.spec("fishy", f"""
command = ["{{python}}", "-c", "import json, os, sys; print(json.dumps([sys.argv[1:], \
{{k: os.environ[k] for k in {sorted(tricky)!r}}}]))", "--", {json.dumps(arg)}]
workdir = "{ROOT}"
launcher = "direct"
hosts = ["h3"]
processes_per_node = 1
""")
    job_id = cli.json("launch", str(spec), "--wait")["job_id"]
    out = cli.run("logs", job_id, "--rank", "0", "--raw").stdout
    argv, env = json.loads(out)
    assert argv == ["--", arg] and env == tricky
