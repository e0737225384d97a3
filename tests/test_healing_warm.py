"""Restarts that take warm standbys (agent/standby.py, issue 48), on the test bed: once a job that
may restart is in its steps, each of its hosts keeps one standby per local rank with the script's
imports done; the next attempt's ranks are those very processes, whether the job's host heals it
in place with no controller running or the controller restarts the gang on the same hosts. Each
step once, the job succeeds, and no standby outlives the job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.kit import ROOT, wait_until
from tests.kit.bedcli import Cli, tagged
from tests.kit.healing import TRAIN, controllers, host_index, step_keys

pytestmark = pytest.mark.testbed


def _job_dir(cli: Cli, host: str, job_id: str) -> Path:
    return cli.bed.hosts[host_index(cli, host) - 1].state_dir / "jobs" / job_id


def _ready_standbys(d: Path, count: int) -> dict[int, int]:
    """Local rank -> the waiting process of its standby, once ``count`` standbys say their imports
    are done (at most 90 s)."""
    got: dict[int, int] = {}

    def ready() -> bool:
        for i in range(count):
            try:
                meta = json.loads((d / "standby" / f"slot-{i}.json").read_text())
            except (OSError, ValueError):
                return False
            if not meta.get("ready") or not meta.get("child"):
                return False
            got[i] = int(meta["child"])
        return True

    wait_until(ready, 90, f"{count} warm standby(s) ready in {d}")
    return got


def _said(d: Path) -> str:
    """What the job's files on a host say, for a failure's message."""
    out = []
    for name in ("jobhost.log", "launcher.log", "logs/rank-0.log", "logs/rank-1.log", "state.json"):
        f = d / name
        if f.exists():
            out.append(f"--- {name}:\n{f.read_text(errors='replace')[-3000:]}")
    return "\n".join(out)


def _rank_pids(d: Path) -> dict[int, int]:
    out = {}
    for f in (d / "ranks").glob("rank-*.json"):
        if not f.name.endswith(".exit.json"):
            rec = json.loads(f.read_text())
            out[int(rec["local_rank"])] = int(rec["pid"])
    return out


def test_a_restart_in_place_with_nobody_watching_takes_the_warm_standbys(cli: Cli, tmp_path: Path) -> None:
    """A job of one host launched without --wait, no controller running: its job host keeps a
    standby per rank; a rank killed, the job host heals in place and the new attempt's ranks are
    the standbys' processes, resumed from the memory snapshot of the last step; no standby left."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    spec = cli.spec("warm-alone", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "30", "--ckpt", "{ckpt}", "--sleep", "0.3", "--memory",
           "--first-attempt-holds"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 1
processes_per_node = 2
[env]
OMP_NUM_THREADS = "1"
[restart]
max_restarts = 1
""")
    launched = cli.json("launch", str(spec))
    job_id, host = launched["job_id"], launched["placement"][0]["host"]
    d = _job_dir(cli, host, job_id)
    home = Path(cli.env["RIGDECK_HOME"])
    waiting = _ready_standbys(d, 2)
    before = _rank_pids(d)
    assert not set(before.values()) & set(waiting.values())
    assert controllers(home) == []
    cli.bed.exec(host_index(cli, host), ["kill", "-9", str(before[1])])

    def state() -> dict[str, Any]:
        return json.loads((d / "state.json").read_text())

    def ended() -> bool:
        assert controllers(home) == [], "a controller runs while the host heals the job"
        return state()["state"] in ("succeeded", "failed")

    wait_until(ended, 120, "the job's end")
    st = state()
    assert (st["state"], st["restart_count"]) == ("succeeded", 1), _said(d)
    (heal,) = st["heals"]
    assert (heal["kind"], heal["rank"], heal["signal"]) == ("exit", 1, 9), heal
    assert _rank_pids(d) == waiting  # the restarted ranks are the standbys' processes
    log = (d / "jobhost.log").read_text() if (d / "jobhost.log").exists() else ""
    assert not log or "2 of them warm standbys" in log, log[-2000:]
    steps = step_keys(cli.json("metrics", job_id))
    assert sorted(steps) == [(r, s) for r in range(2) for s in range(1, 31)]
    assert "resumed from step" in cli.run("logs", job_id, "--rank", "0").stdout
    view = cli.json("status", job_id)
    (inc,) = view["incidents"]
    print(f"killed rank healed in place onto warm standbys: detect {inc['detect_s']} s, stop to first step "
          f"{inc['resumed_at'] - inc['stopped_at']:.2f} s, {inc['steps_rerun']} step(s) lost")
    assert inc["steps_rerun"] <= 1, inc
    wait_until(lambda: tagged(cli.bed, job_id) == {"h1": [], "h2": [], "h3": []}, 20, "nothing of the job left")


def test_the_controllers_restart_of_the_gang_takes_each_hosts_warm_standbys(cli: Cli, tmp_path: Path) -> None:
    """A job of two hosts under `launch --wait`: a rank killed on the second host, the controller
    stops the gang (keeping the standbys) and starts it again on the same hosts, where each rank
    is its host's standby; the job succeeds, each step once, and no standby is left on any host."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    spec = cli.spec("warm-gang", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "30", "--ckpt", "{ckpt}", "--sleep", "0.3", "--memory",
           "--first-attempt-holds"]
workdir = "{ROOT}"
launcher = "direct"
hosts = ["h1", "h2"]
nodes = 2
processes_per_node = 1
[env]
OMP_NUM_THREADS = "1"
[restart]
max_restarts = 1
""")
    waiter = cli.popen("launch", str(spec), "--wait", "--json")
    try:
        wait_until(lambda: any(j["name"] == "warm-gang" and j["state"] == "running" for j in cli.json("jobs")), 60,
                   "the job running")
        job_id = next(j["job_id"] for j in cli.json("jobs") if j["name"] == "warm-gang")
        dirs = {h: _job_dir(cli, h, job_id) for h in ("h1", "h2")}
        waiting = {h: _ready_standbys(d, 1)[0] for h, d in dirs.items()}
        victim = _rank_pids(dirs["h2"])[0]
        cli.bed.exec(host_index(cli, "h2"), ["kill", "-9", str(victim)])
        out, _ = waiter.communicate(timeout=180)
        final = json.loads(out)
    finally:
        if waiter.poll() is None:
            waiter.kill()
    assert final["state"] == "succeeded" and final["restarts"] == 1, _said(dirs["h1"]) + _said(dirs["h2"])
    assert sorted(n["host"] for n in final["placement"]) == ["h1", "h2"]
    assert {h: _rank_pids(d)[0] for h, d in dirs.items()} == waiting  # each host's standby ran the rank
    steps = step_keys(cli.json("metrics", job_id))
    assert sorted(steps) == [(r, s) for r in range(2) for s in range(1, 31)]
    (inc,) = cli.json("status", job_id)["incidents"]
    print(f"the gang restarted by the controller onto warm standbys: stop to first step "
          f"{inc['resumed_at'] - inc['stopped_at']:.2f} s, {inc['steps_rerun']} step(s) lost")
    wait_until(lambda: tagged(cli.bed, job_id) == {"h1": [], "h2": [], "h3": []}, 20, "nothing of the job left")
