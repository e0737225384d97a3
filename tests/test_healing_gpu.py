"""Training that heals itself, on the test bed: a simulated GPU that fails under a rank (XID 79,
uncorrected ECC errors, lost) is drained and the job resumes elsewhere from its checkpoint; a
throttled GPU only warns. Everything through the real CLI."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kit import ROOT, wait_until
from tests.kit.bedcli import Cli
from tests.kit.healing import TRAIN, gpu_report, host_index, running_at_step, write_faults

pytestmark = pytest.mark.testbed


@pytest.mark.parametrize("fault", [{"xid": 79}, {"ecc_uncorrected": 3}, {"lost": True}],
                         ids=["xid79", "ecc", "lost"])
def test_a_failing_gpu_under_a_rank_is_drained_and_the_job_resumes_elsewhere(
        cli: Cli, tmp_path: Path, fault: dict[str, Any]) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    spec = cli.spec("gpu-fault", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "40", "--ckpt", "{ckpt}", "--sleep", "0.3", "--first-attempt-holds"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 2
gpus_per_node = 2
[env]
OMP_NUM_THREADS = "1"
[restart]
max_restarts = 1
""")
    waiter = cli.popen("launch", str(spec), "--wait", "--json")
    host, gpu = "", -1
    try:
        job_id = running_at_step(cli, "gpu-fault", 6)
        first = cli.json("status", job_id)
        host, gpu = first["placement"][0]["host"], first["placement"][0]["gpus"][1]
        write_faults(cli, host, {str(gpu): fault})
        # Seen unhealthy within 10 s of the fault, the last look included (its CLI call may end
        # after wait_until's deadline).
        start = time.monotonic()
        wait_until(lambda: gpu_report(cli, host, gpu)["health"] == "unhealthy", 10, "the GPU unhealthy")
        assert time.monotonic() - start < 10
        why = gpu_report(cli, host, gpu)["health_reason"]
        out, err = waiter.communicate(timeout=180)
        final = json.loads(out)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        if host:
            write_faults(cli, host, {})
    assert final["state"] == "succeeded" and final["restarts"] == 1, json.dumps(final, indent=1)[-3000:]
    incident = next(e for e in final["events"] if e.get("event") == "incident")["cause"]
    assert incident == {"message": f"{host} GPU {gpu} (simulated): {why}", "kind": "gpu", "host": host, "gpu": gpu}
    stop = next(e for e in final["events"] if e.get("event") == "incident")["time"]
    assert all((n["host"], g) != (host, gpu) for n in final["placement"] for g in n["gpus"])
    assert "resumed from step" in cli.run("logs", final["job_id"], "--rank", "0").stdout
    restarted = next(e for e in final["events"] if e.get("event") == "started" and e.get("restart_count") == 1)
    assert restarted["time"] - stop < 30
    # rigdeck drained it: a launch that needs it is refused, naming it, until an operator undrains it
    (drain,) = cli.json("drains")
    assert (drain["host"], drain["gpu"], drain["who"], drain["source"]) == (host, gpu, "rigdeck", "health")
    whole = cli.spec("whole-host", f"""
command = ["{{python}}", "-c", "print('ok')"]
workdir = "{ROOT}"
hosts = ["{host}"]
gpus_per_node = 4
""")
    refused = cli.run("launch", str(whole), "--no-queue", check=False)
    assert refused.returncode == 2 and f"GPU {gpu} drained ({host} GPU {gpu} (simulated): {why})" in refused.stderr
    assert gpu_report(cli, host, gpu)["health"] == "drained"  # the fault is gone, the drain stays
    assert [d["target"] for d in cli.json("undrain", f"{host}:{gpu}")] == [f"{host}:{gpu}"]
    assert cli.json("drains") == []
    ran = cli.json("launch", str(whole), "--no-queue", "--wait")
    assert ran["state"] == "succeeded" and gpu in ran["placement"][0]["gpus"]
    assert gpu_report(cli, host, gpu)["health"] == "ok"


def test_a_rank_that_dies_as_its_gpu_fails_is_the_gpus_incident_and_the_gpu_is_drained(
        cli: Cli, tmp_path: Path) -> None:
    """XID 79 on a real card: the rank's next CUDA call fails, and the process exits before (or
    as) telemetry shows the XID. The GPU, not the rank, is the cause: drained, and the restart
    never goes back to it."""
    ckpt, dead = tmp_path / "ckpt", tmp_path / "dead"
    ckpt.mkdir()
    dead.mkdir()
    spec = cli.spec("gpu-dies", f"""
command = ["{{python}}", "{TRAIN}", "--steps", "40", "--ckpt", "{ckpt}", "--sleep", "0.3", "--dead-gpus", "{dead}",
           "--first-attempt-holds"]
workdir = "{ROOT}"
launcher = "direct"
nodes = 2
gpus_per_node = 1
[env]
OMP_NUM_THREADS = "1"
[restart]
max_restarts = 2
""")
    waiter = cli.popen("launch", str(spec), "--wait", "--json")
    host, gpu = "", -1
    try:
        job_id = running_at_step(cli, "gpu-dies", 6)
        node = cli.json("status", job_id)["placement"][1]
        host, gpu = node["host"], node["gpus"][0]
        write_faults(cli, host, {str(gpu): {"xid": 79}})
        (dead / f"dead-{cli.bed.hosts[host_index(cli, host) - 1].hostname}-{gpu}").write_text("")
        out, err = waiter.communicate(timeout=180)
        final = json.loads(out)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        if host:
            write_faults(cli, host, {})
    assert final["state"] == "succeeded" and final["restarts"] == 1, json.dumps(final, indent=1)[-3000:]
    incident = next(e for e in final["events"] if e.get("event") == "incident")["cause"]
    assert (incident["kind"], incident["host"], incident["gpu"]) == ("gpu", host, gpu), incident
    assert "XID 79" in incident["message"]
    assert all((n["host"], g) != (host, gpu) for n in final["placement"] for g in n["gpus"])
    (drain,) = cli.json("drains")
    assert (drain["host"], drain["gpu"], drain["source"]) == (host, gpu, "health")
    cli.run("undrain", f"{host}:{gpu}")


def test_throttling_only_warns(cli: Cli, tmp_path: Path) -> None:
    host = cli.bed.hosts[0].name
    cli.run("deploy", host)  # the health is the agent's: this test may be the first on its bed
    try:
        write_faults(cli, host, {"3": {"throttle": "hw_slowdown"}})
        wait_until(lambda: gpu_report(cli, host, 3)["health"] == "warn", 60, "the warning")
        assert gpu_report(cli, host, 3)["health_reason"] == "throttled: hardware slowdown"
        spec = cli.spec("on-a-slow-gpu", f"""
command = ["{{python}}", "-c", "print('ok')"]
workdir = "{ROOT}"
hosts = ["{host}"]
gpus_per_node = 4
""")
        ran = cli.json("launch", str(spec), "--no-queue", "--wait")
        assert ran["state"] == "succeeded" and ran["restarts"] == 0 and 3 in ran["placement"][0]["gpus"]
        assert cli.json("drains") == []
    finally:
        write_faults(cli, host, {})
