"""Live signals on the test bed, through the real CLI: a rank that sleeps in every step is named
as a straggler (host and rank) by ``rigdeck status`` within 30 s; a job whose data loader sleeps
is flagged input-bound, the same job without the sleep is not; in real DDP (gloo,
``runtime.comm_timer``) a sleeping rank is still named and a rate-limited link is
communication-bound."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kit.bedcli import Cli
from tests.testbed import TestBed

pytestmark = pytest.mark.testbed

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "jobscripts" / "signals_probe.py"


def spec_body(nodes: int, *args: str) -> str:
    argv = ", ".join(f'"{a}"' for a in args)
    return (f'command = ["{{python}}", "{PROBE}", {argv}]\nworkdir = "{ROOT}"\nlauncher = "direct"\n'
            f'nodes = {nodes}\nprocesses_per_node = 1\nmax_runtime = "5m"\n')


def poll_status(cli: Cli, job_id: str, until: Any, timeout: float) -> tuple[dict[str, Any], float]:
    """``rigdeck status JOB --json`` until ``until(status)``; (the status, seconds it took)."""
    start = time.monotonic()
    while True:
        status = cli.json("status", job_id)
        if until(status) or time.monotonic() - start > timeout:
            return status, time.monotonic() - start
        time.sleep(1.0)


def test_a_rank_that_sleeps_every_step_is_named_a_straggler_within_30s(
        cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from tui.client import InProcessClient, load_inventory

    launched = cli.json("launch", str(cli.spec("straggle", spec_body(
        3, "--work", "0.1", "--slow-rank", "1", "--slow-extra", "0.25"))))
    job_id = launched["job_id"]
    # The app's side: a controller in this process whose job poller reads the same job.
    monkeypatch.setenv("RIGDECK_HOME", cli.env["RIGDECK_HOME"])
    app_client = InProcessClient(load_inventory(str(cli.inventory))).start(telemetry=False, jobs=True)
    try:
        status, took = poll_status(cli, job_id, lambda s: any(x["kind"] == "straggler" for x in s["signals"]), 30)
        stragglers = [x for x in status["signals"] if x["kind"] == "straggler"]
        assert stragglers, f"no straggler after {took:.0f}s: {status['signals']} (last step {status['last_step']})"
        slow_host = next(r["host"] for r in status["ranks"] if r["rank"] == 1)
        assert [(x["rank"], x["host"]) for x in stragglers] == [(1, slow_host)]
        assert stragglers[0]["verdict"] == "bad" and f"rank 1 on {slow_host}" in stragglers[0]["summary"]
        print(f"straggler flagged {took:.1f}s after launch: {stragglers[0]['summary']}")
        text = cli.run("status", job_id).stdout
        assert f"signal   bad  straggler: rank 1 on {slow_host}" in text, text

        # The Job view's data (JobDetail.signals, computed by the poller each round).
        deadline = time.monotonic() + 30
        detail = None
        while time.monotonic() < deadline:
            detail = app_client.jobs.detail(job_id)
            if detail is not None and any(x.kind == "straggler" for x in detail.signals):
                break
            time.sleep(0.5)
        assert detail is not None
        assert [(x.kind, x.rank, x.host) for x in detail.signals] == [("straggler", 1, slow_host)]
    finally:
        app_client.close()
        cli.run("stop", job_id, "--grace", "1", check=False)


def test_a_sleeping_data_loader_is_input_bound_and_the_same_job_without_is_not(
        cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from tui.client import InProcessClient, load_inventory

    slow = cli.json("launch", str(cli.spec("starved", spec_body(2, "--work", "0.05", "--loader-sleep", "0.2"))))
    fed = cli.json("launch", str(cli.spec("fed", spec_body(2, "--work", "0.05"))))
    # The app's side, with telemetry: the signal shows what each host's disks read now.
    monkeypatch.setenv("RIGDECK_HOME", cli.env["RIGDECK_HOME"])
    app_client = InProcessClient(load_inventory(str(cli.inventory))).start(telemetry=True, jobs=True)
    try:
        # Each host's ranks are judged on their own steps, which reach the job's metrics at
        # their own pace: wait for every host of the placement, not just the first flagged.
        def every_host_flagged(s: dict[str, Any]) -> bool:
            hosts = {x["host"] for x in s["signals"] if x["kind"] == "input_bound"}
            return bool(hosts) and hosts == {n["host"] for n in s["placement"]}

        status, took = poll_status(cli, slow["job_id"], every_host_flagged, 30)
        flagged = [x for x in status["signals"] if x["kind"] == "input_bound"]
        assert flagged, f"not input-bound after {took:.0f}s: {status['signals']}"
        assert {x["host"] for x in flagged} == {n["host"] for n in status["placement"]}, status["signals"]
        assert all(x["verdict"] == "bad" and "of step time waiting for data" in x["summary"] for x in flagged)
        # The same job without the sleep, judged on as many steps or more: nothing flagged.
        fed_status, _ = poll_status(cli, fed["job_id"], lambda s: (s["last_step"] or 0) >= 10, 30)
        assert (fed_status["last_step"] or 0) >= 10, fed_status
        assert fed_status["signals"] == [], fed_status["signals"]

        deadline = time.monotonic() + 30
        seen: list[Any] = []
        while time.monotonic() < deadline:
            detail = app_client.jobs.detail(slow["job_id"])
            seen = [x for x in (detail.signals if detail else ()) if x.kind == "input_bound"]
            if len(seen) == 2 and all(x.read_bps is not None for x in seen):
                break
            time.sleep(0.5)
        assert {x.host for x in seen} == {x["host"] for x in flagged}, seen
        assert all(x.read_bps is not None and "its disks reading" in x.summary for x in seen), seen
        print(f"job view: {seen[0].summary}")
    finally:
        app_client.close()
        for job in (slow, fed):
            cli.run("stop", job["job_id"], "--grace", "1", check=False)


def rate_limit(bed: TestBed, host: str, rate: str) -> None:
    """``tc tbf`` on ``host``'s link in both directions: its eth0 (egress) and the bridge side of
    its veth (its ingress)."""
    h = bed.host(host)
    tbf = ["root", "tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
    subprocess.run(["ip", "netns", "exec", h.netns, "tc", "qdisc", "replace", "dev", "eth0", *tbf], check=True)
    subprocess.run(["tc", "qdisc", "replace", "dev", h.veth, *tbf], check=True)


def unlimit(bed: TestBed, host: str) -> None:
    h = bed.host(host)
    subprocess.run(["ip", "netns", "exec", h.netns, "tc", "qdisc", "del", "dev", "eth0", "root"], check=False)
    subprocess.run(["tc", "qdisc", "del", "dev", h.veth, "root"], check=False)


def test_synchronous_ddp_names_the_straggler_and_a_slow_link_is_comm_bound(cli: Cli) -> None:
    """Real DDP over gloo with runtime.comm_timer. A rank that sleeps before its backward pass
    makes every rank's step as long (the others wait in the all-reduce): the busy time still
    names it, and it is not taken for communication. Then, with one host's link rate-limited,
    the all-reduce dominates: communication-bound, with the bucket advice."""
    job = cli.json("launch", str(cli.spec("ddp-straggle", spec_body(
        3, "--ddp", "256", "--work", "0.05", "--slow-rank", "2", "--slow-extra", "0.3"))))
    try:
        status, took = poll_status(cli, job["job_id"],
                                   lambda s: any(x["kind"] == "straggler" for x in s["signals"]), 60)
        slow_host = next((r["host"] for r in status["ranks"] if r["rank"] == 2), None)
        assert [(x["kind"], x["rank"], x["host"]) for x in status["signals"]] == [("straggler", 2, slow_host)], \
            f"after {took:.0f}s: {status['signals']}"
    finally:
        cli.run("stop", job["job_id"], "--grace", "1", check=False)

    rate_limit(cli.bed, "h2", "20mbit")
    try:
        job = cli.json("launch", str(cli.spec("ddp-slow-link", spec_body(
            2, "--ddp", "1024", "--work", "0.05").replace("nodes = 2\n", 'hosts = ["h1", "h2"]\n'))))
        try:
            status, took = poll_status(cli, job["job_id"],
                                       lambda s: any(x["kind"] == "comm_bound" for x in s["signals"]), 90)
            comm = [x for x in status["signals"] if x["kind"] == "comm_bound"]
            assert comm, f"after {took:.0f}s: {status['signals']} (last step {status['last_step']})"
            assert comm[0]["verdict"] == "bad" and "bucket_cap_mb" in comm[0]["advice"]
            assert not [x for x in status["signals"] if x["kind"] == "straggler"]
            print(f"comm-bound after {took:.1f}s: {comm[0]['summary']}")
        finally:
            cli.run("stop", job["job_id"], "--grace", "1", check=False)
    finally:
        unlimit(cli.bed, "h2")
