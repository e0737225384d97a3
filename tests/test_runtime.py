"""runtime: cluster_info from every source, report(), Checkpointer policies and atomicity,
shard(), scaled_lr()."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime import metrics
from runtime.checkpoint import Checkpointer, CheckpointError
from runtime.cluster import ClusterInfoError, cluster_info
from runtime.distributed import scaled_lr
from runtime.metrics import Reporter
from runtime.sharding import shard
from tests._require import PY39_MISSING, python39, require

ROOT = Path(__file__).resolve().parent.parent
HOSTS = ["h1", "h2", "h3"]
ADDRS = ["10.9.0.1", "10.9.0.2", "10.9.0.3"]


def info(env: dict[str, str], tmp_path: Path | None = None, **kw: Any) -> Any:
    base = str(tmp_path / "no-sagemaker") if tmp_path else "/nonexistent-sagemaker-base"
    kw.setdefault("cuda_devices", 0)
    return cluster_info(env, base, **kw)


def rigdeck_env(node: int = 1, local_rank: int = 1, slots: int = 2, **extra: str) -> dict[str, str]:
    """What the agent sets for a `direct` rank on host `node` of 3 (slots ranks per host)."""
    env = {
        "RIGDECK_JOB_ID": "job-42",
        "RIGDECK_HOSTS": json.dumps(HOSTS),
        "RIGDECK_HOST_ADDRS": json.dumps(ADDRS),
        "RIGDECK_CURRENT_HOST": HOSTS[node],
        "RIGDECK_NODE_RANK": str(node),
        "RIGDECK_NUM_NODES": "3",
        "RIGDECK_RANK": str(node * slots + local_rank),
        "RIGDECK_LOCAL_RANK": str(local_rank),
        "RIGDECK_WORLD_SIZE": str(3 * slots),
        "RIGDECK_LOCAL_WORLD_SIZE": str(slots),
        "RIGDECK_MASTER_ADDR": ADDRS[0],
        "RIGDECK_MASTER_PORT": "29411",
        "RIGDECK_GPUS": "",
    }
    env.update(extra)
    return env


def sagemaker_tree(base: Path, current: str, hosts: list[str] | None = None) -> Path:
    cfg = base / "input" / "config"
    cfg.mkdir(parents=True, exist_ok=True)
    (cfg / "resourceconfig.json").write_text(json.dumps({
        "current_host": current, "hosts": hosts or HOSTS,
        "current_group_name": "homogeneousCluster", "network_interface_name": "eth0",
        "instance_groups": [{"instance_group_name": "homogeneousCluster",
                             "hosts": hosts or HOSTS}]}))
    return base


def vertex_spec(node: int, hosts: list[str] = ADDRS, port: int = 2222) -> str:
    ends = [f"{h}:{port}" for h in hosts]
    return json.dumps({
        "cluster": {"workerpool0": ends[:1], "workerpool1": ends[1:], "workerpool2": [],
                    "workerpool3": []},
        "environment": "cloud", "job": {},
        "task": {"type": "workerpool0" if node == 0 else "workerpool1",
                 "index": 0 if node == 0 else node - 1}})


def tf_config(node: int, hosts: list[str] = ADDRS, port: int = 2222) -> str:
    ends = [f"{h}:{port}" for h in hosts]
    return json.dumps({
        "cluster": {"chief": ends[:1], "worker": ends[1:]}, "environment": "cloud",
        "task": {"type": "chief" if node == 0 else "worker",
                 "index": 0 if node == 0 else node - 1}})


# -- cluster_info: each source alone ---------------------------------------------------------


def test_nothing_set_is_a_single_process(tmp_path: Path) -> None:
    i = info({}, tmp_path)
    assert (i.world_size, i.rank, i.local_rank, i.local_world_size) == (1, 0, 0, 1)
    assert (i.node_rank, i.num_nodes, i.hosts) == (0, 1, (i.current_host,))
    assert (i.master_addr, i.master_port, i.device) == ("127.0.0.1", 29500, "cpu")
    assert i.source == ("defaults",)
    assert i.checkpoint_policy == "rank0" and i.checkpoint_owner
    assert i.role == "workerpool0" and i.job_id is None


def test_rigdeck_variables_alone() -> None:
    i = info(rigdeck_env(node=1, local_rank=1, RIGDECK_GPUS="4,5",
                         RIGDECK_CHECKPOINT_OWNER="host:h2/gpu:5"), cuda_devices=2)
    assert (i.world_size, i.rank, i.local_rank, i.local_world_size) == (6, 3, 1, 2)
    assert (i.node_rank, i.num_nodes, i.hosts, i.current_host) == (1, 3, tuple(HOSTS), "h2")
    assert (i.master_addr, i.master_port) == (ADDRS[0], 29411)
    assert i.gpu == 5 and i.gpus == (4, 5) and i.device == "cuda:1"
    assert i.checkpoint_policy == "host:h2/gpu:5" and i.checkpoint_owner
    assert i.job_id == "job-42" and i.source == ("rigdeck",) and i.role == "workerpool1"


def test_torch_variables_alone() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
           "GROUP_RANK": "1", "MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "1234"}
    i = info(env)
    assert (i.world_size, i.rank, i.local_rank, i.local_world_size) == (4, 3, 1, 2)
    assert (i.node_rank, i.num_nodes) == (1, 2)
    assert (i.master_addr, i.master_port, i.source) == ("10.1.1.1", 1234, ("torch",))
    assert not i.checkpoint_owner  # rank0 policy, rank 3


def test_torch_world_without_node_info_is_one_node() -> None:
    i = info({"RANK": "1", "WORLD_SIZE": "2"})
    assert (i.local_rank, i.local_world_size, i.node_rank, i.num_nodes) == (1, 2, 0, 1)


def test_sagemaker_resourceconfig_alone(tmp_path: Path) -> None:
    base = sagemaker_tree(tmp_path / "ml", "h2")
    i = cluster_info({"SAGEMAKER_BASE_DIR": str(base)}, cuda_devices=0)
    assert (i.hosts, i.current_host, i.node_rank, i.num_nodes) == (tuple(HOSTS), "h2", 1, 3)
    assert (i.world_size, i.rank, i.local_world_size) == (3, 1, 1)
    assert i.master_addr == "h1"  # the hosts[0] convention
    assert i.source == ("SageMaker resourceconfig.json",)


def test_sagemaker_processing_job_config_path(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "resourceconfig.json").write_text(
        json.dumps({"current_host": "algo-2", "hosts": ["algo-1", "algo-2"]}))
    i = cluster_info({}, str(tmp_path), cuda_devices=0)
    assert (i.rank, i.world_size, i.master_addr) == (1, 2, "algo-1")


def test_sagemaker_sm_variables_alone(tmp_path: Path) -> None:
    i = info({"SM_HOSTS": json.dumps(["algo-1", "algo-2"]), "SM_CURRENT_HOST": "algo-2",
              "SM_NUM_GPUS": "0"}, tmp_path)
    assert (i.hosts, i.node_rank, i.rank, i.world_size) == (("algo-1", "algo-2"), 1, 1, 2)
    assert i.source == ("SageMaker SM_*",)


def test_vertex_cluster_spec_alone() -> None:
    i = info({"CLUSTER_SPEC": vertex_spec(2, ["host-a", "host-b", "host-c"])})
    assert (i.node_rank, i.num_nodes, i.current_host) == (2, 3, "host-c")  # 1 + index
    assert (i.master_addr, i.master_port) == ("host-a", 2222)  # workerpool0[0]
    assert i.role == "workerpool1" and i.source == ("Vertex CLUSTER_SPEC",)
    chief = info({"CLUSTER_SPEC": vertex_spec(0, ["host-a", "host-b"])})
    assert (chief.node_rank, chief.role, chief.rank) == (0, "workerpool0", 0)


def test_vertex_reduction_server_has_no_node_rank() -> None:
    spec = json.loads(vertex_spec(0, ["a", "b"]))
    spec["cluster"]["workerpool2"] = ["r:2222"]
    spec["task"] = {"type": "workerpool2", "index": 0}
    i = info({"CLUSTER_SPEC": json.dumps(spec)})
    assert i.role == "workerpool2" and i.num_nodes == 2 and i.node_rank == 0


def test_tf_config_alone() -> None:
    i = info({"TF_CONFIG": tf_config(1, ["c", "w0", "w1"])})
    assert (i.node_rank, i.num_nodes, i.role, i.current_host) == (1, 3, "worker", "w0")
    no_chief = json.dumps({"cluster": {"worker": ["w0:1", "w1:1"]},
                           "task": {"type": "worker", "index": 1}})
    assert info({"TF_CONFIG": no_chief}).node_rank == 1


def test_open_mpi_alone() -> None:
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
           "OMPI_COMM_WORLD_NODE_RANK": "1"}
    i = info(env)
    assert (i.world_size, i.rank, i.local_rank, i.local_world_size) == (4, 3, 1, 2)
    assert (i.node_rank, i.num_nodes, i.source) == (1, 2, ("Open MPI",))
    assert (i.master_addr, i.master_port) == ("127.0.0.1", 29500)
    assert info(env, default_master_port=4000).master_port == 4000


# -- cluster_info: combinations ------------------------------------------------------------


def test_every_source_agreeing(tmp_path: Path) -> None:
    """What the agent gives an mpirun rank: all views at once, hosts by address in Vertex's."""
    base = sagemaker_tree(tmp_path / "ml", "h2")
    env = rigdeck_env(node=1, local_rank=0)
    env.update({
        "RANK": "2", "WORLD_SIZE": "6", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "1", "MASTER_ADDR": ADDRS[0], "MASTER_PORT": "29411",
        "SAGEMAKER_BASE_DIR": str(base), "SM_HOSTS": json.dumps(HOSTS), "SM_CURRENT_HOST": "h2",
        "CLUSTER_SPEC": vertex_spec(1, port=29411), "TF_CONFIG": tf_config(1, port=29411),
        "OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "6",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    })
    i = cluster_info(env, cuda_devices=0)
    assert i.source == ("rigdeck", "torch", "SageMaker resourceconfig.json", "SageMaker SM_*",
                        "Vertex CLUSTER_SPEC", "TF_CONFIG", "Open MPI")
    assert (i.rank, i.world_size, i.node_rank, i.current_host) == (2, 6, 1, "h2")
    assert i.hosts == tuple(HOSTS)  # rigdeck's names win; Vertex's addresses agree with them


@pytest.mark.parametrize("extra, message", [
    ({"WORLD_SIZE": "4", "OMPI_COMM_WORLD_SIZE": "6"},
     "WORLD_SIZE=4 (torch) contradicts OMPI_COMM_WORLD_SIZE=6 (Open MPI)"),
    ({"RIGDECK_RANK": "1", "RANK": "2"}, "RIGDECK_RANK=1 (rigdeck) contradicts RANK=2 (torch)"),
    ({"RIGDECK_NODE_RANK": "0", "CLUSTER_SPEC": vertex_spec(2)},
     "RIGDECK_NODE_RANK=0 (rigdeck) contradicts CLUSTER_SPEC task=workerpool1:1=2 "
     "(Vertex CLUSTER_SPEC)"),
    ({"RIGDECK_HOSTS": json.dumps(HOSTS), "SM_HOSTS": json.dumps(["h1", "h2"])},
     'RIGDECK_HOSTS=["h1", "h2", "h3"] (rigdeck) contradicts SM_HOSTS=["h1", "h2"] '
     "(SageMaker SM_*)"),
    ({"MASTER_PORT": "1", "RIGDECK_MASTER_PORT": "2"},
     "RIGDECK_MASTER_PORT=2 (rigdeck) contradicts MASTER_PORT=1 (torch)"),
])
def test_contradicting_sources_name_both(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ClusterInfoError) as e:
        info(extra)
    assert str(e.value) == message


def test_sagemaker_file_contradicting_rigdeck(tmp_path: Path) -> None:
    base = sagemaker_tree(tmp_path / "ml", "h3")
    env = rigdeck_env(node=1, SAGEMAKER_BASE_DIR=str(base))
    with pytest.raises(ClusterInfoError, match=r"RIGDECK_CURRENT_HOST=h2 \(rigdeck\) contradicts "
                       r"resourceconfig.json current_host=h3 \(SageMaker resourceconfig.json\)"):
        cluster_info(env, cuda_devices=0)


def test_derived_values_do_not_contradict() -> None:
    # Vertex's TF port and SageMaker's hosts[0] master are conventions, not facts: the given
    # MASTER_ADDR/PORT win without an error.
    env = {"MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "5555",
           "CLUSTER_SPEC": vertex_spec(0, ["a", "b"]), "RANK": "0", "WORLD_SIZE": "2"}
    i = info(env)
    assert (i.master_addr, i.master_port) == ("10.0.0.9", 5555)


@pytest.mark.parametrize("env, match", [
    ({"RANK": "x"}, r"RANK='x' \(torch\): expected an integer"),
    ({"RANK": "4", "WORLD_SIZE": "4"}, r"RANK \(torch\) = 4 is outside 0..3"),
    ({"RIGDECK_HOSTS": "not json"}, r"RIGDECK_HOSTS \(rigdeck\) is not valid JSON"),
    ({"SM_HOSTS": '["a"]', "SM_CURRENT_HOST": "b"}, r"SM_CURRENT_HOST='b' is not in SM_HOSTS"),
    ({"RIGDECK_CHECKPOINT_OWNER": "rank1"}, r"checkpoint owner 'rank1': expected one of"),
    ({"RIGDECK_GPUS": "0,a"}, r"RIGDECK_GPUS='0,a' \(rigdeck\)"),
])
def test_unreadable_values_are_named(env: dict[str, str], match: str) -> None:
    with pytest.raises(ClusterInfoError, match=match):
        info(env)


def test_device_from_visible_gpus() -> None:
    assert info({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, cuda_devices=2).device == "cuda:1"
    # direct launch: one GPU visible per rank
    assert info({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, cuda_devices=1).device == "cuda:0"


@pytest.mark.parametrize("trial", [None, "3"], ids=["job", "trial"])
def test_agrees_with_the_cluster_files_the_agent_writes(tmp_path: Path, trial: str | None) -> None:
    """The contract from both ends: every view agent.clusterfiles writes for a host tells
    cluster_info one story, for direct, torchrun and mpirun ranks (docs/contracts.md plan), a
    sweep's trial (``task.trial`` in CLUSTER_SPEC and TF_CONFIG) too."""
    from agent import clusterfiles

    plan = {
        "job_id": "ddp-1", "name": "ddp", "launcher": "direct", "command": ["python3", "t.py"],
        "workdir": str(tmp_path), "env": {}, "hyperparameters": {"lr": 0.01},
        "checkpoint": {"dir": str(tmp_path / "ckpt"), "owner": "host:h3/gpu:1"},
        "restart_count": 0, "max_runtime_s": 600, "grace_s": 5, "mpi": {"custom_options": []},
        "loss_pattern": None, "master_addr": ADDRS[0], "master_port": 29511,
        "nodes": [{"host": h, "address": a, "slots": 2, "gpus": [0, 1], "cpus": 2,
                   "instance_type": "rigdeck.sim-gpu-4", "simulated": True}
                  for h, a in zip(HOSTS, ADDRS, strict=True)],
    }
    if trial is not None:
        plan.update(trial=trial, sweep_id="sweep-1")
    owners = []
    for node in range(3):
        env = clusterfiles.node_env(plan, node, str(tmp_path / f"job-{node}"), None)
        for local in range(2):
            direct = dict(env, **clusterfiles.rank_env(plan, node, local))
            rank = node * 2 + local
            torchrun = dict(env, RANK=str(rank), LOCAL_RANK=str(local), GROUP_RANK=str(node))
            mpirun = dict(env, OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_SIZE="6",
                          OMPI_COMM_WORLD_LOCAL_RANK=str(local), OMPI_COMM_WORLD_LOCAL_SIZE="2",
                          RIGDECK_RANK=str(rank), RIGDECK_LOCAL_RANK=str(local),
                          RANK=str(rank), LOCAL_RANK=str(local))
            for e in (direct, torchrun, mpirun):
                i = cluster_info(e, cuda_devices=0)
                assert (i.rank, i.world_size, i.local_rank, i.node_rank) == (rank, 6, local, node)
                assert (i.hosts, i.current_host) == (tuple(HOSTS), HOSTS[node])
                assert (i.master_addr, i.master_port, i.gpu) == (ADDRS[0], 29511, local)
                assert "SageMaker resourceconfig.json" in i.source
                assert "Vertex CLUSTER_SPEC" in i.source
            if i.checkpoint_owner:
                owners.append(rank)
    assert owners == [5]


# -- checkpoint ownership in cluster_info ----------------------------------------------------


@pytest.mark.parametrize("policy, owners", [
    ("rank0", {0}),
    ("per-node", {0, 2, 4}),
    ("all", {0, 1, 2, 3, 4, 5}),
    ("host:h2/gpu:1", {3}),  # no GPUs: I is the local rank
    ("host:h9/gpu:0", {0}),  # h9 not in this run: rank 0 takes over
])
def test_checkpoint_owner_per_policy(policy: str, owners: set[int]) -> None:
    got = set()
    for node in range(3):
        for local in range(2):
            i = info(rigdeck_env(node, local, RIGDECK_CHECKPOINT_OWNER=policy))
            if i.checkpoint_owner:
                got.add(i.rank)
    assert got == owners


def test_host_gpu_owner_uses_physical_gpu_index() -> None:
    owners = [info(rigdeck_env(1, local, RIGDECK_GPUS="6,7",
                               RIGDECK_CHECKPOINT_OWNER="host:h2/gpu:7")).checkpoint_owner
              for local in range(2)]
    assert owners == [False, True]
    with pytest.raises(ClusterInfoError, match=r"h2 runs this job on GPUs \[6, 7\]"):
        info(rigdeck_env(1, 0, RIGDECK_GPUS="6,7", RIGDECK_CHECKPOINT_OWNER="host:h2/gpu:0"))


# -- report ----------------------------------------------------------------------------------


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_report_appends_one_json_line_per_call(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    metrics.reset()
    monkeypatch.setenv("RIGDECK_METRICS_DIR", str(tmp_path / "m"))
    monkeypatch.setenv("RIGDECK_RANK", "3")
    try:
        metrics.report(step=1, loss=0.5, lr=1e-3)
        metrics.report(step=2, loss=torch.tensor(0.25), acc=torch.tensor(7), phase="train")
    finally:
        metrics.reset()
    raw = (tmp_path / "m" / "rank-3.jsonl").read_text()
    assert raw.endswith("\n") and raw.count("\n") == 2
    a, b = read_lines(tmp_path / "m" / "rank-3.jsonl")
    assert list(a) == ["time", "rank", "step", "loss", "lr"]
    assert (a["rank"], a["step"], a["loss"], a["lr"]) == (3, 1, 0.5, 1e-3)
    assert (b["loss"], b["acc"], b["phase"]) == (0.25, 7, "train")
    assert abs(a["time"] - time.time()) < 60


def test_step_reports_carry_step_time_and_the_timed_data_wait(tmp_path: Path) -> None:
    from runtime.timing import timed

    metrics._take_pending()  # nothing left over from another test
    r = Reporter(str(tmp_path), 0)

    def slow_loader():  # each item takes 0.05 s to come
        for i in range(3):
            time.sleep(0.05)
            yield i

    got = []
    for step, item in enumerate(timed(slow_loader())):
        got.append(item)
        time.sleep(0.02)  # the step's own work
        r.step(step, 0.1)
    r.step(2, None, val_loss=0.2)  # a second report of step 2: no timing of its own
    r.step(None, None, note="not a step")  # a line without a step takes nothing
    r.close()
    assert got == [0, 1, 2]
    lines = read_lines(tmp_path / "rank-0.jsonl")
    assert "step_time" not in lines[0]  # no previous step to measure from
    for line in lines[:3]:
        assert 0.045 <= line["data_time"] < 0.5, line
    for line in lines[1:3]:
        assert 0.065 <= line["step_time"] < 1.0 and line["step_time"] > line["data_time"], line
    assert set(lines[3]) == {"time", "rank", "step", "val_loss"}
    assert set(lines[4]) == {"time", "rank", "note"}


def test_a_value_passed_to_report_wins_over_the_measured_one(tmp_path: Path) -> None:
    metrics._take_pending()
    metrics.add_time("data_time", 5.0)
    r = Reporter(str(tmp_path), 0)
    r.step(1, 0.1, data_time=0.25)
    r.close()
    (line,) = read_lines(tmp_path / "rank-0.jsonl")
    assert line["data_time"] == 0.25


def test_comm_timer_times_ddp_allreduce_on_gloo(tmp_path: Path) -> None:
    """Two gloo ranks on CPU: the hook does DDP's all-reduce (gradients averaged, as without
    it) and the time in flight reaches the step report as comm_time."""
    code = textwrap.dedent("""
        import os, sys, json
        import torch, torch.distributed as dist
        from runtime.metrics import Reporter
        from runtime.timing import comm_timer
        rank = int(sys.argv[1])
        dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
        timer = comm_timer(model)
        rep = Reporter(sys.argv[3], rank)
        for step in range(3):
            model(torch.full((4, 256), float(rank + 1))).sum().backward()
            rep.step(step, 0.0)
        w = model.module.weight.grad
        print(json.dumps({"grad": float(w[0, 0]), "total": timer.total}))
        dist.barrier(); dist.destroy_process_group()
        sys.stdout.flush(); os._exit(0)
    """)
    metrics_dir = tmp_path / "m"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(rank), str(tmp_path / "store"), str(metrics_dir)],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True) for rank in range(2)]
    outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    # Grads accumulate over 3 steps; inputs 1 and 2 on the two ranks average to 1.5 a step.
    assert outs[0]["grad"] == pytest.approx(3 * 4 * 1.5) and outs[1]["grad"] == pytest.approx(3 * 4 * 1.5)
    for rank in range(2):
        lines = read_lines(metrics_dir / f"rank-{rank}.jsonl")
        assert all(line["comm_time"] > 0 for line in lines), lines
        assert sum(line["comm_time"] for line in lines) == pytest.approx(outs[rank]["total"], abs=1e-5)


def test_report_is_a_noop_without_metrics_dir(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    metrics.reset()
    monkeypatch.delenv("RIGDECK_METRICS_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    try:
        metrics.report(step=1, loss=object())  # not even looked at
        assert metrics.reporter().path is None
    finally:
        metrics.reset()
    assert list(tmp_path.iterdir()) == []


def test_report_rejects_reserved_keys_and_non_scalars(tmp_path: Path) -> None:
    r = Reporter(str(tmp_path), 0)
    with pytest.raises(ValueError, match="rank"):
        r.step(1, 0.1, rank=2)
    with pytest.raises(TypeError, match="not a number"):
        r.step(1, object())
    r.close()


def test_report_lines_from_concurrent_processes_stay_whole(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import sys
        from runtime.metrics import Reporter
        r = Reporter(sys.argv[1], 0)
        for i in range(2000):
            r.step(i, 0.5, pad="x" * 200, who=sys.argv[2])
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), str(w)], cwd=ROOT)
             for w in range(3)]
    assert all(p.wait(60) == 0 for p in procs)
    lines = read_lines(tmp_path / "rank-0.jsonl")
    assert len(lines) == 6000
    assert {w: sum(1 for x in lines if x["who"] == w) for w in "012"} == \
        {"0": 2000, "1": 2000, "2": 2000}


# -- Checkpointer ----------------------------------------------------------------------------


def ckpt_env(tmp_path: Path, node: int = 0, local_rank: int = 0, **extra: str) -> dict[str, str]:
    env = rigdeck_env(node, local_rank, RIGDECK_METRICS_DIR=str(tmp_path / "metrics"),
                      SAGEMAKER_BASE_DIR=str(tmp_path / "no-sm"))
    env.update(extra)
    return env


def rank_lines(tmp_path: Path, rank: int, sections: bool = False) -> list[dict[str, Any]]:
    """A rank's metrics lines; the ``section`` events every rank writes around a save only with
    ``sections``."""
    path = tmp_path / "metrics" / f"rank-{rank}.jsonl"
    lines = read_lines(path) if path.exists() else []
    return lines if sections else [x for x in lines if x.get("event") != "section"]


def test_rank0_saves_loads_and_reports(tmp_path: Path) -> None:
    import torch

    d = tmp_path / "ckpt"
    c = Checkpointer(str(d), environ=ckpt_env(tmp_path))
    assert c.is_owner and c.load_latest() is None
    path = c.save(7, {"w": torch.arange(4.0), "step": 7})
    assert path == str(d / "step-00000007.pt")
    assert (d / "latest").read_text() == "step-00000007\n"
    manifest = json.loads((d / "step-00000007.manifest.json").read_text())
    assert manifest["step"] == 7 and manifest["bytes"] == (d / "step-00000007.pt").stat().st_size
    assert manifest["owner"] == {"rank": 0, "host": "h1", "gpu": 0}
    import hashlib

    assert manifest["sha256"] == hashlib.sha256((d / "step-00000007.pt").read_bytes()).hexdigest()
    step, state = c.load_latest()
    assert step == 7 and torch.equal(state["w"], torch.arange(4.0))
    begin, writing, done, end = rank_lines(tmp_path, 0, sections=True)
    # the save is a checkpoint section (the hang rule judges it against saves, not steps)
    assert (begin["event"], begin["section"], begin["phase"]) == ("section", "checkpoint", "begin")
    assert (end["event"], end["section"], end["phase"]) == ("section", "checkpoint", "end")
    assert end["seconds"] >= done["seconds"]
    assert (writing["event"], writing["status"], writing["step"]) == ("checkpoint", "writing", 7)
    assert (done["status"], done["bytes"], done["error"]) == ("done", manifest["bytes"], None)
    assert done["seconds"] >= 0 and done["path"] == path and done["owner"]["host"] == "h1"
    assert not list(d.glob(".*tmp*"))


def test_non_owners_never_write(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    c = Checkpointer(str(d), environ=ckpt_env(tmp_path, node=1, local_rank=1))
    assert not c.is_owner
    assert c.save(1, {"x": 1}) is None
    # it writes nothing but the section it spent waiting for the owner's save
    lines = rank_lines(tmp_path, 3, sections=True)
    assert not d.exists() and [(x["event"], x["section"], x["phase"]) for x in lines] == [
        ("section", "checkpoint", "begin"), ("section", "checkpoint", "end")]


def test_a_section_is_marked_as_it_begins_and_ends_even_when_it_fails(tmp_path: Path) -> None:
    import runtime
    from runtime.metrics import Reporter

    rep = Reporter(str(tmp_path / "metrics"), 2)
    with rep.section("eval"):
        rep.step(5, loss=1.0)
    with pytest.raises(ZeroDivisionError), rep.section("eval"):
        raise ZeroDivisionError
    lines = rank_lines(tmp_path, 2, sections=True)
    assert [(x.get("event"), x.get("phase")) for x in lines] == [
        ("section", "begin"), (None, None), ("section", "end"), ("section", "begin"), ("section", "end")]
    assert all(x["section"] == "eval" and x["seconds"] >= 0 for x in lines if x.get("phase") == "end")
    with Reporter(None, 0).section("eval"):  # no metrics directory: nothing, no error
        pass
    assert runtime.section is runtime.metrics.section


def test_keeps_the_last_n(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    c = Checkpointer(str(d), keep=2, environ=ckpt_env(tmp_path))
    for step in range(5):
        c.save(step, {"step": step})
    assert sorted(p.name for p in d.iterdir()) == [
        "latest", "step-00000003.manifest.json", "step-00000003.pt",
        "step-00000004.manifest.json", "step-00000004.pt"]
    assert c.load_latest()[0] == 4


def test_resaving_a_step_replaces_it(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    c = Checkpointer(str(d), environ=ckpt_env(tmp_path))
    c.save(1, {"v": 1})
    c.save(2, {"v": 2})
    c.save(2, {"v": 22})
    assert c.load_latest() == (2, {"v": 22})
    assert (d / "latest").read_text().strip() == "step-00000002"


def test_host_gpu_policy_owner(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    envs = {(n, lr): ckpt_env(tmp_path, n, lr, RIGDECK_GPUS="2,3") for n in range(3)
            for lr in range(2)}
    cks = {k: Checkpointer(str(d), "host:h3/gpu:3", environ=e) for k, e in envs.items()}
    assert [k for k, c in cks.items() if c.is_owner] == [(2, 1)]
    for c in cks.values():
        c.save(5, {"x": 5})
    manifest = json.loads((d / "step-00000005.manifest.json").read_text())
    assert manifest["owner"] == {"rank": 5, "host": "h3", "gpu": 3}
    assert manifest["policy"] == "host:h3/gpu:3"
    assert [x["status"] for x in rank_lines(tmp_path, 5)] == ["writing", "done"]
    assert all(rank_lines(tmp_path, r) == [] for r in range(5))


def test_ownership_moves_when_the_named_host_is_gone(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    # Restart on h1, h2, h3 of a job whose checkpoints belonged to h4.
    c0 = Checkpointer(str(d), "host:h4/gpu:0", environ=ckpt_env(tmp_path, 0, 0))
    c1 = Checkpointer(str(d), "host:h4/gpu:0", environ=ckpt_env(tmp_path, 0, 1))
    Checkpointer(str(d), "host:h4/gpu:0", environ=ckpt_env(tmp_path, 0, 0))  # same process again
    assert c0.is_owner and not c1.is_owner
    c0.save(1, {"a": 1})
    c0.save(2, {"a": 2})
    moves = [x for x in rank_lines(tmp_path, 0) if x.get("event") == "checkpoint_owner"]
    assert len(moves) == 1
    move = moves[0]
    assert move["policy"] == "host:h4/gpu:0"
    assert move["from"] == {"host": "h4", "gpu": 0}
    assert move["to"] == {"rank": 0, "host": "h1", "gpu": 0}
    assert move["reason"] == "host h4 not in this run"
    assert rank_lines(tmp_path, 1) == []
    assert json.loads((d / "step-00000002.manifest.json").read_text())["owner"]["host"] == "h1"


def test_per_node_writes_a_copy_per_host(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    for node in range(3):
        for local in range(2):
            c = Checkpointer(str(d), "per-node", environ=ckpt_env(tmp_path, node, local))
            assert c.is_owner == (local == 0)
            c.save(3, {"node": node})
    assert sorted(p.name for p in d.iterdir()) == HOSTS
    for node, host in enumerate(HOSTS):
        assert (d / host / "latest").read_text().strip() == "step-00000003"
        c = Checkpointer(str(d), "per-node", environ=ckpt_env(tmp_path, node, 1))
        assert c.load_latest(broadcast=False) == (3, {"node": node})  # a non-owner reads its copy


def test_all_policy_through_dcp(tmp_path: Path) -> None:
    import torch

    d = tmp_path / "ckpt"
    env = ckpt_env(tmp_path, RIGDECK_NUM_NODES="1", RIGDECK_HOSTS='["h1"]',
                   RIGDECK_HOST_ADDRS='["10.9.0.1"]', RIGDECK_WORLD_SIZE="1",
                   RIGDECK_LOCAL_WORLD_SIZE="1")
    c = Checkpointer(str(d), "all", environ=env)
    c.save(4, {"w": torch.ones(3) * 4, "n": 4})
    assert (d / "step-00000004" / "rank-0" / ".metadata").exists()
    manifest = json.loads((d / "step-00000004.manifest.json").read_text())
    assert manifest["bytes"] == manifest["parts"]["0"]["bytes"] > 0
    target = {"w": torch.zeros(3), "n": 0}
    step, state = c.load_latest(state=target)
    assert step == 4 and torch.equal(target["w"], torch.ones(3) * 4)
    assert [x["status"] for x in rank_lines(tmp_path, 0)] == ["writing", "done"]


def test_failed_save_reports_and_raises(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    c = Checkpointer(str(d), environ=ckpt_env(tmp_path))
    c.save(1, {"ok": 1})
    with pytest.raises(CheckpointError, match="step-00000002"):
        c.save(2, {"bad": lambda: None})  # cannot be pickled
    failed = rank_lines(tmp_path, 0)[-1]
    assert failed["status"] == "failed" and failed["step"] == 2 and "pickle" in failed["error"]
    assert (d / "latest").read_text().strip() == "step-00000001"
    assert c.load_latest() == (1, {"ok": 1})
    c.save(3, {"ok": 3})
    assert not list(d.glob(".*tmp*"))  # the failed save's temporary file is gone


def test_corrupt_checkpoint_falls_back_to_the_previous(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "ckpt"
    c = Checkpointer(str(d), environ=ckpt_env(tmp_path))
    c.save(1, {"v": 1})
    c.save(2, {"v": 2})
    data = bytearray((d / "step-00000002.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (d / "step-00000002.pt").write_bytes(bytes(data))
    assert c.load_latest() == (1, {"v": 1})
    assert "sha256" in capsys.readouterr().err


def test_incomplete_checkpoints_are_ignored(tmp_path: Path) -> None:
    d = tmp_path / "ckpt"
    c = Checkpointer(str(d), environ=ckpt_env(tmp_path))
    c.save(1, {"v": 1})
    (d / "step-00000009.pt").write_bytes(b"no manifest: a save that died")
    assert c.load_latest() == (1, {"v": 1})


KILL_CHILD = textwrap.dedent("""
    import os, sys, time
    import torch
    import runtime.checkpoint as ck

    directory, stage, ready = sys.argv[1:4]
    c = ck.Checkpointer(directory, environ={"SAGEMAKER_BASE_DIR": "/nonexistent"})
    c.save(1, {"x": torch.ones(1000), "step": 1})

    def hold(name):
        if name == stage:
            open(ready, "w").close()
            time.sleep(120)

    ck._stage = hold
    c.save(2, {"x": torch.ones(2_000_000), "step": 2})
""")


def test_save_killed_at_any_stage_leaves_latest_on_a_complete_checkpoint(tmp_path: Path) -> None:
    stages = ["data-written", "data-renamed", "manifest-written", "writing"]
    procs = {}
    for stage in stages:
        (tmp_path / stage).mkdir()
        args = [str(tmp_path / stage / "ckpt"), stage, str(tmp_path / stage / "ready")]
        if stage == "writing":  # no hook: killed whenever the big write happens to be
            args[1] = "never"
        procs[stage] = subprocess.Popen([sys.executable, "-c", KILL_CHILD, *args], cwd=ROOT)
    deadline = time.time() + 90
    for stage, p in procs.items():
        if stage == "writing":
            continue
        while not (tmp_path / stage / "ready").exists():
            assert p.poll() is None, f"child for {stage} exited with {p.returncode}"
            assert time.time() < deadline, stage
            time.sleep(0.05)
        p.send_signal(signal.SIGKILL)
        p.wait()
    p = procs["writing"]
    d = tmp_path / "writing" / "ckpt"
    # Step 1 saved whole (its manifest is written before `latest` moves to it): the kill lands
    # in step 2's big write, or wherever it happens to be after that.
    while not (d / "latest").exists() and p.poll() is None:
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait()

    for stage in stages:
        d = tmp_path / stage / "ckpt"
        latest = (d / "latest").read_text().strip()
        c = Checkpointer(str(d), environ={"SAGEMAKER_BASE_DIR": "/nonexistent"})
        assert latest in {name for _s, name, _m in c.complete()}, stage
        step, state = c.load_latest()
        assert state["step"] == step
        if stage in ("data-written", "data-renamed"):
            assert latest == "step-00000001" and step == 1, stage
        if stage == "manifest-written":
            # Complete (manifest on disk) though `latest` had not moved yet: the newest
            # complete checkpoint is the one to resume from.
            assert latest == "step-00000001" and step == 2
        # The next save clears what the killed one left behind.
        c.save(3, {"step": 3})
        assert not list(d.glob(".*tmp*")), stage
        assert c.load_latest()[0] == 3


MULTI_RANK = textwrap.dedent("""
    import json, os, sys
    import torch, torch.distributed as dist
    import runtime
    from runtime.checkpoint import Checkpointer

    info = runtime.init_distributed()
    out = sys.argv[1]
    # 'all': every rank writes its part through dcp; rank 0 publishes.
    c = Checkpointer(os.path.join(out, "all"), "all", keep=2)
    for step in (5, 6, 7):
        c.save(step, {"mine": torch.full((4,), float(info.rank * 10 + step)), "step": step})
    target = {"mine": torch.zeros(4), "step": 0}
    step, state = c.load_latest(state=target)
    assert step == 7 and target["mine"].tolist() == [float(info.rank * 10 + 7)] * 4, target
    assert state["step"] == 7
    assert not os.path.exists(os.path.join(out, "all", "step-00000005", f"rank-{info.rank}"))
    if info.rank == 1:  # damage rank 1's part of step 7: every rank falls back to step 6
        part = os.path.join(out, "all", "step-00000007", "rank-1")
        data = [f for f in os.listdir(part) if f.endswith(".distcp")][0]
        with open(os.path.join(part, data), "ab") as f:
            f.write(b"junk")
    step, state = c.load_latest(state=target)
    assert step == 6 and target["mine"].tolist() == [float(info.rank * 10 + 6)] * 4, target
    # rank0 with each rank's own directory: rank 1 has nothing on disk and gets rank 0's copy.
    r0 = Checkpointer(os.path.join(out, f"rank0-{info.rank}"), "rank0")
    r0.save(9, {"w": torch.arange(3.0)})
    step, state = r0.load_latest()
    assert step == 9 and state["w"].tolist() == [0.0, 1.0, 2.0]
    assert not os.path.exists(os.path.join(out, "rank0-1"))
    print(f"rank {info.rank} ok", flush=True)
    runtime.shutdown_distributed()
    assert not dist.is_initialized()
""")


def test_multi_rank_dcp_and_broadcast_restore(tmp_path: Path) -> None:
    script = tmp_path / "multi.py"
    script.write_text(MULTI_RANK)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RIGDECK_", "SM_"))}
    env.update(OMP_NUM_THREADS="1", RIGDECK_METRICS_DIR=str(tmp_path / "metrics"),
               PYTHONPATH=str(ROOT))
    torchrun = Path(sys.executable).with_name("torchrun")
    r = subprocess.run([str(torchrun), "--standalone", "--nproc-per-node", "2", str(script),
                        str(tmp_path / "out")], env=env, cwd=tmp_path, capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "rank 0 ok" in r.stdout and "rank 1 ok" in r.stdout
    root = tmp_path / "out" / "all"
    assert sorted(p.name for p in root.iterdir()) == [
        "latest", "step-00000006", "step-00000006.manifest.json", "step-00000007",
        "step-00000007.manifest.json"]
    manifest = json.loads((root / "step-00000006.manifest.json").read_text())
    assert sorted(manifest["parts"]) == ["0", "1"]
    for rank in (0, 1):
        part = root / "step-00000006" / f"rank-{rank}"
        assert (part / ".metadata").exists()
        assert manifest["parts"][str(rank)]["bytes"] == sum(
            f.stat().st_size for f in part.rglob("*") if f.is_file())
        done = [x for x in rank_lines(tmp_path, rank) if x.get("status") == "done"]
        assert [x["step"] for x in done[:3]] == [5, 6, 7] and done[0]["bytes"] > 0
        assert done[1]["path"] == str(part)


# -- shard -----------------------------------------------------------------------------------

names = st.lists(st.text(alphabet="abcdefgh/._-0123456789", min_size=1, max_size=12),
                 max_size=60)


@settings(max_examples=150, deadline=None)
@given(items=names, world=st.integers(1, 9), seed=st.one_of(st.none(), st.integers(0, 2**32)))
def test_shard_is_a_balanced_partition(items: list[str], world: int, seed: int | None) -> None:
    shards = [shard(items, r, world, seed=seed) for r in range(world)]
    assert sorted(x for s in shards for x in s) == sorted(items)  # each item exactly once
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1


@settings(max_examples=100, deadline=None)
@given(items=names, world=st.integers(1, 5), seed=st.one_of(st.none(), st.integers(0, 99)),
       order=st.randoms(use_true_random=False))
def test_shard_is_deterministic_whatever_the_listing_order(items: list[str], world: int,
                                                           seed: int | None, order: Any) -> None:
    shuffled = list(items)
    order.shuffle(shuffled)
    for r in range(world):
        assert shard(items, r, world, seed=seed) == shard(shuffled, r, world, seed=seed)


def test_shard_seed_changes_the_deal_and_defaults_come_from_cluster_info(
        monkeypatch: pytest.MonkeyPatch) -> None:
    files = [f"part-{i:03d}" for i in range(40)]
    assert shard(files, 0, 4) == files[0::4]
    assert shard(files, 0, 4, seed=1) != shard(files, 0, 4)
    for k in [k for k in os.environ if k.startswith(("RIGDECK_", "OMPI_", "SM_"))] + [
            "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "CLUSTER_SPEC", "TF_CONFIG"]:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", "/nonexistent")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert shard(files) == files[3::4]
    assert shard(files, by="node") == files[1::2]  # node 1 of 2
    with pytest.raises(ValueError, match="outside"):
        shard(files, 4, 4)


# -- scaled_lr -------------------------------------------------------------------------------


def test_scaled_lr_linear_rule_with_warmup() -> None:
    # k = 8: target 0.8; warmup over 10 steps from 0.1
    assert scaled_lr(0.1, 32, 256, 0, 10) == pytest.approx(0.1)
    assert scaled_lr(0.1, 32, 256, 5, 10) == pytest.approx(0.45)
    assert scaled_lr(0.1, 32, 256, 10, 10) == pytest.approx(0.8)
    assert scaled_lr(0.1, 32, 256, 1000, 10) == pytest.approx(0.8)
    assert scaled_lr(0.1, 32, 256, 0, 0) == pytest.approx(0.8)
    assert scaled_lr(0.1, 32, 32, 3, 10) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        scaled_lr(0.1, 0, 32, 0)


def test_import_runtime_is_cheap_and_stdlib_only() -> None:
    code = ("import sys, runtime; runtime.cluster_info; runtime.report; runtime.Checkpointer;"
            "runtime.shard; runtime.scaled_lr; runtime.timed; runtime.comm_timer;"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'agent', 'tui')];"
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_runtime_compiles_on_python_39() -> None:
    py39 = python39()
    require(py39, PY39_MISSING)
    assert py39
    files = [str(p) for p in (ROOT / "runtime").glob("*.py")]
    code = "import ast, sys\nfor f in sys.argv[1:]: ast.parse(open(f).read(), f)\n"
    subprocess.run([py39, "-c", code, *files], check=True)
    code = "import runtime; runtime.cluster_info({}); runtime.shard([1], 0, 1)"
    subprocess.run([py39, "-c", code], check=True, cwd=ROOT)


def test_after_a_nan_restart_the_checkpointer_resumes_from_before_the_first_bad_step(tmp_path: Path) -> None:
    import torch

    d = tmp_path / "ckpt"
    c = Checkpointer(str(d), environ=ckpt_env(tmp_path))
    for step in (4, 8, 12):
        c.save(step, {"w": torch.tensor([float(step)])})
    assert c.load_latest()[0] == 12
    again = Checkpointer(str(d), environ=ckpt_env(tmp_path, RIGDECK_RESUME_BEFORE_STEP="12"))
    step, state = again.load_latest()
    assert step == 8 and state["w"].item() == 8.0  # the one saved at 12 came after the loss went bad
    assert Checkpointer(str(d), environ=ckpt_env(tmp_path, RIGDECK_RESUME_BEFORE_STEP="4")).load_latest() is None


def test_a_rank_hanging_in_its_teardown_ends_saying_where() -> None:
    """The teardown watchdog (``runtime.distributed._watchdog``, armed around the group's end
    and in ``exit_process``): a rank stuck past it writes every thread's stack to its stderr
    and exits 1 instead of hanging; disarmed, nothing happens."""
    code = textwrap.dedent("""
        import time
        from runtime.distributed import _watchdog
        _watchdog(5.0)
        _watchdog(None)  # disarmed: this sleep ends normally
        time.sleep(0.3)
        _watchdog(0.5)
        def stuck_in_teardown():
            time.sleep(30)
        stuck_in_teardown()
    """)
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         timeout=60)
    assert res.returncode == 1 and time.monotonic() - t0 < 20
    assert "stuck_in_teardown" in res.stderr, res.stderr


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_finish_waits_for_every_rank_then_ends_the_rank_with_nothing_torn_down(tmp_path: Path) -> None:
    """``runtime.finish()``, the end of the examples' ranks: two real gloo ranks (a TCP store);
    the fast one leaves only once the slow one arrived, each with its unflushed output out and
    exit 0, and nothing of the function that called it is freed on the way (an object whose
    ``__del__`` would say so stays silent); ``finish(3)`` with no group exits 3."""
    code = textwrap.dedent("""
        import datetime, os, sys, time
        import runtime
        rank = int(sys.argv[1])
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=60))
        class Model:
            def __del__(self):
                print("torn down", flush=True)
        def main():
            model = Model()
            if rank == 1:
                time.sleep(2.0)  # a peer still writing its checkpoint
            print(f"rank {rank} arrives at {time.time():.3f}")  # not flushed: finish() does
            runtime.finish()
            print("after finish")
        main()
        print("after main")
    """)
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
           "PYTHONPATH": str(ROOT)}
    ranks = [subprocess.Popen([sys.executable, "-c", code, str(r)], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    ranks[0].wait(timeout=120)  # (a few short lines: no pipe fills)
    fast_left = time.time()
    outs = [p.communicate(timeout=120) for p in ranks]
    for p, (out, err) in zip(ranks, outs, strict=True):
        assert p.returncode == 0, err
        assert out.startswith("rank ") and "torn down" not in out and "after" not in out, out
    arrived = [float(out.split()[-1]) for out, _ in outs]
    assert arrived[1] - arrived[0] > 1.5  # rank 0 came first ...
    assert fast_left >= arrived[1]  # ... and left only once rank 1 was there too

    alone = subprocess.run([sys.executable, "-c", "import runtime\nprint('bye')\nruntime.finish(3)"],
                           capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert alone.returncode == 3 and alone.stdout == "bye\n", alone
