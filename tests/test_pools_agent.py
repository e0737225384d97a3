"""Worker pools and processing jobs, agent side (issue 15; docs/contracts.md "Worker pools and
processing jobs").

- The cluster files of a 4-pool job compared field by field with the shapes of the seed's
  examples (seeds/002: Vertex's CLUSTER_SPEC and TF_CONFIG; REFERENCE.md: SageMaker's
  resourceconfig.json), and read by the sagemaker-training toolkit itself;
- the job host's per-pool failure semantics, run for real on this machine (the agent's own
  ``jobhost`` process and rank wrappers, tiny Python ranks);
- the processing tree (ShardedByKey, FullyReplicated, a missing file);
- the rank wrapper leaves RANK out for replicas outside torch's world; the facts' NICs.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agent import clusterfiles as cf
from agent import facts
from agent.jobhost import TERMINAL, processes_with_tag
from agent.jobs import Jobs
from tests._require import has_module, require
from tests.kit import communicate_all

ROOT = Path(__file__).resolve().parent.parent

# -- the seed's examples (seeds/002, "CLUSTER_SPEC 예시" and "TF_CONFIG 예시"; REFERENCE.md) --------
# Transcribed as the documents print them; only their shapes are compared (names, ports and ids
# are Google's and Amazon's placeholders).
SEED_CLUSTER_SPEC: dict[str, Any] = {
    "cluster": {
        "workerpool0": ["cmle-training-workerpool0-ab-0:2222"],
        "workerpool1": ["cmle-training-workerpool1-ab-0:2222", "cmle-training-workerpool1-ab-1:2222"],
        "workerpool2": ["cmle-training-workerpool2-ab-0:2222", "cmle-training-workerpool2-ab-1:2222"],
        "workerpool3": ["cmle-training-workerpool3-ab-0:2222", "cmle-training-workerpool3-ab-1:2222",
                        "cmle-training-workerpool3-ab-2:2222"],
    },
    "environment": "cloud",
    "task": {"type": "workerpool0", "index": 0, "trial": "TRIAL_ID"},
    "job": {},
}
# A tuning job with a parameter server, a chief and two workers, seen from one worker.
SEED_TF_CONFIG: dict[str, Any] = {
    "cluster": {"chief": ["training-workerpool0-[ID_STRING_1]-0:2222"],
                "ps": ["training-workerpool2-[ID_STRING_1]-0:2222"],
                "worker": ["training-workerpool1-[ID_STRING_1]-0:2222",
                           "training-workerpool1-[ID_STRING_1]-1:2222"]},
    "environment": "cloud",
    "job": {},
    "task": {"cloud": "[ID_STRING_2]", "index": 0, "trial": "1", "type": "worker"},
}
SEED_RESOURCECONFIG: dict[str, Any] = {
    "current_host": "algo-1", "hosts": ["algo-1", "algo-2", "algo-3"],
    "current_group_name": "homogeneousCluster", "current_instance_type": "ml.p3.16xlarge",
    "network_interface_name": "eth0",
    "instance_groups": [{"instance_group_name": "homogeneousCluster",
                         "instance_type": "ml.p3.16xlarge", "hosts": ["algo-1", "algo-2", "algo-3"]}],
}
ENDPOINT_RE = re.compile(r"^[^:\s]+:\d+$")
SEED_VERTEX_TYPES = {"workerpool0", "workerpool1", "workerpool2", "workerpool3"}
SEED_TF_TYPES = {"chief", "worker", "ps", "evaluator"}  # "master" is the pre-2.1 name of chief

# -- a 4-pool job: 1 primary, 2 workers, 1 parameter server, 1 evaluator over 3 hosts ------------
# h1 runs the primary and the evaluator, h3 a worker and the parameter server.
REPLICAS = [
    # role, replica, host, address, port, slots, gpus
    ("primary", 0, "h1", "10.213.1.11", 29500, 2, [0, 1]),
    ("worker", 0, "h2", "10.213.1.12", 29500, 2, [0, 1]),
    ("worker", 1, "h3", "10.213.1.13", 29500, 2, [2, 3]),
    ("parameter_server", 0, "h3", "10.213.1.13", 29501, 1, []),
    ("evaluator", 0, "h1", "10.213.1.11", 29507, 1, []),
]
JOB_CMD = ["/usr/bin/python3", "train.py"]
PS_CMD = ["/usr/bin/python3", "ps.py"]


def pool_plan(trial: str | None = None) -> dict[str, Any]:
    nodes = []
    for role, rep, host, addr, port, slots, gpus in REPLICAS:
        nodes.append({
            "host": host, "address": addr, "slots": slots, "gpus": gpus, "cpus": 4,
            "instance_type": "rigdeck.sim-gpu-4" if gpus else "rigdeck.cpu-4", "simulated": bool(gpus),
            "pool": role, "replica": rep, "port": port,
            "command": PS_CMD if role == "parameter_server" else JOB_CMD,
            "env": {"EVAL": "1", "SHARED": "pool"} if role == "evaluator" else {},
            "on_failure": "continue" if role == "evaluator" else "stop",
        })
    plan: dict[str, Any] = {
        "job_id": "ps-train-1123-0820-ab12", "name": "ps-train", "launcher": "direct",
        "command": JOB_CMD, "workdir": "/abs/work", "env": {"SHARED": "job", "OMP_NUM_THREADS": "1"},
        "hyperparameters": {"lr": 0.1}, "checkpoint": {"dir": None, "owner": "rank0"},
        "restart_count": 0, "max_runtime_s": 3600, "grace_s": 5, "mpi": {"custom_options": []},
        "nodes": nodes, "master_addr": "10.213.1.11", "master_port": 29500,
    }
    if trial is not None:
        plan["trial"] = trial
    return plan


def host_plan(plan: dict[str, Any], host: str) -> dict[str, Any]:
    """The plan one host gets: ``node_indices`` = its replicas."""
    mine = [i for i, n in enumerate(plan["nodes"]) if n["host"] == host]
    return {**plan, "node_indices": mine, "node_index": mine[0]}


def all_envs(tmp_path: Path, plan: dict[str, Any]) -> list[dict[str, str]]:
    """Every replica's environment, each host writing into its own job dir."""
    return [cf.node_env(plan, i, str(tmp_path / n["host"] / "job"), "eth0")
            for i, n in enumerate(plan["nodes"])]


def shape(obj: Any) -> Any:
    """A value's shape: dict keys (with their shapes), list of element shapes, scalar types;
    an endpoint string is "host:port"."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return sorted({json.dumps(shape(v), sort_keys=True) for v in obj})
    if isinstance(obj, str):
        return "host:port" if ENDPOINT_RE.match(obj) else "str"
    return type(obj).__name__


# -- acceptance 2: the cluster files against the seed's examples ----------------------------------


def test_cluster_spec_has_the_seeds_shape_every_pool_in_order_and_each_replicas_task(tmp_path: Path) -> None:
    plan = pool_plan()
    envs = all_envs(tmp_path, plan)
    expected_counts = {"workerpool0": 1, "workerpool1": 2, "workerpool2": 1, "workerpool3": 1}
    for (role, rep, _h, _a, _p, _s, _g), env in zip(REPLICAS, envs, strict=True):
        spec = json.loads(env["CLUSTER_SPEC"])
        # the same top-level keys as the seed, the cluster's four pools in the seed's order
        assert list(spec) == list(SEED_CLUSTER_SPEC)
        assert list(spec["cluster"]) == list(SEED_CLUSTER_SPEC["cluster"])
        # each pool a list of host:port endpoints, as the seed's
        for name, eps in spec["cluster"].items():
            assert shape(eps) == shape(SEED_CLUSTER_SPEC["cluster"][name]), name
            assert len(eps) == expected_counts[name]
        assert spec["environment"] == SEED_CLUSTER_SPEC["environment"] == "cloud"
        # task: the seed's keys but "trial" (only in tuning), its pool and its index in the pool
        assert set(spec["task"]) == set(SEED_CLUSTER_SPEC["task"]) - {"trial"}
        assert spec["task"]["type"] in SEED_VERTEX_TYPES
        assert spec["task"] == {"type": cf.VERTEX_POOLS[role], "index": rep}
        assert isinstance(spec["job"], dict)
        assert spec["job"]["job_id"] == plan["job_id"]
    # every replica is listed at its own address and port, in its pool by replica index
    spec = json.loads(envs[0]["CLUSTER_SPEC"])
    assert spec["cluster"] == {
        "workerpool0": ["10.213.1.11:29500"],
        "workerpool1": ["10.213.1.12:29500", "10.213.1.13:29500"],
        "workerpool2": ["10.213.1.13:29501"],
        "workerpool3": ["10.213.1.11:29507"],
    }
    # all replicas see one cluster
    assert len({json.dumps(json.loads(e["CLUSTER_SPEC"])["cluster"]) for e in envs}) == 1


def test_cluster_spec_job_lists_four_worker_pool_specs_absent_ones_empty(tmp_path: Path) -> None:
    plan = pool_plan()
    plan["nodes"] = [n for n in plan["nodes"] if n["pool"] != "parameter_server"]
    job = json.loads(cf.node_env(plan, 0, str(tmp_path / "j"), "eth0")["CLUSTER_SPEC"])["job"]
    specs = job["worker_pool_specs"]
    assert len(specs) == 4 and specs[2] == {}
    assert specs[0] == {"machine_spec": {"machine_type": "rigdeck.sim-gpu-4", "accelerator_count": 2},
                        "replica_count": 1, "container_spec": {"command": JOB_CMD}}
    assert specs[1]["replica_count"] == 2 and specs[3]["replica_count"] == 1
    assert specs[3]["machine_spec"] == {"machine_type": "rigdeck.cpu-4", "accelerator_count": 0}
    full = json.loads(cf.node_env(pool_plan(), 0, str(tmp_path / "k"), "eth0")["CLUSTER_SPEC"])["job"]
    assert full["worker_pool_specs"][2]["container_spec"]["command"] == PS_CMD


def test_tf_config_has_the_seeds_shape_and_leaves_evaluators_out_of_the_cluster(tmp_path: Path) -> None:
    plan = pool_plan()
    envs = all_envs(tmp_path, plan)
    want_task = {"primary": "chief", "worker": "worker", "parameter_server": "ps",
                 "evaluator": "evaluator"}
    for (role, rep, _h, _a, _p, _s, _g), env in zip(REPLICAS, envs, strict=True):
        tf = json.loads(env["TF_CONFIG"])
        assert set(tf) == set(SEED_TF_CONFIG)
        # the seed's job is exactly this one's training cluster: chief, 2 workers, 1 ps; the
        # evaluator is not in it
        assert sorted(tf["cluster"]) == sorted(SEED_TF_CONFIG["cluster"]) == ["chief", "ps", "worker"]
        assert "evaluator" not in tf["cluster"]
        for key, eps in tf["cluster"].items():
            assert shape(eps) == shape(SEED_TF_CONFIG["cluster"][key])
            assert len(eps) == len(SEED_TF_CONFIG["cluster"][key])
        assert tf["environment"] == "cloud"
        # the seed's task keys but its internal "cloud" id and "trial" (tuning only)
        assert set(tf["task"]) == set(SEED_TF_CONFIG["task"]) - {"cloud", "trial"}
        assert tf["task"]["type"] in SEED_TF_TYPES
        assert tf["task"] == {"type": want_task[role], "index": rep}
    tf = json.loads(envs[0]["TF_CONFIG"])
    assert tf["cluster"] == {"chief": ["10.213.1.11:29500"],
                             "worker": ["10.213.1.12:29500", "10.213.1.13:29500"],
                             "ps": ["10.213.1.13:29501"]}


def test_a_trial_is_in_every_replicas_task_as_the_seed_shows(tmp_path: Path) -> None:
    plan = pool_plan(trial="3")
    for env in all_envs(tmp_path, plan):
        spec, tf = json.loads(env["CLUSTER_SPEC"]), json.loads(env["TF_CONFIG"])
        assert set(spec["task"]) == set(SEED_CLUSTER_SPEC["task"])
        assert set(tf["task"]) == set(SEED_TF_CONFIG["task"]) - {"cloud"}
        assert spec["task"]["trial"] == tf["task"]["trial"] == "3"


def test_reduction_servers_are_workerpool2_and_get_no_tf_config(tmp_path: Path) -> None:
    plan = pool_plan()
    for n in plan["nodes"]:
        if n["pool"] == "parameter_server":
            n["pool"] = "reduction_server"
    envs = all_envs(tmp_path, plan)
    rs = envs[3]
    assert "TF_CONFIG" not in rs
    assert json.loads(rs["CLUSTER_SPEC"])["task"] == {"type": "workerpool2", "index": 0}
    tf = json.loads(envs[1]["TF_CONFIG"])
    assert sorted(tf["cluster"]) == ["chief", "worker"]  # no ps: reduction servers are no ps
    assert json.loads(rs["SM_INSTANCE_GROUPS"]) == ["primary", "worker", "reduction_server", "evaluator"]


def test_every_endpoint_port_is_its_own_nodes_and_unique_per_address(tmp_path: Path) -> None:
    plan = pool_plan()
    env = all_envs(tmp_path, plan)[0]
    eps = [e for pool in json.loads(env["CLUSTER_SPEC"])["cluster"].values() for e in pool]
    assert eps == [f"{a}:{p}" for _r, _i, _h, a, p, _s, _g in REPLICAS]
    assert len(set(eps)) == len(eps)
    clash = pool_plan()
    clash["nodes"][4]["port"] = 29500  # the evaluator on the primary's address and port
    with pytest.raises(ValueError, match=r"nodes\[4\]\.port"):
        cf.node_env(clash, 4, str(tmp_path / "x"), "eth0")


def test_resourceconfig_is_a_heterogeneous_cluster_of_the_seeds_shape(tmp_path: Path) -> None:
    plan = pool_plan()
    algos = ["algo-1", "algo-2", "algo-3", "algo-4", "algo-5"]
    groups_want = [("primary", ["algo-1"]), ("worker", ["algo-2", "algo-3"]),
                   ("parameter_server", ["algo-4"]), ("evaluator", ["algo-5"])]
    for k, (role, rep, host, _a, _p, _s, gpus) in enumerate(REPLICAS):
        job_dir = tmp_path / host / "job"
        env = cf.node_env(plan, k, str(job_dir), "eth0")
        files = job_dir / "replicas" / f"{role}-{rep}"
        rc = json.loads((files / "sagemaker" / "input" / "config" / "resourceconfig.json").read_text())
        assert Path(env["SAGEMAKER_BASE_DIR"]) == files / "sagemaker"
        # the seed's keys, each group the seed's keys
        assert set(rc) == set(SEED_RESOURCECONFIG)
        for g in rc["instance_groups"]:
            assert set(g) == set(SEED_RESOURCECONFIG["instance_groups"][0])
            assert shape(g) == shape(SEED_RESOURCECONFIG["instance_groups"][0])
        assert rc["hosts"] == algos and rc["current_host"] == algos[k]
        assert [(g["instance_group_name"], g["hosts"]) for g in rc["instance_groups"]] == groups_want
        assert rc["current_group_name"] == role
        assert rc["current_instance_type"] == plan["nodes"][k]["instance_type"]
        assert sorted(h for g in rc["instance_groups"] for h in g["hosts"]) == algos  # each once
        # SM_* as the toolkit's Environment.to_env_vars() spells them
        assert json.loads(env["SM_RESOURCE_CONFIG"]) == rc
        assert env["SM_CURRENT_HOST"] == algos[k]
        assert json.loads(env["SM_HOSTS"]) == algos
        assert env["SM_CURRENT_INSTANCE_GROUP"] == role
        assert json.loads(env["SM_CURRENT_INSTANCE_GROUP_HOSTS"]) == dict(groups_want)[role]
        assert json.loads(env["SM_INSTANCE_GROUPS"]) == [g for g, _ in groups_want]
        assert json.loads(env["SM_INSTANCE_GROUPS_DICT"]) == {g["instance_group_name"]: g
                                                              for g in rc["instance_groups"]}
        assert json.loads(env["SM_DISTRIBUTION_INSTANCE_GROUPS"]) == ["primary", "worker"]
        assert json.loads(env["SM_DISTRIBUTION_HOSTS"]) == algos[:3]
        assert env["SM_IS_HETERO"] == "true"
        assert env["SM_MASTER_HOSTNAME"] == "algo-1"
        te = json.loads(env["SM_TRAINING_ENV"])
        assert te["is_hetero"] is True and te["master_hostname"] == "algo-1"
        assert te["is_master"] == (role == "primary")
        assert te["current_instance_group"] == role and te["num_gpus"] == len(gpus)


def test_torchs_world_is_the_primary_and_the_workers_only(tmp_path: Path) -> None:
    plan = pool_plan()
    envs = all_envs(tmp_path, plan)
    torch_vars = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK")
    for k, ((role, rep, host, _a, _p, slots, _g), env) in enumerate(zip(REPLICAS, envs, strict=True)):
        assert env["RIGDECK_POOL"] == role and env["RIGDECK_POOL_REPLICA"] == str(rep)
        assert env["RIGDECK_CURRENT_HOST"] == host and env["RIGDECK_NODE_RANK"] == str(k)
        ranks = cf.global_ranks(plan, k)
        per_rank = [cf.rank_env(plan, k, lr) for lr in range(slots)]
        assert [int(r["RIGDECK_RANK"]) for r in per_rank] == ranks  # rank in node order, every pool
        if role in ("primary", "worker"):
            assert env["RIGDECK_IN_WORLD"] == "1"
            assert env["MASTER_ADDR"] == "10.213.1.11" and env["MASTER_PORT"] == "29500"
            assert env["WORLD_SIZE"] == "6" and env["LOCAL_WORLD_SIZE"] == str(slots)
            assert env["NODE_RANK"] == str(0 if role == "primary" else 1 + rep)
            assert [int(r["RANK"]) for r in per_rank] == ranks  # the world is ranks 0..5
            assert [r["LOCAL_RANK"] for r in per_rank] == [str(i) for i in range(slots)]
        else:
            assert env["RIGDECK_IN_WORLD"] == "0"
            for v in torch_vars:
                assert v not in env, (role, v)
            for r in per_rank:
                assert "RANK" not in r and "LOCAL_RANK" not in r
    # the MPI hostfile is the world's
    assert (tmp_path / "h1" / "job" / "replicas" / "primary-0" / "hostfile").read_text() == (
        "10.213.1.11 slots=2\n10.213.1.12 slots=2\n10.213.1.13 slots=2\n")


def test_runtime_cluster_info_gives_world_ranks_their_place_and_refuses_the_others(tmp_path: Path) -> None:
    """runtime.cluster_info() in each replica: a world rank's view is torch's world (3 nodes, 6
    ranks), whatever the other pools add to rigdeck's lists; outside the world it says why."""
    from runtime.cluster import ClusterInfoError, cluster_info

    plan = pool_plan()
    envs = all_envs(tmp_path, plan)
    for k, ((role, rep, host, _a, _p, slots, _g), env) in enumerate(zip(REPLICAS, envs, strict=True)):
        for local in range(slots):
            renv = {**env, **cf.rank_env(plan, k, local)}
            if role in ("primary", "worker"):
                info = cluster_info(renv, cuda_devices=0)
                assert (info.world_size, info.num_nodes, info.local_world_size) == (6, 3, 2)
                assert info.rank == cf.global_ranks(plan, k)[local] and info.local_rank == local
                assert info.node_rank == (0 if role == "primary" else 1 + rep)
                assert info.hosts == ("h1", "h2", "h3") and info.current_host == host
                assert (info.master_addr, info.master_port) == ("10.213.1.11", 29500)
            else:
                with pytest.raises(ClusterInfoError, match=f"{role} replica {rep} of a pool job, outside"):
                    cluster_info(renv, cuda_devices=0)


def test_each_replica_has_its_own_files_and_the_host_keeps_one_job_dir(tmp_path: Path) -> None:
    plan = pool_plan()
    job = tmp_path / "h1" / "job"
    prim = cf.node_env(plan, 0, str(job), "eth0")
    ev = cf.node_env(plan, 4, str(job), "eth0")
    assert prim["RIGDECK_JOB_DIR"] == ev["RIGDECK_JOB_DIR"] == str(job)
    assert prim["RIGDECK_METRICS_DIR"] == ev["RIGDECK_METRICS_DIR"] == str(job / "metrics")
    assert prim["RIGDECK_REPLICA_DIR"] == str(job / "replicas" / "primary-0")
    assert ev["RIGDECK_REPLICA_DIR"] == str(job / "replicas" / "evaluator-0")
    assert json.loads((job / "replicas" / "primary-0" / "node_env.json").read_text()) == prim
    assert json.loads((job / "replicas" / "evaluator-0" / "node_env.json").read_text()) == ev
    assert not (job / "node_env.json").exists() and not (job / "sagemaker").exists()
    assert prim["SM_CURRENT_HOST"] != ev["SM_CURRENT_HOST"]
    # the pool's env over the job's; the pool's command in the SageMaker entry point
    assert ev["SHARED"] == "pool" and ev["EVAL"] == "1" and prim["SHARED"] == "job"
    ps = cf.node_env(plan, 3, str(tmp_path / "h3" / "job"), "eth0")
    assert ps["SM_USER_ENTRY_POINT"] == "ps.py" and prim["SM_USER_ENTRY_POINT"] == "train.py"
    assert cf.node_command(plan, 3) == PS_CMD and cf.node_command(plan, 0) == JOB_CMD


def test_a_plan_without_pools_has_no_pool_variables(tmp_path: Path) -> None:
    plan = pool_plan()
    for n in plan["nodes"]:
        for k in ("pool", "replica", "port", "command", "env", "on_failure"):
            n.pop(k)
    plan["nodes"] = [plan["nodes"][i] for i in (0, 1, 2)]
    plan["nodes"][2]["host"] = "h4"
    env = cf.node_env(plan, 1, str(tmp_path / "j"), "eth0")
    assert not [k for k in env if k.startswith("RIGDECK_POOL") or k == "RIGDECK_IN_WORLD"]
    assert env["SM_IS_HETERO"] == "false" and env["SM_CURRENT_INSTANCE_GROUP"] == "homogeneousCluster"
    assert not (tmp_path / "j" / "replicas").exists()


@pytest.mark.parametrize("change, field", [
    (lambda p: p["nodes"][1].update(pool="boss"), r"nodes\[1\]\.pool"),
    (lambda p: p["nodes"][0].update(pool="worker", replica=2), r"exactly one primary"),
    (lambda p: p["nodes"][2].update(replica=0), r"nodes\[2\]: worker 0 is nodes\[1\]"),
    (lambda p: p["nodes"][3].pop("port"), r"nodes\[3\]\.port"),
])
def test_a_bad_pool_plan_is_refused_naming_the_node(tmp_path: Path, change: Any, field: str) -> None:
    plan = pool_plan()
    change(plan)
    with pytest.raises(ValueError, match=field):
        cf.node_env(plan, 0, str(tmp_path / "j"), "eth0")


# -- a real judge: the sagemaker-training toolkit reads what we wrote ---------------------------


def test_the_sagemaker_training_toolkit_reads_the_heterogeneous_cluster(tmp_path: Path) -> None:
    """Its Environment, given only SAGEMAKER_BASE_DIR and the SM_* env, in a fresh interpreter."""
    require(has_module("sagemaker_training"), "the sagemaker-training toolkit is not installed "
            "(pip install -e '.[test]' brings it)")
    plan = pool_plan()
    results = []
    for k, (role, _rep, host, _a, _p, _s, _g) in enumerate(REPLICAS):
        env = cf.node_env(plan, k, str(tmp_path / host / "job"), "eth0")
        code = (
            "import json\n"
            "from sagemaker_training import environment\n"
            "e = environment.Environment()\n"
            "print(json.dumps({'current_host': e.current_host, 'hosts': e.hosts, 'master': e.master_hostname,"
            " 'is_master': e.is_master, 'group': e.current_instance_group,"
            " 'group_hosts': e.current_instance_group_hosts, 'groups': e.instance_groups,"
            " 'dist_hosts': e.distribution_hosts, 'is_hetero': e.is_hetero,"
            " 'dist_groups': e.distribution_instance_groups}))\n"
        )
        run_env = {k2: v for k2, v in os.environ.items() if not k2.startswith("SM_")}
        run_env.update({k2: v for k2, v in env.items() if k2 == "SAGEMAKER_BASE_DIR" or k2.startswith("SM_")})
        proc = subprocess.run([sys.executable, "-c", code], env=run_env, capture_output=True, text=True,
                              timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(got)
        assert got["current_host"] == f"algo-{k + 1}"
        assert got["hosts"] == [f"algo-{i}" for i in range(1, 6)]
        assert got["master"] == "algo-1" and got["is_master"] == (role == "primary")
        assert got["group"] == role
        assert got["groups"] == ["primary", "worker", "parameter_server", "evaluator"]
        assert got["is_hetero"] is True
        assert got["dist_hosts"] == ["algo-1", "algo-2", "algo-3"]
        assert got["dist_groups"] == ["primary", "worker"]
    assert results[1]["group_hosts"] == ["algo-2", "algo-3"]


# -- the job host: per-pool failure semantics, run for real here --------------------------------


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def local_pool_plan(tmp_path: Path, job_id: str, replicas: list[tuple[str, int, str, str]]) -> dict[str, Any]:
    """A pool job whose replicas all run on this machine: (role, replica, on_failure, python code)."""
    ports = _free_ports(len(replicas))
    nodes = []
    for (role, rep, on_failure, code), port in zip(replicas, ports, strict=True):
        nodes.append({"host": "local", "address": "127.0.0.1", "slots": 1, "gpus": [], "cpus": 1,
                      "instance_type": "rigdeck.cpu-1", "pool": role, "replica": rep, "port": port,
                      "command": [sys.executable, "-c", code], "env": {"MY_POOL": role},
                      "on_failure": on_failure})
    return {"job_id": job_id, "name": "pools", "launcher": "direct", "command": [sys.executable, "-c", "pass"],
            "workdir": str(tmp_path), "env": {}, "restart_count": 0, "max_runtime_s": 120, "grace_s": 3,
            "nodes": nodes, "node_indices": list(range(len(nodes))), "node_index": 0,
            "master_addr": "127.0.0.1", "master_port": ports[0]}


class LocalJobHost:
    """``agent jobhost`` on a plan, in its own session, as the daemon starts it."""

    def __init__(self, tmp_path: Path, plan: dict[str, Any]):
        self.dir = tmp_path / "jobs" / plan["job_id"]
        self.dir.mkdir(parents=True)
        (self.dir / "plan.json").write_text(json.dumps(plan))
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RIGDECK_CLAIM_DIR": str(tmp_path / "claims")}
        self.job_id = plan["job_id"]
        self.proc = subprocess.Popen([sys.executable, "-m", "agent", "jobhost", "--job-dir", str(self.dir)],
                                     cwd=self.dir, env=env, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def state(self) -> dict[str, Any]:
        try:
            return json.loads((self.dir / "state.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait_for(self, what: Any, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            st = self.state()
            if st and what(st):
                return st
            assert time.monotonic() < deadline, (st, self.log())
            time.sleep(0.05)

    def replica(self, st: dict[str, Any], pool: str, rep: int = 0) -> dict[str, Any]:
        return next(r for r in st.get("replicas") or [] if r["pool"] == pool and r["replica"] == rep)

    def log(self) -> str:
        parts = []
        for name in ("jobhost.log", "launcher.log"):
            p = self.dir / name
            parts.append(p.read_text() if p.exists() else "")
        return "\n".join(parts)

    def close(self) -> int:
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            assert self.proc.stderr is not None
            self.proc.stderr.close()


PRIMARY_AFTER = ("import os, time\n"
                 "open(os.path.join(os.environ['RIGDECK_JOB_DIR'], 'primary.env'), 'w')"
                 ".write(os.environ.get('RANK', '-') + ' ' + os.environ['MY_POOL'])\n"
                 "while not os.path.exists(os.path.join(os.environ['RIGDECK_JOB_DIR'], 'go')): time.sleep(0.05)\n")
SLEEPER = "import time\ntime.sleep(300)\n"


def test_an_evaluator_failing_leaves_training_running_then_the_primary_ends_the_host(tmp_path: Path) -> None:
    plan = local_pool_plan(tmp_path, "pools-eval", [
        ("primary", 0, "stop", PRIMARY_AFTER),
        ("worker", 0, "stop", SLEEPER),
        ("evaluator", 0, "continue", "import sys\nsys.exit(3)\n"),
    ])
    jh = LocalJobHost(tmp_path, plan)
    try:
        st = jh.wait_for(lambda s: s.get("replicas") and jh.replica(s, "evaluator")["state"] != "running")
        ev = jh.replica(st, "evaluator")
        assert ev["state"] == "failed" and ev["exit_code"] == 3 and ev["signal"] is None, st
        assert ev["on_failure"] == "continue" and ev["ranks"] == [2] and ev["node_index"] == 2
        assert ev["message"] == "evaluator 0 on local (rank 2) exited 3"
        # training goes on: the host is running, the primary and the worker too
        time.sleep(1.0)
        st = jh.state()
        assert st["state"] == "running", st
        assert jh.replica(st, "primary")["state"] == jh.replica(st, "worker")["state"] == "running"
        assert not st.get("primary_succeeded")
        assert (tmp_path / "jobs" / "pools-eval" / "primary.env").read_text() == "0 primary"
        (jh.dir / "go").write_text("")  # the primary finishes
        st = jh.wait_for(lambda s: s.get("state") in TERMINAL)
        assert jh.close() == 0
    finally:
        jh.close()
    assert st["state"] == "succeeded" and st["primary_succeeded"] is True, st
    assert [(r["pool"], r["state"]) for r in st["replicas"]] == [
        ("primary", "succeeded"), ("worker", "stopped"), ("evaluator", "failed")]
    assert jh.replica(st, "worker")["message"] == "stopped: the primary succeeded"
    assert not processes_with_tag("pools-eval")  # the worker's rank is gone
    worker_exit = json.loads((jh.dir / "ranks" / "rank-1.exit.json").read_text())
    assert worker_exit["signal"] == signal.SIGTERM
    # As the host reports its ranks: the worker's rank was stopped (by SIGTERM), not failed; the
    # evaluator's failed with its own exit code.
    ranks = {r["rank"]: r for r in Jobs(str(tmp_path), []).status("pools-eval")["ranks"]}
    assert [(ranks[k]["state"], ranks[k]["exit_code"], ranks[k]["signal"]) for k in (0, 1, 2)] == [
        ("exited", 0, None), ("stopped", worker_exit["exit_code"], signal.SIGTERM), ("failed", 3, None)], ranks


def test_a_worker_failing_fails_the_host_and_the_cause_names_the_pool(tmp_path: Path) -> None:
    plan = local_pool_plan(tmp_path, "pools-worker", [
        ("primary", 0, "stop", SLEEPER),
        ("worker", 0, "stop", SLEEPER),
        ("worker", 1, "stop", "import time, sys\ntime.sleep(0.5)\nprint('worker boom')\nsys.exit(1)\n"),
        ("evaluator", 0, "continue", SLEEPER),
    ])
    jh = LocalJobHost(tmp_path, plan)
    try:
        st = jh.wait_for(lambda s: s.get("state") in TERMINAL)
        assert jh.close() == 1
    finally:
        jh.close()
    assert st["state"] == "failed", st
    cause = st["cause"]
    assert (cause["pool"], cause["replica"], cause["rank"], cause["exit_code"]) == ("worker", 1, 2, 1)
    assert cause["host"] == "local" and "worker boom" in cause["tail"]
    assert [(r["pool"], r["replica"], r["state"]) for r in st["replicas"]] == [
        ("primary", 0, "stopped"), ("worker", 0, "stopped"), ("worker", 1, "failed"),
        ("evaluator", 0, "stopped")]
    assert jh.replica(st, "worker", 1)["message"] == "worker 1 on local (rank 2) exited 1"
    assert not st.get("primary_succeeded")
    assert not processes_with_tag("pools-worker")


def test_an_evaluator_with_on_failure_stop_fails_the_host(tmp_path: Path) -> None:
    plan = local_pool_plan(tmp_path, "pools-evalstop", [
        ("primary", 0, "stop", SLEEPER),
        ("evaluator", 0, "stop", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n"),
    ])
    jh = LocalJobHost(tmp_path, plan)
    try:
        st = jh.wait_for(lambda s: s.get("state") in TERMINAL)
    finally:
        jh.close()
    assert st["state"] == "failed" and st["cause"]["pool"] == "evaluator", st
    assert st["cause"]["signal"] == signal.SIGKILL
    assert jh.replica(st, "evaluator")["message"] == "evaluator 0 on local (rank 1) was killed by signal 9"


def test_a_host_without_the_primary_succeeds_when_its_replicas_end_well(tmp_path: Path) -> None:
    """Here: a worker that finishes and an evaluator that fails (continue); the primary is
    elsewhere. Nothing stopped the gang: the host ends "succeeded", without primary_succeeded."""
    plan = local_pool_plan(tmp_path, "pools-noprim", [
        ("primary", 0, "stop", SLEEPER),
        ("worker", 0, "stop", "print('w ok')\n"),
        ("evaluator", 0, "continue", "raise SystemExit(2)\n"),
    ])
    plan["node_indices"], plan["node_index"] = [1, 2], 1
    jh = LocalJobHost(tmp_path, plan)
    try:
        st = jh.wait_for(lambda s: s.get("state") in TERMINAL)
    finally:
        jh.close()
    assert st["state"] == "succeeded" and "primary_succeeded" not in st, st
    assert [(r["pool"], r["state"], r["exit_code"]) for r in st["replicas"]] == [
        ("worker", "succeeded", 0), ("evaluator", "failed", 2)]
    assert st["expected_ranks"] == [1, 2]


def test_a_stop_request_stops_every_replica_here(tmp_path: Path) -> None:
    plan = local_pool_plan(tmp_path, "pools-stop", [
        ("primary", 0, "stop", SLEEPER),
        ("parameter_server", 0, "stop", SLEEPER),
        ("evaluator", 0, "continue", SLEEPER),
    ])
    jh = LocalJobHost(tmp_path, plan)
    try:
        jh.wait_for(lambda s: s.get("state") == "running"
                    and len(list((jh.dir / "ranks").glob("rank-?.json"))) == 3)
        os.kill(jh.proc.pid, signal.SIGTERM)  # what the agent's job_stop does
        st = jh.wait_for(lambda s: s.get("state") in TERMINAL)
    finally:
        jh.close()
    assert st["state"] == "stopped" and st["cause"] == {"message": "stopped by request"}, st
    assert [(r["pool"], r["state"]) for r in st["replicas"]] == [
        ("primary", "stopped"), ("parameter_server", "stopped"), ("evaluator", "stopped")]
    assert not processes_with_tag("pools-stop")
    ranks = Jobs(str(tmp_path), []).status("pools-stop")["ranks"]
    assert [(r["rank"], r["state"]) for r in ranks] == [(0, "stopped"), (1, "stopped"), (2, "stopped")], ranks


def test_a_pool_job_needs_the_direct_launcher(tmp_path: Path) -> None:
    plan = local_pool_plan(tmp_path, "pools-torchrun", [("primary", 0, "stop", "pass")])
    plan["launcher"] = "torchrun"
    jh = LocalJobHost(tmp_path, plan)
    try:
        st = jh.wait_for(lambda s: s.get("state") in TERMINAL)
    finally:
        jh.close()
    assert st["state"] == "failed"
    assert "needs the direct launcher" in st["cause"]["message"]


# -- processing jobs ------------------------------------------------------------------------------


def _source(tmp_path: Path) -> Path:
    src = tmp_path / "raw"
    (src / "sub").mkdir(parents=True)
    for rel in ("a.txt", "b.txt", "sub/c.txt", "sub/d.txt"):
        (src / rel).write_text(rel)
    return src


def processing_plan(src: Path, shard: list[str], node_index: int = 1) -> dict[str, Any]:
    nodes = [{"host": h, "address": f"10.213.1.1{i}", "slots": 1, "gpus": []}
             for i, h in enumerate(["h1", "h2", "h3"])]
    return {"job_id": "count-1", "name": "count", "kind": "processing", "launcher": "direct",
            "command": ["/usr/bin/python3", "count.py"], "workdir": str(src.parent), "env": {"K": "v"},
            "nodes": nodes, "node_index": node_index, "master_addr": "10.213.1.10", "master_port": 29500,
            "processing": {
                "inputs": [{"name": "raw", "source": str(src), "distribution": "ShardedByKey",
                            "files": shard, "total": 4, "listing_sha256": "0" * 64},
                           {"name": "all", "source": "raw", "distribution": "FullyReplicated"}],
                "outputs": [{"name": "counts"}]}}


def test_processing_tree_shards_link_this_hosts_files_and_replicated_inputs_link_the_dir(tmp_path: Path) -> None:
    src = _source(tmp_path)
    job = tmp_path / "job"
    env = cf.node_env(processing_plan(src, ["b.txt", "sub/d.txt"]), 1, str(job), "eth0")
    root = job / "processing"
    assert env["RIGDECK_PROCESSING_DIR"] == str(root)
    raw = root / "input" / "raw"
    got = sorted(str(p.relative_to(raw)) for p in raw.rglob("*") if p.is_file())
    assert got == ["b.txt", "sub/d.txt"]  # this host's shard only, at its relative paths
    assert os.readlink(raw / "sub" / "d.txt") == str(src / "sub" / "d.txt")
    assert (raw / "b.txt").read_text() == "b.txt"
    every = root / "input" / "all"
    assert every.is_symlink() and os.readlink(every) == str(src)  # relative source: under workdir
    assert sorted(str(p.relative_to(every)) for p in every.rglob("*") if p.is_file()) == [
        "a.txt", "b.txt", "sub/c.txt", "sub/d.txt"]
    assert (root / "output" / "counts").is_dir() and not any((root / "output" / "counts").iterdir())
    rc = json.loads((root / "config" / "resourceconfig.json").read_text())
    assert rc == {"current_host": "h2", "hosts": ["h1", "h2", "h3"]}  # only these two keys
    for absent in ("CLUSTER_SPEC", "TF_CONFIG", "SM_HOSTS", "SAGEMAKER_BASE_DIR", "MASTER_ADDR"):
        assert absent not in env
    assert env["RIGDECK_CURRENT_HOST"] == "h2" and env["RIGDECK_JOB_ID"] == "count-1" and env["K"] == "v"
    assert not (job / "sagemaker").exists()
    # a restart re-links from scratch: a new shard replaces the old one
    cf.node_env(processing_plan(src, ["a.txt"]), 1, str(job), "eth0")
    assert sorted(str(p.relative_to(raw)) for p in raw.rglob("*") if p.is_file()) == ["a.txt"]
    assert (src / "b.txt").exists()  # the source is never touched


def test_a_listed_file_missing_here_fails_the_start_naming_it(tmp_path: Path) -> None:
    src = _source(tmp_path)
    with pytest.raises(ValueError, match=r"processing input 'raw': listed file 'sub/gone.txt' is missing under "):
        cf.node_env(processing_plan(src, ["a.txt", "sub/gone.txt"]), 1, str(tmp_path / "job"), None)
    with pytest.raises(ValueError, match=r"listed file '../x' is not a relative path"):
        cf.node_env(processing_plan(src, ["../x"]), 1, str(tmp_path / "job2"), None)
    plan = processing_plan(src, [])
    plan["processing"]["inputs"][1]["source"] = str(tmp_path / "nowhere")
    with pytest.raises(ValueError, match=r"processing input 'all': source .*nowhere is not a directory on h2"):
        cf.node_env(plan, 1, str(tmp_path / "job3"), None)


def test_a_processing_job_host_that_cannot_link_its_shard_fails_before_starting(tmp_path: Path) -> None:
    src = _source(tmp_path)
    plan = processing_plan(src, ["missing.txt"], node_index=0)
    plan["nodes"][0]["address"] = "127.0.0.1"
    plan["command"] = [sys.executable, "-c", "open('ran', 'w').write('x')"]
    jh = LocalJobHost(tmp_path, plan)
    try:
        st = jh.wait_for(lambda s: s.get("state") in TERMINAL)
    finally:
        jh.close()
    assert st["state"] == "failed"
    assert f"listed file 'missing.txt' is missing under {src} on h1" in st["cause"]["message"]
    assert not (tmp_path / "ran").exists()


# -- the rank wrapper and the facts ---------------------------------------------------------------


@pytest.mark.parametrize("in_world, want", [("0", "- -"), ("1", "7 0"), (None, "7 0")])
def test_the_rank_wrapper_sets_rank_only_inside_torchs_world(tmp_path: Path, in_world: str | None, want: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "RIGDECK_IN_WORLD")}
    env["PYTHONPATH"] = str(ROOT)
    env["RIGDECK_CLAIM_DIR"] = str(tmp_path / "claims")
    if in_world is not None:
        env["RIGDECK_IN_WORLD"] = in_world
    code = ("import os; print(os.environ.get('RANK', '-'), os.environ.get('LOCAL_RANK', '-'), "
            "os.environ['RIGDECK_RANK'])")
    subprocess.run([sys.executable, "-m", "agent", "rank", "--job-dir", str(tmp_path), "--rank", "7",
                    "--local-rank", "0", "--", sys.executable, "-c", code],
                   env=env, capture_output=True, timeout=60, check=True)
    assert (tmp_path / "logs" / "rank-7.log").read_text().strip() == want + " 7"


def test_facts_list_nics_with_their_speed_and_addresses_but_loopback(tmp_path: Path, monkeypatch: Any) -> None:
    net = tmp_path / "net"
    for name, flags, speed in (("lo", "0x9", None), ("eth0", "0x1003", "25000"), ("veth1", "0x1003", "-1"),
                               ("dummy0", "0x83", None), ("bond0", "0x1403", "oops")):
        (net / name).mkdir(parents=True)
        (net / name / "flags").write_text(flags + "\n")
        if speed is not None:
            (net / name / "speed").write_text(speed + "\n")
    monkeypatch.setattr(facts, "_addresses_by_interface",
                        lambda: {"eth0": ["10.0.0.2", "fd00::2"], "lo": ["127.0.0.1"]})
    assert facts.nics(str(net)) == [
        {"name": "bond0", "speed_mbps": None, "addresses": []},
        {"name": "dummy0", "speed_mbps": None, "addresses": []},
        {"name": "eth0", "speed_mbps": 25000, "addresses": ["10.0.0.2", "fd00::2"]},
        {"name": "veth1", "speed_mbps": None, "addresses": []},
    ]
    assert facts.nics(str(tmp_path / "nothing")) == []


def test_facts_of_this_machine_carry_nics_and_the_controller_still_reads_them() -> None:
    from tui.remote.agentclient import HostFacts

    got = facts.collect()
    assert isinstance(got["nics"], list)
    assert all(n["name"] != "lo" for n in got["nics"])
    for n in got["nics"]:
        assert set(n) == {"name", "speed_mbps", "addresses"}
        assert n["speed_mbps"] is None or (isinstance(n["speed_mbps"], int) and n["speed_mbps"] > 0)
        want = Path("/sys/class/net", n["name"], "speed")
        try:
            raw = int(want.read_text())
        except (OSError, ValueError):
            raw = -1
        assert n["speed_mbps"] == (raw if raw > 0 else None)
    hf = HostFacts.from_wire(json.loads(json.dumps(got)))
    assert hf.raw["nics"] == got["nics"] and hf.hostname == got["hostname"]


# -- tests/probe_rank.py's pool mode, inside real processes on this machine -----------------------


def _run_probes(tmp_path: Path,
                plan: dict[str, Any]) -> tuple[dict[int, dict[str, Any]], list[subprocess.CompletedProcess[str]]]:
    """Every rank of every replica (all on 127.0.0.1): the replica's cluster files, its rank's
    variables, the probe; one job dir, as one host has."""
    job = tmp_path / "job"
    procs = []
    for i in range(len(plan["nodes"])):
        node = cf.node_env(plan, i, str(job), "lo")
        for lr in range(int(plan["nodes"][i]["slots"])):
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_", "NODE_RANK", "SM_", "OMPI_"))}
            env.update(node)
            env.update(cf.rank_env(plan, i, lr))
            env.update({"OMP_NUM_THREADS": "1", "PROBE_TIMEOUT_S": "60"})
            procs.append(subprocess.Popen([sys.executable, str(ROOT / "tests" / "probe_rank.py")], env=env,
                                          cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = communicate_all(procs)
    reports = {}
    for f in sorted((job / "probe").glob("rank-*.json")):
        r = json.loads(f.read_text())
        reports[r["rank"]] = r
    return reports, outs


def probe_pool_plan() -> dict[str, Any]:
    """The 4-pool job on this machine: 1 primary (2 ranks), 2 workers, 1 ps, 1 evaluator."""
    ports = _free_ports(5)
    roles = [("primary", 0, 2), ("worker", 0, 1), ("worker", 1, 1), ("parameter_server", 0, 1), ("evaluator", 0, 1)]
    nodes: list[dict[str, Any]] = [{"host": f"node-{k % 3}", "address": "127.0.0.1", "slots": slots, "gpus": [],
              "cpus": 1, "instance_type": "rigdeck.cpu-1", "pool": role, "replica": rep, "port": port,
              "command": [sys.executable, "probe_rank.py"], "env": {},
              "on_failure": "continue" if role == "evaluator" else "stop"}
             for k, ((role, rep, slots), port) in enumerate(zip(roles, ports, strict=True))]
    return {"job_id": f"probe-pools-{ports[0]}", "name": "probe", "launcher": "direct",
            "command": [sys.executable, "probe_rank.py"], "workdir": str(ROOT), "env": {},
            "hyperparameters": {"lr": 0.1}, "checkpoint": {"dir": None, "owner": "rank0"}, "restart_count": 0,
            "nodes": nodes, "master_addr": "127.0.0.1", "master_port": ports[0]}


def test_the_probe_checks_every_replica_of_a_four_pool_job(tmp_path: Path) -> None:
    from tests._require import TORCH_MISSING

    require(has_module("torch"), TORCH_MISSING)
    plan = probe_pool_plan()
    reports, outs = _run_probes(tmp_path, plan)
    assert sorted(reports) == list(range(6)), [o.stderr[-1500:] for o in outs]
    for rank, r in reports.items():
        assert r["ok"], (rank, r["failures"])
    want = {0: ("primary", 0, True), 1: ("primary", 0, True), 2: ("worker", 0, True), 3: ("worker", 1, True),
            4: ("parameter_server", 0, False), 5: ("evaluator", 0, False)}
    for rank, (pool, rep, in_world) in want.items():
        got = reports[rank]["pool"]
        assert (got["pool"], got["replica"], got["in_world"]) == (pool, rep, in_world)
        node = plan["nodes"][got["node_rank"]]
        assert got["endpoint"] == f"127.0.0.1:{node['port']}"
        # the port check ran once per replica (its local rank 0) and found the port free
        assert got["port_free"] is (True if rank != 1 else None)
        checks = {c["check"] for c in reports[rank]["checks"]}
        assert {"CLUSTER_SPEC task", "SageMaker current group", "SageMaker groups match the Vertex pools",
                "in torch's world"} <= checks
        if in_world:  # gloo over the world: the primary's 2 ranks and the 2 workers
            assert reports[rank]["torch_rank"] == rank
            assert reports[rank]["collective"]["sum"] == 4 * 5 / 2
        else:
            assert reports[rank]["collective"] is None
            assert "no torch variables outside the world" in checks
    for o in outs:
        assert o.returncode == 0, o.stderr[-2000:]


def test_the_probe_says_when_a_replicas_port_is_taken_or_torch_leaks_out_of_the_world(tmp_path: Path) -> None:
    require(has_module("torch"), "torch is not installed")
    plan = probe_pool_plan()
    plan["nodes"] = plan["nodes"][:1] + plan["nodes"][3:]  # primary, ps, evaluator: no gloo peers needed
    plan["nodes"][0]["slots"] = 1
    job = tmp_path / "job"
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", plan["nodes"][2]["port"]))  # someone took the evaluator's port
    try:
        node = cf.node_env(plan, 1, str(job), "lo")
        node["WORLD_SIZE"] = "3"  # as if the parameter server were given torch's variables
        results = []
        for i, env_over in ((1, node), (2, cf.node_env(plan, 2, str(job), "lo"))):
            env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "SM_"))}
            env.update(env_over)
            env.update(cf.rank_env(plan, i, 0))
            results.append(subprocess.run([sys.executable, str(ROOT / "tests" / "probe_rank.py")], env=env,
                                          capture_output=True, text=True, timeout=120, check=False))
    finally:
        blocker.close()
    ps, ev = results
    assert ps.returncode == 1 and "no torch variables outside the world" in ps.stderr
    assert ev.returncode == 1 and "own endpoint port free at launch" in ev.stderr
    r = json.loads((job / "probe" / "rank-2.json").read_text())
    assert [c["check"] for c in r["failures"]] == ["own endpoint port free at launch"]
    assert "Address already in use" in r["pool"]["port_free"]


def test_ranks_a_stop_is_ending_read_stopped_and_a_failed_replicas_read_failed(tmp_path: Path) -> None:
    """What a host reports while it stops the replicas the primary's success (or a user's stop)
    ends: their ranks are stopped even before the replica's end is recorded; the evaluator that
    failed by itself stays failed; the primary's rank exited."""
    d = tmp_path / "jobs" / "pools-mid"
    (d / "ranks").mkdir(parents=True)
    replicas = [{"node_index": 0, "pool": "primary", "replica": 0, "ranks": [0], "state": "succeeded"},
                {"node_index": 1, "pool": "parameter_server", "replica": 0, "ranks": [1], "state": "stopping"},
                {"node_index": 2, "pool": "evaluator", "replica": 0, "ranks": [2], "state": "failed"},
                {"node_index": 3, "pool": "worker", "replica": 0, "ranks": [3], "state": "stopping"}]
    (d / "state.json").write_text(json.dumps({"job_id": "pools-mid", "state": "stopping",
                                              "primary_succeeded": True, "replicas": replicas}))
    ends = {0: (0, None), 1: (None, signal.SIGTERM), 2: (3, None)}  # rank 3: SIGKILL took its wrapper
    for rank in range(4):
        (d / "ranks" / f"rank-{rank}.json").write_text(json.dumps({"rank": rank, "pid": 2 ** 22 + rank}))
        if rank in ends:
            code, sig = ends[rank]
            (d / "ranks" / f"rank-{rank}.exit.json").write_text(
                json.dumps({"rank": rank, "exit_code": code, "signal": sig}))
    ranks = Jobs(str(tmp_path), []).status("pools-mid")["ranks"]
    assert [(r["rank"], r["state"]) for r in ranks] == [
        (0, "exited"), (1, "stopped"), (2, "failed"), (3, "stopped")], ranks
    # The same host before any stop: a rank gone without a record is lost, one killed is failed.
    for rep in replicas:
        rep["state"] = "running" if rep["state"] == "stopping" else rep["state"]
    (d / "state.json").write_text(json.dumps({"job_id": "pools-mid", "state": "running", "replicas": replicas}))
    ranks = Jobs(str(tmp_path), []).status("pools-mid")["ranks"]
    assert [(r["rank"], r["state"]) for r in ranks] == [
        (0, "exited"), (1, "failed"), (2, "failed"), (3, "lost")], ranks
