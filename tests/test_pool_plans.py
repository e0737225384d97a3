"""Worker pools and processing jobs, from the controller's side (issue 15): the plan every host
gets (one node per replica with its own port, command and env; this host's node_indices), and a
processing job's inputs listed once and sharded by file. Through the real CLI on the test bed."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from tests.kit import ROOT
from tests.kit.bedcli import Cli

pytestmark = pytest.mark.testbed


def plans(cli: Cli, job_id: str) -> dict[str, dict[str, Any]]:
    out = {}
    for h in cli.bed.hosts:
        path = h.state_dir / "jobs" / job_id / "plan.json"
        if path.exists():
            out[h.name] = json.loads(path.read_text())
    return out


def test_a_four_pool_job_gets_a_node_per_replica_with_its_own_port_command_and_env(cli: Cli) -> None:
    """The plans a 4-pool job's hosts get, made by the controller against the bed's agents (ports
    probed on each node's own host) but not started: running them is the agent's part, shown
    by its own tests. The hosts' GPUs are claimed once per host, for all its replicas."""
    from tui.control.engines import OwnHosts
    from tui.control.history import History
    from tui.control.hostlinks import HostLinks
    from tui.control.jobs import JobManager
    from tui.model.jobspec import load_jobspec
    from tui.remote.inventoryfile import load_inventory

    spec = load_jobspec(cli.spec("pools4", f"""
command = ["{{python}}", "-c", "print('replica')"]
workdir = "{ROOT}"
max_runtime = "5m"
[env]
JOB = "1"
[[pools]]
role = "evaluator"
hosts = ["h1"]
[[pools]]
role = "primary"
hosts = ["h1"]
gpus_per_replica = 1
[[pools]]
role = "worker"
replicas = 2
hosts = ["h2", "h3"]
gpus_per_replica = 1
[[pools]]
role = "parameter_server"
hosts = ["h3"]
command = ["{{python}}", "-c", "print('ps')"]
env = {{ PS = "1" }}
"""))
    with HostLinks(load_inventory(cli.inventory)) as ctl:
        jm = JobManager(ctl, History(cli.tmp / "history.sqlite"))
        placement = jm.scheduler.reserve("pools4-1", spec, jm.capacity(ctl.inventory.names))
        got = jm._plans("pools4-1", spec, placement, 0)
        own = OwnHosts(jm)
        own._preflight("pools4-1", placement)
        own._claim("pools4-1", placement)
        try:
            claims = {h: sorted(g["index"] for g in s["gpus"] if (g.get("claim") or {}).get("job_id") == "pools4-1")
                      for h, s in ctl.agents(["h1", "h2", "h3"]).sample(timeout=30).items()}
        finally:
            ctl.agents(["h1", "h2", "h3"]).job_release(job_id="pools4-1", timeout=30)
    assert sorted(got) == ["h1", "h2", "h3"]
    nodes = got["h1"]["nodes"]
    assert all(p["nodes"] == nodes for p in got.values())  # every host sees every replica
    # Pool order, then replica, each where its pins allow; the two workers spread over h2 and h3
    # (which takes worker 0 depends on the GPUs the shared bed has free: the spread rule's
    # order is tests/test_scheduler.py's).
    assert [(n["pool"], n["replica"], len(n["gpus"])) for n in nodes] == [
        ("primary", 0, 1), ("worker", 0, 1), ("worker", 1, 1), ("parameter_server", 0, 0), ("evaluator", 0, 0)]
    assert [nodes[i]["host"] for i in (0, 3, 4)] == ["h1", "h3", "h1"]
    assert sorted(nodes[i]["host"] for i in (1, 2)) == ["h2", "h3"]
    on_h3 = 1 if nodes[1]["host"] == "h3" else 2
    assert {h: (p["node_indices"], p["node_index"]) for h, p in got.items()} == {
        "h1": ([0, 4], 0), "h2": ([3 - on_h3], 3 - on_h3), "h3": ([on_h3, 3], on_h3)}
    for h in ("h1", "h3"):  # two replicas on one host never share a port
        a, b = (nodes[i]["port"] for i in got[h]["node_indices"])
        assert isinstance(a, int) and isinstance(b, int) and a != b and a > 0 and b > 0
    assert all(p["master_port"] == nodes[0]["port"] for p in got.values())
    python = sys.executable  # the inventory's python: {python} resolved for each node's host
    assert nodes[3]["command"] == [python, "-c", "print('ps')"] and nodes[3]["env"] == {"PS": "1"}
    assert all(n["command"] == [python, "-c", "print('replica')"] and n["env"] == {}
               for i, n in enumerate(nodes) if i != 3)
    assert got["h3"]["command"] == nodes[on_h3]["command"]  # a host's first replica's, for old readers
    assert [n["on_failure"] for n in nodes] == ["stop", "stop", "stop", "stop", "continue"]
    assert all(p["kind"] == "training" and p["env"]["JOB"] == "1" for p in got.values())
    assert claims == {h: sorted(g for n in nodes if n["host"] == h for g in n["gpus"]) for h in claims}
    assert [len(v) for v in claims.values()] == [1, 1, 1]


def test_a_processing_jobs_sharded_input_is_listed_once_and_split_by_file(cli: Cli) -> None:
    raw = cli.tmp / "raw"
    names = [f"part-{i:02d}.txt" if i % 3 else f"sub/dir/part-{i:02d}.txt" for i in range(30)]
    for name in names:
        (raw / name).parent.mkdir(parents=True, exist_ok=True)
        (raw / name).write_text(f"{name}\n" * 3)
    spec = cli.spec("proc", f"""
kind = "processing"
nodes = 3
command = ["{{python}}", "-c", "pass"]
workdir = "{cli.tmp}"
[[processing.inputs]]
name = "raw"
source = "raw"
distribution = "ShardedByKey"
[[processing.inputs]]
name = "all"
source = "{raw}"
[[processing.outputs]]
name = "counts"
""")
    view = cli.json("launch", str(spec), "--wait", timeout=240)
    got = plans(cli, view["job_id"])
    assert sorted(got) == ["h1", "h2", "h3"]
    shards = {}
    for h, p in got.items():
        assert p["kind"] == "processing"
        sharded, full = p["processing"]["inputs"]
        assert full == {"name": "all", "source": str(raw), "distribution": "FullyReplicated"}
        assert sharded["source"] == str(raw) and sharded["total"] == 30
        assert sharded["files"] == sorted(sharded["files"])
        shards[h] = sharded["files"]
        assert p["processing"]["outputs"] == [{"name": "counts"}]
    # Every file in exactly one shard; the i-th of the sorted listing on the (i mod 3)-th host.
    everything = sorted(names)
    assert sorted(f for s in shards.values() for f in s) == everything
    assert shards == {h: everything[k::3] for k, h in enumerate(["h1", "h2", "h3"])}
    assert len({p["processing"]["inputs"][0]["listing_sha256"] for p in got.values()}) == 1
    event = next(e for e in view["events"] if e.get("event") == "processing")
    assert event["inputs"]["raw"]["hosts"] == {"h1": 10, "h2": 10, "h3": 10}
    assert event["inputs"]["raw"]["total"] == 30 and event["inputs"]["all"] == {"distribution": "FullyReplicated"}


def test_a_processing_input_that_cannot_be_listed_starts_nothing(cli: Cli) -> None:
    spec = cli.spec("proc-missing", f"""
kind = "processing"
nodes = 2
command = ["{{python}}", "-c", "pass"]
workdir = "{cli.tmp}"
[[processing.inputs]]
name = "raw"
source = "no-such-dir"
distribution = "ShardedByKey"
""")
    proc = cli.run("launch", str(spec), check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"processing.inputs 'raw': cannot list {cli.tmp}/no-such-dir on h1: not a directory" in proc.stderr
    assert "Traceback" not in proc.stderr
    (job,) = cli.json("jobs")
    assert job["state"] == "failed"
    assert not any((h.state_dir / "jobs" / job["job_id"] / "plan.json").exists() for h in cli.bed.hosts)


def test_launch_prints_and_records_the_reduction_server_sizing(cli: Cli) -> None:
    """A job with a reduction_server pool: ``rigdeck launch`` prints the sizing check and the
    job's record keeps it (``pool_sizing``). The NIC speeds are the agents' facts ``nics``;
    an agent that reports none, or veths without a speed, make it say the speed is unknown."""
    spec = cli.spec("rs", f"""
command = ["{{python}}", "-c", "pass"]
workdir = "{ROOT}"
max_runtime = "5m"
[[pools]]
role = "primary"
[[pools]]
role = "worker"
[[pools]]
role = "reduction_server"
hosts = ["h3"]
""")
    proc = cli.run("launch", str(spec), "--wait", timeout=240)
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("reduction server sizing: "))
    job_id = proc.stdout.split()[1].rstrip(":")
    sizing = cli.json("status", job_id)["pool_sizing"]
    assert line == f"reduction server sizing: {sizing['text']}"
    print(f"\nrigdeck launch printed: {line}")
    assert sizing["reducers"] == 1
    if sizing["ok"] is None:  # speeds unknown: said so, nothing made up
        assert sizing["match"] is None and "NIC speed unknown on" in sizing["text"]
    else:  # one reducer of the same speed as each of two workers: 2 would match
        assert sizing["workers_gbps"] == 2 * sizing["per_reducer_gbps"] and sizing["match"] == 2
        assert sizing["text"].endswith(": 2 would match")
