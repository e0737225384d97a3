"""Training that heals itself, on the test bed: a host lost mid-job is left out and the job resumes
on the spare; an operator's drains, and `drain --now` moving the running job. Everything through
the real CLI."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.kit import ROOT
from tests.kit.bedcli import Cli
from tests.kit.healing import TRAIN, host_index, placement_on_the_bed, running_at_step

pytestmark = pytest.mark.testbed


def test_a_host_lost_mid_job_is_left_out_and_the_job_resumes_on_the_spare(cli: Cli, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    spec = cli.spec("host-lost", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "40", "--ckpt", "{ckpt}", "--sleep", "0.3", "--first-attempt-holds"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 2
processes_per_node = 2
[env]
OMP_NUM_THREADS = "1"
[health]
host_timeout = "15s"
[restart]
max_restarts = 1
""")
    waiter = cli.popen("launch", str(spec), "--wait", "--json")
    lost = 0
    try:
        job_id = running_at_step(cli, "host-lost", 8)
        hosts = placement_on_the_bed(cli, job_id)
        spare = next(h.name for h in cli.bed.hosts if h.name not in hosts)
        gone = hosts[1]
        lost = host_index(cli, gone)
        cli.bed.link_down(lost)  # first the link: the others hear nothing and wait in their all-reduce
        cli.bed.exec(lost, ["sh", "-c", f"grep -l -a 'RIGDECK_JOB_ID={job_id}' /proc/[0-9]*/environ 2>/dev/null"
                                        " | cut -d/ -f3 | xargs -r kill -9"])
        killed_at = time.time()
        out, err = waiter.communicate(timeout=240)
        final = json.loads(out)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        if lost:
            cli.bed.link_up(lost)
    assert final["state"] == "succeeded" and final["restarts"] == 1, json.dumps(final, indent=1)[-3000:]
    assert sorted(n["host"] for n in final["placement"]) == sorted([hosts[0], spare])
    incident = next(e for e in final["events"] if e.get("event") == "incident")["cause"]
    assert incident["kind"] == "host" and incident["host"] == gone
    assert incident["message"].startswith(f"{gone} unreachable for ")
    started = next(e for e in final["events"] if e.get("event") == "started" and e.get("restart_count") == 1)
    assert started["time"] - killed_at < 60
    assert "resumed from step" in cli.run("logs", final["job_id"], "--rank", "0").stdout
    (inc,) = cli.json("status", final["job_id"])["incidents"]
    firsts = {}
    for m in cli.json("metrics", final["job_id"]):
        if m.get("step") is not None and m.get("event") is None:
            firsts.setdefault(m.get("restart"), m)
    assert inc["kind"] == "host" and inc["resume_s"] is not None, (inc, firsts)
    # the survivors waited asleep in their all-reduce: judged lost at once, not after host_timeout
    assert "and the job waits for it: every rank on " in incident["message"], incident["message"]
    assert inc["detect_s"] < 15, inc
    print(f"{gone} lost: judged {inc['detect_s']:.1f} s after its last answer; {incident['message'][:200]}")


def test_an_operator_drains_by_hand_and_drain_now_moves_the_running_job(cli: Cli, tmp_path: Path) -> None:
    import getpass

    h1, h2, h3 = (h.name for h in cli.bed.hosts)
    try:
        (d,) = cli.json("drain", h3, "--reason", "PSU swap")
        assert (d["target"], d["who"], d["source"], d["reason"], d["now"]) == (h3, getpass.getuser(), "operator",
                                                                               "PSU swap", False)
        assert "PSU swap" in cli.run("drains").stdout  # another process, the same drains: kept in the history
        wide = cli.spec("three-hosts", f'command = ["{{python}}", "-c", "print(1)"]\nworkdir = "{ROOT}"\nnodes = 3\n'
                                       'gpus_per_node = 1\n')
        refused = cli.run("launch", str(wide), "--no-queue", check=False)
        assert refused.returncode == 2 and f"{h3} drained" in refused.stderr, refused.stderr
        ckpt = tmp_path / "ckpt"
        ckpt.mkdir()
        spec = cli.spec("moved", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "40", "--ckpt", "{ckpt}", "--sleep", "0.3", "--first-attempt-holds"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 2
gpus_per_node = 3
[env]
OMP_NUM_THREADS = "1"
[restart]
max_restarts = 1
""")
        waiter = cli.popen("launch", str(spec), "--wait", "--json")
        try:
            job_id = running_at_step(cli, "moved", 5)
            placement = cli.json("status", job_id)["placement"]
            assert sorted(n["host"] for n in placement) == [h1, h2]
            gpu = next(n for n in placement if n["host"] == h2)["gpus"][0]
            cli.run("drain", f"{h2}:{gpu}", "--now", "--reason", "fan noise")
            drained_at = time.time()
            out, _ = waiter.communicate(timeout=180)
            final = json.loads(out)
        finally:
            if waiter.poll() is None:
                waiter.kill()
        assert final["state"] == "succeeded" and final["restarts"] == 1, json.dumps(final, indent=1)[-3000:]
        incident = next(e for e in final["events"] if e.get("event") == "incident")
        assert incident["cause"] == {"message": f"{h2}:{gpu} drained by {getpass.getuser()} (fan noise)",
                                     "kind": "drain", "host": h2, "gpu": gpu}
        assert incident["time"] - drained_at < 10
        assert all((n["host"], g) != (h2, gpu) for n in final["placement"] for g in n["gpus"])
        assert "resumed from step" in cli.run("logs", final["job_id"], "--rank", "0").stdout
    finally:
        cli.run("undrain", h3, f"{h2}:0", f"{h2}:1", f"{h2}:2", f"{h2}:3")
    assert cli.json("drains") == []
