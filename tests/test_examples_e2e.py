"""The example jobs, launched as they are with `rigdeck launch` across 3 test bed hosts, and a
checkpoint owner's host dying mid-run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.testbed import TestBed

pytestmark = pytest.mark.testbed

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


class Cli:
    def __init__(self, bed: TestBed, tmp: Path):
        self.bed = bed
        # mpirun reaches the other hosts over ssh: the test bed's key, passed to Open MPI through
        # the inventory's per-host environment (the example itself stays as it is).
        ssh = (f"-i {bed.user_key} -o UserKnownHostsFile={bed.known_hosts} "
               "-o StrictHostKeyChecking=yes -o BatchMode=yes")
        inv = bed.write_inventory(tmp / "hosts.toml", python=sys.executable, connect_timeout=5.0)
        text = inv.read_text().replace("[defaults]\n", f"[defaults]\nenv = {{ OMPI_MCA_plm_rsh_args = {json.dumps(ssh)} }}\n", 1)
        inv.write_text(text)
        self.env = {**os.environ, "RIGDECK_HOME": str(tmp / "home"), "RIGDECK_INVENTORY": str(inv)}

    def run(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "tui.cli", *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env, cwd=ROOT)
        if check and proc.returncode != 0:
            raise AssertionError(f"rigdeck {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
        return proc

    def json(self, *args: str, check: bool = True, timeout: float = 600) -> Any:
        return json.loads(self.run(*args, "--json", check=check, timeout=timeout).stdout)


@pytest.fixture
def cli(testbed: TestBed, tmp_path: Path) -> Cli:
    return Cli(testbed, tmp_path)


def losses(metrics: list[dict[str, Any]], rank: int = 0) -> list[tuple[int, float]]:
    return [(m["step"], m["loss"]) for m in metrics
            if m.get("rank") == rank and m.get("loss") is not None and m.get("event") is None]


@pytest.mark.parametrize("example", ["ddp", "pipeline", "mpi", "sharded", "sagemaker-script"])
def test_example_runs_across_three_hosts(cli: Cli, example: str) -> None:
    view = cli.json("launch", str(EXAMPLES / example / "job.toml"), "--wait")
    assert view["state"] == "succeeded", json.dumps(view, indent=1)[-3000:]
    assert len({n["host"] for n in view["placement"]}) == 3
    metrics = cli.json("metrics", view["job_id"])
    if example == "ddp":
        steps = [m for m in metrics if m.get("loss") is not None and m.get("event") is None]
        keys = [(m["rank"], m["step"]) for m in steps]
        assert len(keys) == len(set(keys)), "a step appeared twice"
        assert {r for r, _ in keys} == set(range(6))
        curve = losses(metrics)
        first = sum(v for _, v in curve[:10]) / 10
        last = sum(v for _, v in curve[-10:]) / 10
        assert last < 0.6 * first, (first, last)
        assert any(m.get("event") == "checkpoint" and m.get("status") == "done" for m in metrics)


def test_owner_host_dies_the_gang_restarts_elsewhere_and_resumes(cli: Cli, tmp_path: Path) -> None:
    shared = tmp_path / "ckpt"  # every test bed host sees the same /tmp: shared storage
    spec = tmp_path / "ddp-owner.toml"
    spec.write_text(f"""
name = "ddp-owner"
command = ["{{python}}", "train.py", "--steps", "400", "--checkpoint-every", "20", "--seed", "1"]
workdir = "{EXAMPLES / 'ddp'}"
launcher = "torchrun"
nodes = 2
processes_per_node = 2
[env]
OMP_NUM_THREADS = "1"
[checkpoint]
dir = "{shared}"
owner = "host:h2/gpu:0"
[restart]
max_restarts = 1
""")
    waiter = subprocess.Popen([sys.executable, "-m", "tui.cli", "launch", str(spec), "--wait", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli.env, cwd=ROOT)
    try:
        job_id = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if waiter.poll() is not None:
                out, err = waiter.communicate()
                raise AssertionError(f"launch --wait ended early ({waiter.returncode}):\n{out}\n{err}")
            jobs = cli.json("jobs")
            job_id = next((j["job_id"] for j in jobs if j["name"] == "ddp-owner"), None)
            if job_id and (shared / "latest").exists():
                break
            time.sleep(1)
        if not (job_id and (shared / "latest").exists()):
            waiter.kill()
            out, err = waiter.communicate()
            raise AssertionError(f"no checkpoint before the kill (job {job_id}); launch --wait said:\n"
                                 f"{out[-2000:]}\n{err[-4000:]}")
        first = cli.json("status", job_id)
        assert [n["host"] for n in first["placement"]] == ["h1", "h2"]
        saves = [m for m in cli.json("metrics", job_id) if m.get("event") == "checkpoint" and m.get("status") == "done"]
        assert saves and all(m["owner"]["host"] == "h2" for m in saves)
        time.sleep(3)
        # The owner's host dies: its sshd and every process in it.
        cli.bed.stop_sshd(2)
        cli.bed.exec(2, ["sh", "-c", "kill -9 -1"])
        out, err = waiter.communicate(timeout=400)
        final = json.loads(out)
    finally:
        if waiter.poll() is None:
            waiter.kill()
        cli.bed.start_sshd(2)
    assert final["state"] == "succeeded", json.dumps(final, indent=1)[-3000:]
    assert final["restarts"] == 1
    assert [n["host"] for n in final["placement"]] == ["h1", "h3"]
    metrics = cli.json("metrics", job_id)
    moves = [m for m in metrics if m.get("event") == "checkpoint_owner"]
    assert moves and moves[0]["from"]["host"] == "h2" and moves[0]["to"]["host"] in ("h1", "h3")
    after = [m for m in metrics if m.get("event") == "checkpoint" and m.get("status") == "done"
             and m["owner"]["host"] != "h2"]
    assert after, "the new owner saved"
    restart_event = next(e for e in final["events"] if e.get("event") == "restart")
    assert restart_event["cause"]["host"] in ("h1", "h2")
    # The restarted run resumed from the last complete checkpoint written before the kill.
    last_before = max(m["step"] for m in metrics if m.get("event") == "checkpoint"
                      and m.get("status") == "done" and m["owner"]["host"] == "h2")
    log0 = cli.run("logs", job_id, "--rank", "0").stdout
    assert f"resumed from step {last_before} " in log0, log0[-2000:]
    steps_r0 = [m["step"] for m in metrics if m.get("rank") == 0 and m.get("loss") is not None
                and m.get("event") is None]
    assert max(steps_r0) == 399
