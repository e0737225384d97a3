"""Worker pools and processing jobs on the test bed, through the real CLI: a 4-pool job whose
every replica probes its cluster files from inside, the pools' failure rules (an evaluator's death
is reported and training goes on; a worker's death stops the gang), and a processing job whose
inputs are sharded by file or replicated across 3 hosts."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.kit import PROBE, ROOT, wait_until
from tests.kit.bedcli import Cli, tagged
from tests.testbed import TestBed

# h3 is the CPU host the parameter servers are pinned to by label.
pytestmark = [pytest.mark.testbed, pytest.mark.cli_options(labels={"h3": ["cpu"]})]

HOLD = ROOT / "tests" / "jobscripts" / "probe_then_wait.py"
LIST_INPUTS = ROOT / "tests" / "jobscripts" / "list_inputs.py"

VERTEX_POOL = {"primary": "workerpool0", "worker": "workerpool1", "parameter_server": "workerpool2",
               "evaluator": "workerpool3"}
TF_TASK = {"primary": "chief", "worker": "worker", "parameter_server": "ps", "evaluator": "evaluator"}


def four_pools(cli: Cli, name: str, world_command: Path, other_command: Path) -> Path:
    return cli.spec(name, f"""
command = ["{{python}}", "{world_command}"]
workdir = "{ROOT}"
max_runtime = "5m"
grace = "5s"
[env]
OMP_NUM_THREADS = "1"
[[pools]]
role = "primary"
gpus_per_replica = 1
[[pools]]
role = "worker"
replicas = 2
gpus_per_replica = 1
[[pools]]
role = "parameter_server"
labels = ["cpu"]
command = ["{{python}}", "{other_command}"]
env = {{ POOL_ENV = "ps" }}
[[pools]]
role = "evaluator"
command = ["{{python}}", "{other_command}"]
""")


def probe_reports(bed: TestBed, job_id: str) -> list[dict[str, Any]]:
    out = []
    for h in bed.hosts:
        for p in sorted((h.state_dir / "jobs" / job_id / "probe").glob("*.json")):
            out.append({**json.loads(p.read_text()), "_host": h.name})
    return out


def view_of(report: dict[str, Any], name: str) -> Any:
    """A JSON variable as the probe recorded it (parsed, or the raw text)."""
    v = report["values"][name]
    return json.loads(v) if isinstance(v, str) else v


def pool_nodes(view: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = view["placement"]
    assert all("pool" in n for n in nodes), nodes
    return nodes


def check_probes(cli: Cli, view: dict[str, Any], reports: list[dict[str, Any]]) -> None:
    """Every replica's own view, from inside it, against the placement the controller made."""
    nodes = pool_nodes(view)
    assert [(n["pool"], n["replica"]) for n in nodes] == [
        ("primary", 0), ("worker", 0), ("worker", 1), ("parameter_server", 0), ("evaluator", 0)]
    assert len({n["host"] for n in nodes}) == 3  # 5 replicas over the 3 hosts
    ps = next(n for n in nodes if n["pool"] == "parameter_server")
    assert ps["host"] == "h3", nodes  # pinned by its label
    assert len(reports) == 5, reports
    bad = [(r["_host"], r["failures"]) for r in reports if not r["ok"]]
    assert not bad, bad
    address = {h.name: h.address for h in cli.bed.hosts}
    # Every replica sees the same cluster; each endpoint is its replica's host's address with a
    # port of its own (the port is the controller's choice at launch, in the plan, not in the view).
    clusters = [view_of(r, "CLUSTER_SPEC")["cluster"] for r in reports]
    assert all(c == clusters[0] for c in clusters), clusters
    endpoints: dict[str, list[str]] = clusters[0]
    assert sorted(endpoints) == sorted(VERTEX_POOL.values())
    port: dict[tuple[str, int], int] = {}
    for n in nodes:
        ep = endpoints[VERTEX_POOL[n["pool"]]][n["replica"]]
        host, _, p = ep.rpartition(":")
        assert host == address[n["host"]], (n, ep)
        port[(n["pool"], n["replica"])] = int(p)
    by_pool = {(view_of(r, "CLUSTER_SPEC")["task"]["type"],
                view_of(r, "CLUSTER_SPEC")["task"]["index"]): r for r in reports}
    assert sorted(by_pool) == sorted((VERTEX_POOL[n["pool"]], n["replica"]) for n in nodes)
    for n in nodes:
        r = by_pool[(VERTEX_POOL[n["pool"]], n["replica"])]
        assert r["_host"] == n["host"], (n, r["_host"])
        # The probe bound its own endpoint's port on its own address inside the replica.
        assert r["pool"]["port_free"] is True and r["pool"]["endpoint"] == (
            f"{address[n['host']]}:{port[(n['pool'], n['replica'])]}"), r["pool"]
        tf = view_of(r, "TF_CONFIG")
        assert tf["task"] == {"type": TF_TASK[n["pool"]], "index": n["replica"]}
        assert tf["cluster"] == {"chief": endpoints["workerpool0"], "worker": endpoints["workerpool1"],
                                 "ps": endpoints["workerpool2"]}
        in_world = n["pool"] in ("primary", "worker")
        assert (r["values"].get("WORLD_SIZE") == "3") == in_world, (n, r["values"].get("WORLD_SIZE"))
        assert r["values"].get("RIGDECK_POOL") == n["pool"]
        print(f"{n['pool']:>16} {n['replica']} on {n['host']}: CLUSTER_SPEC task "
              f"{view_of(r, 'CLUSTER_SPEC')['task']}, TF_CONFIG task {tf['task']}, endpoint "
              f"{r['pool']['endpoint']} (port free on its host: {r['pool']['port_free']}), "
              f"WORLD_SIZE {r['values'].get('WORLD_SIZE')}, checks {len(r['checks'])} all ok")
    # Ports: every endpoint distinct on its own host.
    per_host: dict[str, list[int]] = {}
    for n in nodes:
        per_host.setdefault(n["host"], []).append(port[(n["pool"], n["replica"])])
    assert all(len(p) == len(set(p)) for p in per_host.values()), per_host


def test_four_pools_probe_their_cluster_files_and_the_primary_ends_the_job(cli: Cli) -> None:
    spec = four_pools(cli, "pools-probe", PROBE, HOLD)
    view = cli.json("launch", str(spec), "--wait", timeout=240)
    assert view["state"] == "succeeded", json.dumps(view, indent=1)[:4000]
    check_probes(cli, view, probe_reports(cli.bed, view["job_id"]))
    # The primary's success ended the job: the parameter server and the evaluator, which never
    # exit on their own, were stopped, and nothing of the job is left on any host.
    assert tagged(cli.bed, view["job_id"]) == {"h1": [], "h2": [], "h3": []}
    end = next(e for e in view["events"] if e["event"] == "succeeded")
    assert end["primary_succeeded"] == pool_nodes(view)[0]["host"], end
    pools = {p["role"]: p for p in view["pools"]}
    # The worker ends with the primary; on a loaded machine it may still be ending when the
    # primary's success stops the rest: then it was stopped, as the others.
    assert pools["primary"]["state"] == "succeeded" and pools["worker"]["state"] in ("succeeded", "stopped")
    assert pools["parameter_server"]["state"] == "stopped" and pools["evaluator"]["state"] == "stopped"
    print(f"job {view['state']}; pools: " + ", ".join(f"{p['role']} {p['state']}" for p in view["pools"]))
    out = cli.run("status", view["job_id"]).stdout
    assert "parameter_server" in out and "evaluator" in out, out


def test_killing_the_evaluator_leaves_training_running_and_killing_a_worker_stops_the_gang(
        cli: Cli, request: pytest.FixtureRequest) -> None:
    spec = four_pools(cli, "pools-kill", HOLD, HOLD)
    view = cli.json("launch", str(spec))
    job_id = view["job_id"]
    # Whatever fails below, nothing of this job outlives the test on the shared bed.
    request.addfinalizer(lambda: cli.run("stop", job_id, "--grace", "1", check=False))
    nodes = pool_nodes(view)
    wait_until(lambda: len(probe_reports(cli.bed, job_id)) == 5, 90, "five replicas probed and waiting")
    reports = probe_reports(cli.bed, job_id)
    assert all(r["ok"] for r in reports), [r["failures"] for r in reports]

    def victim(pool: str, replica: int) -> tuple[int, int]:
        node = next(n for n in nodes if n["pool"] == pool and n["replica"] == replica)
        host_index = int(node["host"][1:])
        rep = next(r for r in reports
                   if view_of(r, "CLUSTER_SPEC")["task"]["type"] == VERTEX_POOL[pool]
                   and view_of(r, "CLUSTER_SPEC")["task"]["index"] == replica)
        return host_index, int(rep["pid"])

    h, pid = victim("evaluator", 0)
    cli.bed.exec(h, ["kill", "-9", str(pid)])

    def reported() -> dict[str, Any] | None:
        st = cli.json("status", job_id)
        return next((e for e in st.get("events", []) if e.get("event") == "replica failed"), None)

    wait_until(lambda: reported() is not None, 30, "the evaluator's death reported")
    event = reported()
    assert event is not None
    assert (event["pool"], event["replica"], event["host"], event["signal"], event["continues"]) == (
        "evaluator", 0, f"h{h}", 9, True)
    assert event["message"] == (f'evaluator 0 on h{h} was killed by signal 9; '
                                'training continues (on_failure = "continue")')
    time.sleep(2)  # a moment for a wrong gang stop to show
    st = cli.json("status", job_id)
    assert st["state"] == "running", st
    pools = {p["role"]: p for p in st["pools"]}
    assert pools["evaluator"]["state"] == "failed", pools
    assert all(pools[r]["state"] == "running" for r in ("primary", "worker", "parameter_server")), pools
    assert len([e for e in st["events"] if e["event"] == "replica failed"]) == 1  # looking again adds none
    out = cli.run("status", job_id).stdout
    assert f"replica  {event['message']}" in out, out
    print(f"evaluator killed: job {st['state']}; pools: "
          + ", ".join(f"{p['role']} {p['state']}" for p in st["pools"]) + f"\n  event: {event['message']}")

    h, pid = victim("worker", 1)
    cli.bed.exec(h, ["kill", "-9", str(pid)])
    wait_until(lambda: cli.json("status", job_id)["state"] == "failed", 40, "the gang to fail")
    st = cli.json("status", job_id)
    worker = next(n for n in nodes if n["pool"] == "worker" and n["replica"] == 1)
    rank = nodes.index(worker)  # one process a replica, ranks in node order: primary, worker 0, worker 1
    assert (st["cause"]["pool"], st["cause"]["replica"], st["cause"]["rank"]) == ("worker", 1, rank), st["cause"]
    wait_until(lambda: tagged(cli.bed, job_id) == {"h1": [], "h2": [], "h3": []}, 30, "every process gone")
    out = cli.run("status", job_id).stdout
    assert f"cause    worker 1 on {worker['host']} (rank {rank}) killed by signal 9" in out, out
    print(f"worker 1 killed: job {st['state']}; "
          + next(line for line in out.splitlines() if line.startswith("cause")))
    assert not [e for e in st["events"] if e["event"] == "replica failed" and e["pool"] == "worker"]


def test_a_processing_job_shards_by_key_or_replicates_30_files_over_3_hosts(cli: Cli, tmp_path: Path) -> None:
    source = tmp_path / "raw"
    for i in range(30):
        sub = source / f"part{i % 4}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"file{i:02d}.txt").write_text(f"record {i}\n")
    spec = cli.spec("proc", f"""
kind = "processing"
command = ["{{python}}", "{LIST_INPUTS}"]
workdir = "{ROOT}"
nodes = 3
max_runtime = "5m"
[[processing.inputs]]
name = "sharded"
source = "{source}"
distribution = "ShardedByKey"
[[processing.inputs]]
name = "replicated"
source = "{source}"
distribution = "FullyReplicated"
[[processing.outputs]]
name = "seen"
""")
    view = cli.json("launch", str(spec), "--wait", timeout=240)
    assert view["state"] == "succeeded", json.dumps(view, indent=1)[:3000]
    every = sorted(f"{p.relative_to(source)}\t{p.read_text().strip()}" for p in source.rglob("*.txt"))
    assert len(every) == 30
    sharded: dict[str, list[str]] = {}
    for h in cli.bed.hosts:
        base = h.state_dir / "jobs" / view["job_id"] / "processing"
        config = json.loads((base / "config" / "resourceconfig.json").read_text())
        assert config == {"current_host": h.name, "hosts": ["h1", "h2", "h3"]}, config
        seen = base / "output" / "seen"
        sharded[h.name] = (seen / "sharded.txt").read_text().splitlines()
        # FullyReplicated: every host read every file.
        assert (seen / "replicated.txt").read_text().splitlines() == every, h.name
    # ShardedByKey: each file exactly once, over all three hosts.
    together = [row for rows in sharded.values() for row in rows]
    assert sorted(together) == every
    assert all(len(rows) == 10 for rows in sharded.values()), {h: len(r) for h, r in sharded.items()}
    print("ShardedByKey: " + ", ".join(f"{h} {len(r)} files" for h, r in sharded.items())
          + f" = {len(set(together))} distinct of {len(every)}; FullyReplicated: every host all {len(every)}")
    # What rigdeck status says of it: each host's share as the hosts got it, where the outputs are.
    proc = cli.json("status", view["job_id"])["processing"]
    assert proc["hosts"] == ["h1", "h2", "h3"]
    assert [(i["name"], i["distribution"], i["total"], i["listed_on"], i["hosts"]) for i in proc["inputs"]] == [
        ("sharded", "ShardedByKey", 30, "h1", {h: len(r) for h, r in sharded.items()}),
        ("replicated", "FullyReplicated", None, None, {})]
    for h in cli.bed.hosts:  # each output's path on each host is where the job wrote it
        inside = proc["outputs"][0]["hosts"][h.name]  # as the host sees it: its ~/.rigdeck is h.state_dir here
        assert inside == f"~/.rigdeck/jobs/{view['job_id']}/processing/output/seen", inside
        where = h.state_dir / inside.removeprefix("~/.rigdeck/")
        assert (where / "sharded.txt").read_text().splitlines() == sharded[h.name], (h.name, where)
    text = cli.run("status", view["job_id"]).stdout
    lines = [ln for ln in text.splitlines() if ln.startswith(("input ", "output "))]
    assert lines[0] == (f"input    sharded  ShardedByKey: 30 files of {source} over 3 hosts (h1 10, h2 10, h3 10), "
                        "listed on h1")
    assert lines[1] == f"input    replicated  FullyReplicated: every host reads all of {source}"
    assert lines[2] == f"output   seen: ~/.rigdeck/jobs/{view['job_id']}/processing/output/seen on h1, h2, h3"
    print("rigdeck status:\n" + "\n".join(lines))
