"""Cluster files (agent/clusterfiles.py, the job kinds in agent/kinds/): every view of the one ordered
host list agrees.

Unit tests on temporary job directories, then tests/probe_rank.py run for real inside ranks
started by torchrun and by Open MPI's mpirun, on this machine (127.0.0.1).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agent import clusterfiles as cf
from tests._require import (
    MPIRUN_MISSING,
    PY39_MISSING,
    TORCH_MISSING,
    has_module,
    python39,
    require,
)
from tests.kit import communicate_all

ROOT = Path(__file__).resolve().parent.parent
PROBE = ROOT / "tests" / "probe_rank.py"

# Names deliberately not in sorted order: the placement's order is the rank order everywhere.
HOSTS = ["gpu-c", "gpu-a", "gpu-b"]
ADDRS = ["10.213.1.13", "10.213.1.11", "10.213.1.12"]
GPUS = [[0, 1], [2, 3], [3, 1]]


def make_plan(n_nodes: int = 3, slots: int = 2, gpus: bool = True, **extra: Any) -> dict[str, Any]:
    nodes = []
    for i in range(n_nodes):
        nodes.append({
            "host": HOSTS[i], "address": ADDRS[i], "slots": slots,
            "gpus": list(GPUS[i][:slots]) if gpus else [], "cpus": 4 + i,
            "instance_type": "rigdeck.sim-gpu-4" if gpus else "rigdeck.cpu-4",
            "simulated": gpus,
        })
    plan: dict[str, Any] = {
        "job_id": "ddp-1121-055012-ab12", "name": "ddp", "launcher": "torchrun",
        "command": ["/usr/bin/python3", "train.py", "--steps", "300"],
        "workdir": "/abs/path/on/hosts",
        "env": {"OMP_NUM_THREADS": "1"},
        "hyperparameters": {"lr": 0.01, "epochs": 3, "name": "resnet", "layers": [64, 128],
                            "amp": True, "opt": {"beta": 0.9}, "sagemaker_program": "train.py"},
        "checkpoint": {"dir": None, "owner": "rank0"},
        "restart_count": 0, "max_runtime_s": 86400, "grace_s": 30,
        "mpi": {"custom_options": []}, "loss_pattern": None,
        "nodes": nodes, "master_addr": ADDRS[0], "master_port": 29511,
    }
    plan.update(extra)
    return plan


def write_node(tmp_path: Path, plan: dict[str, Any], i: int,
               iface: str | None = "eth0") -> tuple[dict[str, str], Path]:
    job_dir = tmp_path / f"node{i}" / "job"
    return cf.node_env(plan, i, str(job_dir), iface), job_dir


def read(path: Path) -> Any:
    return json.loads(path.read_text())


# -- placement ------------------------------------------------------------------------------------


def test_global_ranks_follow_the_slots_of_the_nodes_before() -> None:
    plan = make_plan()
    assert [cf.global_ranks(plan, i) for i in range(3)] == [[0, 1], [2, 3], [4, 5]]
    uneven = make_plan()
    for n, s in zip(uneven["nodes"], (3, 1, 2), strict=True):
        n["slots"] = s
    assert [cf.global_ranks(uneven, i) for i in range(3)] == [[0, 1, 2], [3], [4, 5]]
    with pytest.raises(ValueError):
        cf.global_ranks(plan, 3)


# -- every view agrees with the placement ----------------------------------------------------------


@pytest.mark.parametrize("gpus", [True, False], ids=["gpus", "cpu-only"])
@pytest.mark.parametrize("i", [0, 1, 2])
def test_every_view_agrees_with_the_placement(tmp_path: Path, gpus: bool, i: int) -> None:
    plan = make_plan(gpus=gpus)
    env, job_dir = write_node(tmp_path, plan, i)
    base = job_dir / "sagemaker"
    rc = read(base / "input" / "config" / "resourceconfig.json")
    # host list, in rank order, everywhere
    assert json.loads(env["RIGDECK_HOSTS"]) == HOSTS
    assert json.loads(env["SM_HOSTS"]) == HOSTS
    assert rc["hosts"] == HOSTS
    assert rc["instance_groups"][0]["hosts"] == HOSTS
    assert json.loads(env["SM_RESOURCE_CONFIG"]) == rc
    assert json.loads(env["SM_TRAINING_ENV"])["hosts"] == HOSTS
    assert json.loads(env["RIGDECK_HOST_ADDRS"]) == ADDRS
    # this host
    for cur in (env["RIGDECK_CURRENT_HOST"], env["SM_CURRENT_HOST"], rc["current_host"],
                json.loads(env["SM_TRAINING_ENV"])["current_host"]):
        assert cur == HOSTS[i]
    assert env["RIGDECK_NODE_RANK"] == env["NODE_RANK"] == str(i)
    assert env["RIGDECK_NUM_NODES"] == "3"
    # Vertex: workerpool0 = the primary, node rank = 0 for workerpool0 else 1 + index
    spec = json.loads(env["CLUSTER_SPEC"])
    eps = [f"{a}:29511" for a in ADDRS]
    assert spec["cluster"] == {"workerpool0": eps[:1], "workerpool1": eps[1:],
                               "workerpool2": [], "workerpool3": []}
    assert spec["environment"] == "cloud"
    task = spec["task"]
    assert (0 if task["type"] == "workerpool0" else 1 + task["index"]) == i
    assert task == ({"type": "workerpool0", "index": 0} if i == 0
                    else {"type": "workerpool1", "index": i - 1})
    assert spec["job"]["job_id"] == plan["job_id"]
    tf = json.loads(env["TF_CONFIG"])
    assert tf["cluster"] == {"chief": eps[:1], "worker": eps[1:]}
    assert tf["task"] == ({"type": "chief", "index": 0} if i == 0
                          else {"type": "worker", "index": i - 1})
    assert tf["environment"] == "cloud"
    # torch
    assert env["MASTER_ADDR"] == env["RIGDECK_MASTER_ADDR"] == ADDRS[0]
    assert env["MASTER_PORT"] == env["RIGDECK_MASTER_PORT"] == "29511"
    assert env["WORLD_SIZE"] == env["RIGDECK_WORLD_SIZE"] == "6"
    assert env["LOCAL_WORLD_SIZE"] == env["RIGDECK_LOCAL_WORLD_SIZE"] == "2"
    for per_rank in ("RANK", "LOCAL_RANK", "RIGDECK_RANK", "RIGDECK_LOCAL_RANK", "GROUP_RANK"):
        assert per_rank not in env
    # GPUs and CPUs
    node_gpus = GPUS[i] if gpus else []
    assert env["RIGDECK_GPUS"] == ",".join(map(str, node_gpus))
    assert env["SM_NUM_GPUS"] == str(len(node_gpus))
    assert json.loads(env["SM_TRAINING_ENV"])["num_gpus"] == len(node_gpus)
    if gpus:
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, node_gpus))
    else:
        assert "CUDA_VISIBLE_DEVICES" not in env
    assert env["SM_NUM_CPUS"] == str(4 + i)
    assert env["SM_CURRENT_INSTANCE_TYPE"] == rc["current_instance_type"] == plan["nodes"][i][
        "instance_type"]
    # MPI hostfile and interfaces
    assert Path(env["RIGDECK_HOSTFILE"]) == job_dir / "hostfile"
    assert (job_dir / "hostfile").read_text() == "".join(f"{a} slots=2\n" for a in ADDRS)
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["SM_NETWORK_INTERFACE_NAME"] == rc["network_interface_name"] == "eth0"


def test_rigdeck_variables_are_all_there(tmp_path: Path) -> None:
    plan = make_plan()
    env, job_dir = write_node(tmp_path, plan, 1)
    assert env["RIGDECK_JOB_ID"] == plan["job_id"]
    assert env["RIGDECK_JOB_NAME"] == "ddp"
    assert env["RIGDECK_JOB_DIR"] == str(job_dir)
    assert env["RIGDECK_METRICS_DIR"] == str(job_dir / "metrics")
    assert (job_dir / "metrics").is_dir()
    assert env["RIGDECK_CHECKPOINT_OWNER"] == "rank0"
    assert env["RIGDECK_RESTART_COUNT"] == "0"
    assert env["RIGDECK_LAUNCHER"] == "torchrun"
    assert env["RIGDECK_CHECKPOINT_DIR"] == str(job_dir / "sagemaker" / "checkpoints")
    assert env["AIP_CHECKPOINT_DIR"] == env["RIGDECK_CHECKPOINT_DIR"]
    assert env["AIP_MODEL_DIR"] == env["SM_MODEL_DIR"] == str(job_dir / "sagemaker" / "model")
    assert env["AIP_TENSORBOARD_LOG_DIR"] == str(job_dir / "tensorboard")
    assert env["SAGEMAKER_BASE_DIR"] == str(job_dir / "sagemaker")


def test_sagemaker_tree_and_variables(tmp_path: Path) -> None:
    plan = make_plan()
    env, job_dir = write_node(tmp_path, plan, 0)
    base = job_dir / "sagemaker"
    config = base / "input" / "config"
    assert sorted(p.name for p in config.iterdir()) == [
        "hyperparameters.json", "inputdataconfig.json", "resourceconfig.json"]  # no temp files left
    for d in ("model", "output", "output/data", "output/intermediate", "checkpoints", "input/data"):
        assert (base / d).is_dir(), d
    rc = read(config / "resourceconfig.json")
    assert set(rc) == {"current_host", "hosts", "current_group_name", "current_instance_type",
                       "instance_groups", "network_interface_name"}
    assert rc["current_group_name"] == "homogeneousCluster"
    assert rc["instance_groups"] == [{"instance_group_name": "homogeneousCluster",
                                      "instance_type": "rigdeck.sim-gpu-4", "hosts": HOSTS}]
    assert read(config / "inputdataconfig.json") == {}
    expected = {
        "SM_HOSTS", "SM_CURRENT_HOST", "SM_NETWORK_INTERFACE_NAME", "SM_HPS", "SM_CHANNELS",
        "SM_RESOURCE_CONFIG", "SM_INPUT_DATA_CONFIG", "SM_OUTPUT_DATA_DIR",
        "SM_CURRENT_INSTANCE_TYPE", "SM_CURRENT_INSTANCE_GROUP", "SM_INSTANCE_GROUPS",
        "SM_NUM_CPUS", "SM_NUM_GPUS",
        "SM_MODEL_DIR", "SM_INPUT_DIR", "SM_INPUT_CONFIG_DIR", "SM_OUTPUT_DIR",
        "SM_OUTPUT_INTERMEDIATE_DIR", "SM_TRAINING_ENV", "SM_USER_ARGS", "SM_LOG_LEVEL",
        "SM_MODULE_NAME", "SM_USER_ENTRY_POINT", "SM_FRAMEWORK_PARAMS", "SM_MODULE_DIR",
    }
    assert expected <= set(env), expected - set(env)
    assert env["SM_CURRENT_INSTANCE_GROUP"] == "homogeneousCluster"
    assert json.loads(env["SM_INSTANCE_GROUPS"]) == ["homogeneousCluster"]
    assert env["SM_OUTPUT_DATA_DIR"] == str(base / "output" / "data")
    assert env["SM_OUTPUT_INTERMEDIATE_DIR"] == str(base / "output" / "intermediate")
    assert env["SM_INPUT_DIR"] == str(base / "input")
    assert env["SM_INPUT_CONFIG_DIR"] == str(config)
    assert env["SM_OUTPUT_DIR"] == str(base / "output")
    assert env["SM_LOG_LEVEL"] == "20"
    assert env["SM_USER_ENTRY_POINT"] == "train.py"
    assert env["SM_MODULE_NAME"] == "train"
    assert env["SM_CHANNELS"] == "[]" and env["SM_INPUT_DATA_CONFIG"] == "{}"
    te = json.loads(env["SM_TRAINING_ENV"])
    for key in ("hosts", "current_host", "hyperparameters", "num_gpus", "num_cpus", "model_dir",
                "output_data_dir", "channel_input_dirs", "resource_config", "job_name", "log_level",
                "input_data_config", "network_interface_name", "master_hostname", "is_master"):
        assert key in te, key
    assert te["job_name"] == plan["job_id"] and te["master_hostname"] == HOSTS[0]
    assert te["is_master"]
    assert te["model_dir"] == env["SM_MODEL_DIR"]
    # the toolkit's encoding: strings as they are, everything else compact sorted JSON
    assert env["SM_NUM_GPUS"] == "2" and env["SM_HOSTS"] == json.dumps(HOSTS, separators=(",", ":"))


def test_hyperparameters_are_json_encoded_strings(tmp_path: Path) -> None:
    plan = make_plan()
    env, job_dir = write_node(tmp_path, plan, 0)
    hps = read(job_dir / "sagemaker" / "input" / "config" / "hyperparameters.json")
    assert set(hps) == set(plan["hyperparameters"])
    assert all(isinstance(v, str) for v in hps.values())
    # as the SageMaker Python SDK writes them: json.dumps of each value, decoded back to its type
    assert {k: json.loads(v) for k, v in hps.items()} == plan["hyperparameters"]
    assert hps["lr"] == "0.01" and hps["layers"] == "[64, 128]" and hps["amp"] == "true"
    # SM_HP_<NAME>: strings as they are, anything else compact JSON; sagemaker_* are not user hps
    assert env["SM_HP_LR"] == "0.01"
    assert env["SM_HP_EPOCHS"] == "3"
    assert env["SM_HP_NAME"] == "resnet"
    assert env["SM_HP_LAYERS"] == "[64,128]"
    assert env["SM_HP_AMP"] == "true"
    assert env["SM_HP_OPT"] == '{"beta":0.9}'
    assert "SM_HP_SAGEMAKER_PROGRAM" not in env
    user_hps = {k: v for k, v in plan["hyperparameters"].items() if not k.startswith("sagemaker_")}
    assert json.loads(env["SM_HPS"]) == user_hps
    assert json.loads(env["SM_FRAMEWORK_PARAMS"]) == {"sagemaker_program": "train.py"}
    assert json.loads(env["SM_USER_ARGS"]) == [
        "--amp", "True", "--epochs", "3", "--layers", "[64, 128]", "--lr", "0.01",
        "--name", "resnet", "--opt", "beta=0.9"]


def test_channels_become_inputdataconfig_and_data_dirs(tmp_path: Path) -> None:
    data = tmp_path / "data" / "train"
    data.mkdir(parents=True)
    plan = make_plan(channels={"train": {"path": str(data), "ContentType": "text/csv"},
                               "test": None})
    env, job_dir = write_node(tmp_path, plan, 0)
    base = job_dir / "sagemaker"
    idc = read(base / "input" / "config" / "inputdataconfig.json")
    assert idc == {
        "train": {"ContentType": "text/csv", "TrainingInputMode": "File",
                  "S3DistributionType": "FullyReplicated", "RecordWrapperType": "None"},
        "test": {"TrainingInputMode": "File", "S3DistributionType": "FullyReplicated",
                 "RecordWrapperType": "None"},
    }
    assert json.loads(env["SM_CHANNELS"]) == ["test", "train"]
    assert json.loads(env["SM_INPUT_DATA_CONFIG"]) == idc
    assert env["SM_CHANNEL_TRAIN"] == str(base / "input" / "data" / "train")
    assert os.path.realpath(env["SM_CHANNEL_TRAIN"]) == str(data.resolve())
    assert Path(env["SM_CHANNEL_TEST"]).is_dir()
    assert json.loads(env["SM_TRAINING_ENV"])["channel_input_dirs"] == {
        "train": env["SM_CHANNEL_TRAIN"], "test": env["SM_CHANNEL_TEST"]}


def test_single_node_has_no_tf_config(tmp_path: Path) -> None:
    plan = make_plan(n_nodes=1)
    env, _ = write_node(tmp_path, plan, 0)
    assert "TF_CONFIG" not in env
    spec = json.loads(env["CLUSTER_SPEC"])
    assert spec["cluster"]["workerpool0"] == [f"{ADDRS[0]}:29511"]
    assert spec["cluster"]["workerpool1"] == []
    assert spec["task"] == {"type": "workerpool0", "index": 0}
    assert env["WORLD_SIZE"] == "2" and env["RIGDECK_NUM_NODES"] == "1"
    assert cf.mpi_hostfile(plan) == f"{ADDRS[0]} slots=2\n"


@pytest.mark.parametrize("i", [0, 1, 2])
def test_a_trial_names_itself_in_the_vertex_task_and_the_environment(tmp_path: Path, i: int) -> None:
    plan = make_plan(trial="7", sweep_id="lr-sweep-1")
    env, job_dir = write_node(tmp_path, plan, i)
    spec = json.loads(env["CLUSTER_SPEC"])
    assert spec["task"] == ({"type": "workerpool0", "index": 0, "trial": "7"} if i == 0
                            else {"type": "workerpool1", "index": i - 1, "trial": "7"})
    tf = json.loads(env["TF_CONFIG"])
    assert tf["task"] == ({"type": "chief", "index": 0, "trial": "7"} if i == 0
                          else {"type": "worker", "index": i - 1, "trial": "7"})
    assert env["CLOUD_ML_TRIAL_ID"] == env["RIGDECK_TRIAL"] == "7"
    assert env["RIGDECK_SWEEP_ID"] == "lr-sweep-1"
    assert env["CLOUD_ML_HP_METRIC_FILE"] == str(job_dir / "metrics" / "hypertune.metrics")
    assert cf.load_node_env(str(job_dir)) == env  # mpirun's other hosts see the same


def test_a_single_node_trial_has_the_trial_in_cluster_spec_and_still_no_tf_config(tmp_path: Path) -> None:
    env, _ = write_node(tmp_path, make_plan(n_nodes=1, trial="1"), 0)
    assert json.loads(env["CLUSTER_SPEC"])["task"] == {"type": "workerpool0", "index": 0, "trial": "1"}
    assert "TF_CONFIG" not in env
    assert env["CLOUD_ML_TRIAL_ID"] == env["RIGDECK_TRIAL"] == "1"
    assert "RIGDECK_SWEEP_ID" not in env  # none given


@pytest.mark.parametrize("n_nodes", [1, 3])
def test_an_ordinary_job_has_no_trial_but_a_hypertune_file(tmp_path: Path, n_nodes: int) -> None:
    env, job_dir = write_node(tmp_path, make_plan(n_nodes=n_nodes), 0)
    assert "trial" not in json.loads(env["CLUSTER_SPEC"])["task"]
    assert n_nodes == 1 or "trial" not in json.loads(env["TF_CONFIG"])["task"]
    for name in ("CLOUD_ML_TRIAL_ID", "RIGDECK_TRIAL", "RIGDECK_SWEEP_ID"):
        assert name not in env
    # cloudml-hypertune reports into the job's metrics directory, sweep or not
    assert env["CLOUD_ML_HP_METRIC_FILE"] == str(job_dir / "metrics" / "hypertune.metrics")
    assert (job_dir / "metrics").is_dir()


def test_the_user_env_wins_over_the_trial_variables(tmp_path: Path) -> None:
    plan = make_plan(trial="2", sweep_id="s", env={"CLOUD_ML_HP_METRIC_FILE": "/tmp/mine.metrics",
                                                   "CLOUD_ML_TRIAL_ID": "x", "RIGDECK_SWEEP_ID": "t"})
    env, _ = write_node(tmp_path, plan, 0)
    assert env["CLOUD_ML_HP_METRIC_FILE"] == "/tmp/mine.metrics"
    assert env["CLOUD_ML_TRIAL_ID"] == "x" and env["RIGDECK_SWEEP_ID"] == "t"
    assert env["RIGDECK_TRIAL"] == "2"  # not in the table: the plan's


def test_checkpoint_dir_is_linked_and_reruns_are_idempotent(tmp_path: Path) -> None:
    ckpt = tmp_path / "shared" / "ckpt"
    plan = make_plan(checkpoint={"dir": str(ckpt), "owner": "host:gpu-a/gpu:2"})
    env, job_dir = write_node(tmp_path, plan, 0)
    link = job_dir / "sagemaker" / "checkpoints"
    assert link.is_symlink() and os.readlink(link) == str(ckpt) and ckpt.is_dir()
    assert env["RIGDECK_CHECKPOINT_DIR"] == env["AIP_CHECKPOINT_DIR"] == str(ckpt)
    assert env["RIGDECK_CHECKPOINT_OWNER"] == "host:gpu-a/gpu:2"
    # a restart writes the same files again (restart_count moves on)
    plan["restart_count"] = 1
    env2, _ = write_node(tmp_path, plan, 0)
    assert env2["RIGDECK_RESTART_COUNT"] == "1" and link.is_symlink()
    # without a checkpoint dir the link gives way to a directory of the job's own
    plan["checkpoint"] = {"dir": None, "owner": "rank0"}
    env3, _ = write_node(tmp_path, plan, 0)
    assert link.is_dir() and not link.is_symlink()
    assert env3["RIGDECK_CHECKPOINT_DIR"] == str(link)


def test_node_env_json_holds_the_returned_environment(tmp_path: Path) -> None:
    env, job_dir = write_node(tmp_path, make_plan(), 2)
    assert cf.load_node_env(str(job_dir)) == env
    assert cf.load_node_env(str(tmp_path / "nowhere")) is None


def test_user_env_wins_except_the_job_id(tmp_path: Path) -> None:
    plan = make_plan(env={"MASTER_PORT": "1234", "NCCL_SOCKET_IFNAME": "ib0", "OMP_NUM_THREADS": 4,
                          "RIGDECK_JOB_ID": "someone-else", "RIGDECK_CHECKPOINT_OWNER": "all",
                          "FLAG": True})
    env, _ = write_node(tmp_path, plan, 1)
    assert env["MASTER_PORT"] == "1234"
    assert env["NCCL_SOCKET_IFNAME"] == "ib0"
    assert env["OMP_NUM_THREADS"] == "4"
    assert env["RIGDECK_CHECKPOINT_OWNER"] == "all"
    assert env["FLAG"] == "true"
    assert env["RIGDECK_JOB_ID"] == plan["job_id"]


def test_no_interface_known(tmp_path: Path) -> None:
    env, job_dir = write_node(tmp_path, make_plan(), 0, iface=None)
    assert "NCCL_SOCKET_IFNAME" not in env and "GLOO_SOCKET_IFNAME" not in env
    rc = read(job_dir / "sagemaker" / "input" / "config" / "resourceconfig.json")
    assert rc["network_interface_name"] == env["SM_NETWORK_INTERFACE_NAME"] == "eth0"


# -- per-rank variables ------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [True, False], ids=["gpus", "cpu-only"])
def test_rank_env_gives_global_ranks_and_one_gpu_each(gpus: bool) -> None:
    plan = make_plan(gpus=gpus)
    seen = []
    for i in range(3):
        for local in range(2):
            r = cf.rank_env(plan, i, local)
            rank = cf.global_ranks(plan, i)[local]
            assert r["RANK"] == r["RIGDECK_RANK"] == str(rank)
            assert r["LOCAL_RANK"] == r["RIGDECK_LOCAL_RANK"] == str(local)
            if gpus:
                assert r["CUDA_VISIBLE_DEVICES"] == str(GPUS[i][local])
            else:
                assert "CUDA_VISIBLE_DEVICES" not in r
            seen.append(rank)
    assert seen == list(range(6))
    with pytest.raises(ValueError):
        cf.rank_env(plan, 0, 2)


# -- MPI ------------------------------------------------------------------------------------------


def test_mpi_hostfile_lists_addresses_in_rank_order() -> None:
    plan = make_plan()
    plan["nodes"][2]["slots"] = 3
    assert cf.mpi_hostfile(plan) == (
        "10.213.1.13 slots=2\n10.213.1.11 slots=2\n10.213.1.12 slots=3\n")


def test_inside_slurm_open_mpi_gets_slurms_node_names_the_plans_slots_and_an_overlapping_step(
        tmp_path: Path) -> None:
    """A job rigdeck launched through sbatch: the hostfile names the allocation's nodes as Slurm
    does (in the plan's order, the allocation's), the plan's ranks per node become Slurm's tasks
    per node, and Open MPI's srun shares the running step's resources; outside Slurm, or when
    Slurm's node list does not match the plan, nothing changes."""
    plan = make_plan(slurm={"job_id": "7"})
    plan["nodes"][2]["slots"] = 3
    env = {"SLURM_JOB_NODELIST": "tb1-h[1-3]", "PATH": "/bin"}
    got = cf.slurm_mpi(plan, env, str(tmp_path))
    assert got is not None
    path, mpi_env = got
    assert Path(path).read_text() == "tb1-h1 slots=2\ntb1-h2 slots=2\ntb1-h3 slots=3\n"
    assert mpi_env == {**env, "SLURM_OVERLAP": "1", "SLURM_TASKS_PER_NODE": "2,2,3"}
    assert cf.slurm_mpi(make_plan(), env, str(tmp_path)) is None  # not launched through Slurm
    assert cf.slurm_mpi(plan, {"PATH": "/bin"}, str(tmp_path)) is None  # not inside an allocation
    assert cf.slurm_mpi(plan, {"SLURM_JOB_NODELIST": "tb1-h[1-2]"}, str(tmp_path)) is None
    assert cf.slurm_mpi(plan, {"SLURM_JOB_NODELIST": "tb1-h[1-"}, str(tmp_path)) is None


def test_mpirun_argv(tmp_path: Path) -> None:
    plan = make_plan(mpi={"custom_options": ["--mca", "btl_tcp_links", "2", "--display-map"]})
    names = ["RIGDECK_JOB_ID", "SM_HOSTS", "CLUSTER_SPEC", "PATH", "SM_HOSTS"]
    argv = cf.mpirun_argv(plan, names, "eth0", "/j/hostfile", mpirun="/opt/mpi/bin/mpirun",
                          version=4)
    assert argv[0] == "/opt/mpi/bin/mpirun"
    assert argv[argv.index("--hostfile") + 1] == "/j/hostfile"
    assert argv[argv.index("-np") + 1] == "6"
    for flag in ("--allow-run-as-root", "--tag-output"):
        assert flag in argv
    text = " ".join(argv)
    for piece in ("-bind-to none", "-map-by slot", "-mca btl_tcp_if_include eth0",
                  "-mca oob_tcp_if_include eth0", "-mca plm_rsh_no_tree_spawn 1", "-mca pml ob1",
                  "-mca btl ^openib", "-mca orte_abort_on_non_zero_status 1"):
        assert piece in text, piece
    exported = [argv[k + 1] for k, a in enumerate(argv) if a == "-x"]
    assert exported == ["RIGDECK_JOB_ID", "SM_HOSTS", "CLUSTER_SPEC", "PATH"]
    # custom options after the -x list, then the command, which is the tail of the list
    cmd = plan["command"]
    assert argv[-len(cmd):] == cmd
    opts_at = len(argv) - len(cmd) - 4
    assert argv[opts_at:opts_at + 4] == ["--mca", "btl_tcp_links", "2", "--display-map"]
    assert max(k for k, a in enumerate(argv) if a == "-x") < opts_at
    # no shell anywhere: a list of plain arguments, the command never re-joined into a string
    assert all(isinstance(a, str) for a in argv)
    assert "sh" not in argv and "-c" not in argv and "bash" not in argv
    # Open MPI 5 (PRRTE) spelling
    argv5 = cf.mpirun_argv(plan, names, "eth0", "/j/hostfile", version=5)
    text5 = " ".join(argv5)
    assert "--bind-to none" in text5 and "--map-by slot" in text5
    assert "--prtemca oob_tcp_if_include eth0" in text5 and "orte_" not in text5
    assert argv5[-len(cmd):] == cmd
    # without a known interface no interface is pinned
    assert "btl_tcp_if_include" not in cf.mpirun_argv(plan, [], None, "/h", version=4)


def test_mpirun_version_is_read() -> None:
    require(shutil.which("mpirun"), MPIRUN_MISSING)
    major = cf.mpirun_major_version("mpirun")
    assert isinstance(major, int) and major >= 3


# -- route_interface -----------------------------------------------------------------------------


def _local_ipv4() -> list[tuple[str, str]]:
    ip = shutil.which("ip")
    if not ip:
        return []
    out = subprocess.run([ip, "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        if "inet" in parts:
            addr = parts[parts.index("inet") + 1].split("/")[0]
            if not addr.startswith("127."):
                found.append((addr, parts[1].split("@")[0]))
    return found


def test_route_interface_loopback() -> None:
    assert cf.route_interface("127.0.0.1") == "lo"


def test_route_interface_own_address() -> None:
    local = _local_ipv4()
    require(local, "no non-loopback IPv4 address on this machine")
    for addr, name in local:
        assert cf.route_interface(addr) == name


def test_route_interface_unknown() -> None:
    assert cf.route_interface("no-such-host.invalid") is None


def test_proc_net_route_fallback(tmp_path: Path) -> None:
    table = tmp_path / "route"
    table.write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "eth0\t00000000\t010200C0\t0003\t0\t0\t100\t00000000\t0\t0\t0\n"
        "ib0\t0000D50A\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"  # 10.213.0.0/16
        "down0\t0001D50A\t00000000\t0000\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"  # not up
    )
    assert cf._proc_route_iface("10.213.1.11", str(table)) == "ib0"
    assert cf._proc_route_iface("8.8.8.8", str(table)) == "eth0"
    assert cf._proc_route_iface("10.213.1.11", str(tmp_path / "missing")) is None


def test_agent_module_runs_on_python_3_9(tmp_path: Path) -> None:
    py39 = python39()
    require(py39, PY39_MISSING)
    assert py39
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from agent import clusterfiles as c\n"
        "plan = json.loads(sys.argv[2])\n"
        "env = c.node_env(plan, 1, sys.argv[3], c.route_interface('127.0.0.1'))\n"
        "print(json.dumps(env))\n"
    )
    argv = [py39, "-c", code, str(ROOT), json.dumps(make_plan()), str(tmp_path / "j")]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    env = json.loads(out)
    assert env["RIGDECK_CURRENT_HOST"] == HOSTS[1] and env["NCCL_SOCKET_IFNAME"] == "lo"


# -- job kinds (agent/kinds/): one module each, one registry line -------------------------------------


def _pool_nodes_plan(**extra: Any) -> dict[str, Any]:
    """A primary, a worker and an evaluator, each one replica on its own host."""
    plan = make_plan(**extra)
    for n, (role, port) in zip(plan["nodes"], (("primary", 29600), ("worker", 29601), ("evaluator", 29602)),
                               strict=True):
        n.update(pool=role, replica=0, port=port, env={})
    return plan


def test_every_kind_module_is_registered_once_and_every_plan_has_one_shape() -> None:
    from agent import kinds

    modules = sorted(p.stem for p in (ROOT / "agent" / "kinds").glob("*.py") if p.stem not in ("__init__", "base"))
    registered = [type(k).__module__.rsplit(".", 1)[1] for k in kinds.KINDS]
    assert sorted(registered) == modules and len(set(registered)) == len(registered)
    # plain takes every plan: it must come after every other shape, or they would never be reached
    shapes = [k.name for k in kinds.KINDS if k.shape]
    assert shapes[-1] == "plain"
    processing = dict(make_plan(), kind="processing")
    for plan, shape, traits in ((make_plan(), "plain", []),
                                (make_plan(trial="4", seed_checkpoint="/x"), "plain", ["trial", "pipeline step"]),
                                (_pool_nodes_plan(trial="1"), "pools", ["trial"]),
                                (processing, "processing", [])):
        assert kinds.shape_of(plan).name == shape
        assert [k.name for k in kinds.traits_of(plan)] == traits


def test_a_new_kind_is_one_module_and_one_registry_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a kind's hooks reach: a trait that adds a variable and a field of Vertex's task (as a
    new kind's module would) shows up in every view, and the plain views stay what they were."""
    from agent import kinds
    from agent.kinds.base import Kind, Layout

    class Tagged(Kind):
        name = "tagged"

        def matches(self, plan: dict[str, Any]) -> bool:
            return bool(plan.get("tag"))

        def node_env(self, plan: dict[str, Any], node_index: int, layout: Layout) -> dict[str, str]:
            return {"RIGDECK_TAG": str(plan["tag"]), "RIGDECK_TAG_FILES": layout.files_dir}

        def vertex_task(self, plan: dict[str, Any]) -> dict[str, Any]:
            return {"tag": plan["tag"]}

    before, _ = write_node(tmp_path / "plain", make_plan(), 1)
    monkeypatch.setattr(kinds, "KINDS", (*kinds.KINDS, Tagged()))
    env, job_dir = write_node(tmp_path, make_plan(tag="blue"), 1)
    assert env["RIGDECK_TAG"] == "blue" and env["RIGDECK_TAG_FILES"] == str(job_dir)
    assert json.loads(env["CLUSTER_SPEC"])["task"] == {"type": "workerpool1", "index": 0, "tag": "blue"}
    assert json.loads(env["TF_CONFIG"])["task"] == {"type": "worker", "index": 0, "tag": "blue"}
    assert read(job_dir / "node_env.json")["RIGDECK_TAG"] == "blue"
    plain, _ = write_node(tmp_path / "plain", make_plan(), 1)
    assert plain == before


def test_every_kind_runs_on_python_3_9(tmp_path: Path) -> None:
    py39 = python39()
    require(py39, PY39_MISSING)
    assert py39
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from agent import clusterfiles as c\n"
        "out = [c.node_env(plan, 1, sys.argv[3] + str(k), 'lo') for k, plan in enumerate(json.loads(sys.argv[2]))]\n"
        "print(json.dumps(out))\n"
    )
    src = tmp_path / "raw"
    src.mkdir()
    processing = dict(make_plan(), kind="processing", processing={
        "inputs": [{"name": "raw", "source": str(src)}], "outputs": [{"name": "out"}]})
    plans = [make_plan(trial="3", sweep_id="s"), _pool_nodes_plan(), processing]
    argv = [py39, "-c", code, str(ROOT), json.dumps(plans), str(tmp_path / "j")]
    envs = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    assert envs == [cf.node_env(plan, 1, str(tmp_path / f"j{k}"), "lo") for k, plan in enumerate(plans)]
    assert envs[0]["CLOUD_ML_TRIAL_ID"] == "3" and envs[1]["RIGDECK_POOL"] == "worker"
    assert envs[2]["RIGDECK_JOB_KIND"] == "processing"


def test_the_agent_bundle_carries_every_kind_and_python_3_9_imports_them_from_it(tmp_path: Path) -> None:
    """The kinds reach the hosts inside the agent's zipapp, and a host's 3.9 without site (as the
    job host runs it) imports the package from there."""
    import zipfile

    from tui.remote.bundle import build_agent

    bundle = build_agent(tmp_path)
    with zipfile.ZipFile(bundle.path) as zf:
        names = set(zf.namelist())
    want = {f"agent/kinds/{p.name}" for p in (ROOT / "agent" / "kinds").glob("*.py")} | {"agent/doctorprobe.py"}
    assert want <= names
    py39 = python39()
    require(py39, PY39_MISSING)
    assert py39
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from agent import clusterfiles, kinds\n"
            "print(clusterfiles.__file__, ' '.join(k.name for k in kinds.KINDS))\n")
    out = subprocess.run([py39, "-S", "-c", code, str(bundle.path)], capture_output=True, text=True,
                         check=True).stdout
    assert out.startswith(str(bundle.path)) and "pools" in out and "processing" in out


# -- the probe, inside real ranks ------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_plan(n_nodes: int, port: int, launcher: str) -> dict[str, Any]:
    nodes = [{"host": f"node-{i}", "address": "127.0.0.1", "slots": 2, "gpus": [], "cpus": 2,
              "instance_type": "rigdeck.cpu-2", "simulated": False} for i in range(n_nodes)]
    return {
        "job_id": f"probe-{launcher}-{port}", "name": "probe", "launcher": launcher,
        "command": [sys.executable, str(PROBE)], "workdir": str(ROOT),
        "env": {"OMP_NUM_THREADS": "1", "PROBE_TIMEOUT_S": "60"},
        "hyperparameters": {"lr": 0.1, "tag": "x"}, "checkpoint": {"dir": None, "owner": "rank0"},
        "restart_count": 0, "mpi": {"custom_options": ["--oversubscribe"]},
        "nodes": nodes, "master_addr": "127.0.0.1", "master_port": port,
    }


def run_env(node: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "LOCAL_RANK", "WORLD_SIZE", "OMPI_", "PMIX_", "SM_"))}
    env.update(node)
    env["OMP_NUM_THREADS"] = "1"
    return env


def torchrun_cmd(n_nodes: int, node_rank: int, port: int) -> list[str]:
    tr = Path(sys.executable).parent / "torchrun"
    base = [str(tr)] if tr.exists() else [sys.executable, "-m", "torch.distributed.run"]
    return base + ["--nnodes", str(n_nodes), "--nproc-per-node", "2", "--node-rank", str(node_rank),
                   "--master-addr", "127.0.0.1", "--master-port", str(port), str(PROBE)]


def reports(job_dir: Path) -> dict[int, dict[str, Any]]:
    out = {}
    for p in sorted((job_dir / "probe").glob("rank-*.json")):
        r = read(p)
        out[r["rank"]] = r
    return out


def assert_all_ok(job_dirs: list[Path], world: int, proc: subprocess.CompletedProcess) -> None:
    seen: dict[int, dict[str, Any]] = {}
    for d in job_dirs:
        seen.update(reports(d))
    assert sorted(seen) == list(range(world)), (proc.stdout[-3000:], proc.stderr[-3000:])
    for rank, r in seen.items():
        assert r["ok"], (rank, r["failures"])
        assert r["collective"]["sum"] == world * (world + 1) / 2
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_probe_under_torchrun_one_node(tmp_path: Path) -> None:
    require(has_module("torch"), TORCH_MISSING)
    port = free_port()
    plan = local_plan(1, port, "torchrun")
    iface = cf.route_interface("127.0.0.1")
    node = cf.node_env(plan, 0, str(tmp_path / "job"), iface)
    proc = subprocess.run(torchrun_cmd(1, 0, port), env=run_env(node), cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert_all_ok([tmp_path / "job"], 2, proc)
    assert "step=1 loss=0.0" in proc.stdout
    r0 = reports(tmp_path / "job")[0]
    checks = {c["check"] for c in r0["checks"]}
    assert {"hosts", "current host", "node rank", "world size", "master address",
            "GPUs of this node", "all_reduce(rank+1)"} <= checks


def test_probe_under_torchrun_two_nodes_on_this_machine(tmp_path: Path) -> None:
    """Two torchrun agents (node ranks 0 and 1), each with its own node's files, one job."""
    require(has_module("torch"), TORCH_MISSING)
    port = free_port()
    plan = local_plan(2, port, "torchrun")
    dirs = [tmp_path / f"n{i}" / "job" for i in range(2)]
    procs = []
    for i in range(2):
        node = cf.node_env(plan, i, str(dirs[i]), "lo")
        procs.append(subprocess.Popen(torchrun_cmd(2, i, port), env=run_env(node), cwd=ROOT,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = communicate_all(procs)
    for o in outs:
        assert o.returncode == 0, o.stderr[-3000:]
    assert_all_ok(dirs, 4, outs[0])
    # each rank ran on the node its global rank belongs to
    for i, d in enumerate(dirs):
        assert sorted(reports(d)) == cf.global_ranks(plan, i)


def test_probe_names_the_sources_that_disagree(tmp_path: Path) -> None:
    require(has_module("torch"), TORCH_MISSING)
    port = free_port()
    plan = local_plan(1, port, "torchrun")
    node = cf.node_env(plan, 0, str(tmp_path / "job"), "lo")
    node["SM_HOSTS"] = json.dumps(["somewhere-else"])
    proc = subprocess.run(torchrun_cmd(1, 0, port), env=run_env(node), cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    assert "SM_HOSTS" in proc.stderr and "RIGDECK_HOSTS" in proc.stderr
    rs = reports(tmp_path / "job")
    assert sorted(rs) == [0, 1]
    for r in rs.values():
        assert not r["ok"]
        bad = {c["check"]: c for c in r["failures"]}
        assert set(bad) == {"hosts"}
        assert bad["hosts"]["sources"]["SM_HOSTS"] == ["somewhere-else"]
        assert "SM_HOSTS" in bad["hosts"]["why"]


def test_probe_under_mpirun(tmp_path: Path) -> None:
    """mpirun_argv's own command line, 2 ranks here; RANK/WORLD_SIZE come from OMPI_COMM_WORLD_*."""
    require(shutil.which("mpirun"), MPIRUN_MISSING)
    require(has_module("torch"), TORCH_MISSING)
    port = free_port()
    plan = local_plan(1, port, "mpirun")
    job = tmp_path / "job"
    node = cf.node_env(plan, 0, str(job), "lo")
    names = sorted(node) + ["PATH"]
    argv = cf.mpirun_argv(plan, names, "lo", node["RIGDECK_HOSTFILE"])
    proc = subprocess.run(argv, env=run_env(node), cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    assert_all_ok([job], 2, proc)
    for r in reports(job).values():
        assert r["values"]["OMPI_COMM_WORLD_RANK"] is not None
        assert r["values"]["RANK"] is None  # only Open MPI's numbering was there


def test_probe_under_mpirun_two_nodes_on_this_machine(tmp_path: Path) -> None:
    """Open MPI numbers ranks in app-context order: one context per node, each with that node's
    environment (-x NAME=VALUE), gives every rank the files of the node its rank belongs to."""
    require(shutil.which("mpirun"), MPIRUN_MISSING)
    require(has_module("torch"), TORCH_MISSING)
    port = free_port()
    plan = local_plan(2, port, "mpirun")
    dirs = [tmp_path / f"n{i}" / "job" for i in range(2)]
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--tag-output",
            "-mca", "btl", "self,vader,tcp", "-mca", "btl_tcp_if_include", "lo",
            "-mca", "oob_tcp_if_include", "lo", "-x", "PATH"]
    for i in range(2):
        node = cf.node_env(plan, i, str(dirs[i]), "lo")
        if i:
            argv.append(":")
        argv += ["-np", "2"]
        for k, v in sorted(node.items()):
            argv += ["-x", f"{k}={v}"]
        # All four ranks really share one machine: Open MPI's per-machine numbering would
        # (rightly) contradict the per-node views, so this simulation hides it from the probe.
        argv += ["env", "-u", "OMPI_COMM_WORLD_LOCAL_RANK", "-u", "OMPI_COMM_WORLD_LOCAL_SIZE",
                 sys.executable, str(PROBE)]
    proc = subprocess.run(argv, env=run_env({}), cwd=ROOT, capture_output=True, text=True,
                          timeout=180)
    assert_all_ok(dirs, 4, proc)
    for i, d in enumerate(dirs):
        assert sorted(reports(d)) == cf.global_ranks(plan, i)
