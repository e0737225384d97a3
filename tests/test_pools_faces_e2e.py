"""The controller's worker-pool rules against real hosts (the test bed, through the CLI): an
evaluator killed is reported once and training goes on; the primary finishing ends the job
``succeeded`` and stops the replicas still running on the other hosts; ``rigdeck status`` shows
the pools. (The unit tests with recorded host states are tests/test_pools_control.py.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.test_jobs import ROOT, Cli
from tests.testbed import TestBed

pytestmark = pytest.mark.testbed


@pytest.fixture
def cli(testbed: TestBed, tmp_path: Path) -> Cli:
    return Cli(testbed, tmp_path)


def until(cli: Cli, job_id: str, cond: Any, what: str, limit: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + limit
    while True:
        st = cli.json("status", job_id, check=False)
        if cond(st):
            return st  # type: ignore[no-any-return]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {limit}s; last status {st}")
        time.sleep(0.5)


def test_an_evaluator_killed_is_reported_and_the_primary_finishing_ends_the_job(cli: Cli) -> None:
    spec = cli.spec("poolrules", f"""
command = ["{{python}}", "-c", "import time; time.sleep(600)"]
workdir = "{ROOT}"
max_runtime = "5m"
grace = "3s"
[[pools]]
role = "primary"
command = ["{{python}}", "-c", "import os, time; time.sleep(float(os.environ['HOLD']))"]
env = {{ HOLD = "25" }}
[[pools]]
role = "worker"
[[pools]]
role = "evaluator"
""")
    job_id = cli.json("launch", str(spec))["job_id"]
    try:
        st = until(cli, job_id, lambda s: len([r for r in s["ranks"] if r["state"] == "running"]) == 3,
                   "three ranks running", 60)
        assert [(p["role"], p["replicas"], p["state"]) for p in st["pools"]] == [
            ("primary", 1, "running"), ("worker", 1, "running"), ("evaluator", 1, "running")]
        # Ranks are contiguous in pool order: the evaluator's is rank 2.
        evaluator = next(r for r in st["ranks"] if r["rank"] == 2)
        assert evaluator["host"] in st["pools"][2]["hosts"]
        # Its pid is in its host's PID namespace: killed from inside that host.
        killed = cli.bed.exec(evaluator["host"], ["kill", "-KILL", str(evaluator["pid"])])
        assert killed.returncode == 0, killed.stderr
        st = until(cli, job_id, lambda s: any(e["event"] == "replica failed" for e in s["events"]),
                   "the replica failed event")
        assert st["state"] == "running"
        failed = [e for e in st["events"] if e["event"] == "replica failed"]
        assert len(failed) == 1
        e = failed[0]
        assert (e["pool"], e["replica"], e["host"], e["signal"], e["continues"]) == \
            ("evaluator", 0, evaluator["host"], 9, True)
        assert e["message"] == (f'evaluator 0 on {evaluator["host"]} was killed by signal 9; '
                                'training continues (on_failure = "continue")')
        assert [p["state"] for p in st["pools"]] == ["running", "running", "failed"]
        text = cli.run("status", job_id).stdout
        assert f"replica  {e['message']}" in text
        assert any(line.split()[:2] == ["evaluator", "1"] and line.split()[-1] == "failed"
                   for line in text.splitlines()), text
        # Looking again adds nothing.
        st = cli.json("status", job_id)
        assert len([e for e in st["events"] if e["event"] == "replica failed"]) == 1

        # The primary exits 0: the job succeeded; the worker (another host) was stopped.
        st = until(cli, job_id, lambda s: s["state"] in ("succeeded", "failed", "stopped"), "the job's end", 90)
        assert st["state"] == "succeeded", st
        end = next((e for e in st["events"] if e["event"] == "succeeded"), None)
        assert end is not None, st["events"]
        primary_host = st["pools"][0]["hosts"][0]
        worker_host = st["pools"][1]["hosts"][0]
        assert end["primary_succeeded"] == primary_host
        if worker_host != primary_host:
            assert worker_host in end["stopped_hosts"]
        assert [p["state"] for p in st["pools"]] == ["succeeded", "stopped", "failed"]
    finally:
        cli.run("stop", job_id, "--grace", "1", check=False)


def test_a_worker_killed_fails_the_gang_and_the_cause_names_its_pool(cli: Cli) -> None:
    spec = cli.spec("poolfail", f"""
command = ["{{python}}", "-c", "import time; time.sleep(600)"]
workdir = "{ROOT}"
max_runtime = "5m"
grace = "2s"
[[pools]]
role = "primary"
[[pools]]
role = "worker"
replicas = 2
""")
    job_id = cli.json("launch", str(spec))["job_id"]
    try:
        st = until(cli, job_id, lambda s: len([r for r in s["ranks"] if r["state"] == "running"]) == 3,
                   "three ranks running", 60)
        worker = next(r for r in st["ranks"] if r["rank"] == 2)  # worker 1: primary, worker 0, worker 1
        killed = cli.bed.exec(worker["host"], ["kill", "-KILL", str(worker["pid"])])
        assert killed.returncode == 0, killed.stderr
        st = until(cli, job_id, lambda s: s["state"] in ("failed", "succeeded", "stopped"), "the gang's end")
        assert st["state"] == "failed", st
        assert (st["cause"]["pool"], st["cause"]["replica"], st["cause"]["rank"]) == ("worker", 1, 2)
        text = cli.run("status", job_id).stdout
        assert f"cause    worker 1 on {worker['host']} (rank 2) killed by signal 9" in text, text
        assert any(line.split()[:2] == ["worker", "2"] and line.endswith("1 failed · 1 stopped") for line in text.splitlines())
        assert [p["state"] for p in st["pools"]][1] == "failed"
        assert not [e for e in st["events"] if e["event"] == "replica failed"]
    finally:
        cli.run("stop", job_id, "--grace", "1", check=False)
