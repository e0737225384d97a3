"""The example jobs run standalone (torchrun, mpirun, plain processes) and do what they claim.

Ranks are real processes on this machine (gloo, OMP_NUM_THREADS=1); metrics come back through
RIGDECK_METRICS_DIR exactly as the agent would read them.
"""

from __future__ import annotations

import ast
import collections
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomllib

from tests._require import MPIRUN_MISSING, require
from tests.kit import communicate_all

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
PYTHON = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
# Variables of an enclosing job or launcher must not leak into the examples' ranks.
FOREIGN = ("RIGDECK_", "SM_", "OMPI_", "PMIX_", "TORCHELASTIC_", "AIP_")
FOREIGN_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "CLUSTER_SPEC", "TF_CONFIG", "SAGEMAKER_BASE_DIR"}


def clean_env(**extra: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(FOREIGN) and k not in FOREIGN_NAMES}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONWARNINGS"] = "ignore"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 150) -> str:
    proc = subprocess.Popen(argv, env={**env, "PYTHONFAULTHANDLER": "1"}, cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = _stacks_then_kill(proc)
        raise AssertionError(f"{argv} still running after {timeout:g}s; the stacks of its processes "
                             f"(faulthandler, on SIGABRT):\n{out[-3000:]}\n{err[-12000:]}") from None
    assert proc.returncode == 0, f"{argv} exited {proc.returncode}\n{out[-4000:]}\n{err[-4000:]}"
    return out


def _stacks_then_kill(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """A hung run made readable: every Python process under ``proc`` (the launcher's ranks, then
    the launcher) prints its threads' stacks on SIGABRT (PYTHONFAULTHANDLER), then all are killed."""
    import signal

    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True) + [psutil.Process(proc.pid)]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.send_signal(signal.SIGABRT)
        except psutil.NoSuchProcess:
            pass
    try:
        return proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        for p in tree:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        return proc.communicate()


def run_ranks(argv: list[str], envs: list[dict[str, str]], cwd: Path,
              timeout: float = 150) -> list[str]:
    """Start one process per env at once (like rigdeck's `direct` launcher); all must succeed."""
    procs = [subprocess.Popen(argv, env=e, cwd=cwd, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for e in envs]
    done = communicate_all(procs, timeout)
    for d in done:
        assert d.returncode == 0, f"{argv} exited {d.returncode}\n{d.stdout[-3000:]}\n{d.stderr[-3000:]}"
    return [d.stdout for d in done]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics(directory: Path, rank: int) -> list[dict[str, Any]]:
    text = (directory / f"rank-{rank}.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def steps(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [x for x in lines if "event" not in x and "step" in x]


def torch_ranks(world: int, port: int, **extra: Any) -> list[dict[str, str]]:
    return [clean_env(RANK=r, WORLD_SIZE=world, LOCAL_RANK=r, LOCAL_WORLD_SIZE=world,
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **extra) for r in range(world)]


# -- the job specs ---------------------------------------------------------------------------

EXPECTED = {"ddp": "torchrun", "pipeline": "torchrun", "mpi": "mpirun", "sharded": "direct",
            "sagemaker-script": "direct"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_job_spec_follows_the_contract(name: str) -> None:
    spec = tomllib.loads((EXAMPLES / name / "job.toml").read_text())
    assert spec["name"] == name and spec["launcher"] == EXPECTED[name]
    assert spec["command"][0] == "{python}" and spec["workdir"] == "."
    assert (EXAMPLES / name / spec["command"][1]).is_file()
    assert spec["nodes"] == 3 and spec.get("processes_per_node", 1) >= 1
    assert set(spec) <= {"name", "command", "workdir", "launcher", "nodes", "hosts",
                         "processes_per_node", "gpus_per_node", "max_runtime", "env",
                         "hyperparameters", "checkpoint", "restart", "mpi", "log",
                         "model_parallel"}
    if name == "pipeline":  # one stage per rank, the stages from the [model_parallel] table
        mp = spec["model_parallel"]
        assert mp["partitions"] == spec["nodes"] * spec["processes_per_node"]
        assert mp["pipeline"] == "interleaved" and mp["microbatches"] == 4
        assert "--partitions" not in spec["command"]
    else:
        assert "model_parallel" not in spec


def test_sagemaker_script_imports_nothing_of_rigdeck() -> None:
    tree = ast.parse((EXAMPLES / "sagemaker-script" / "train.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"runtime", "agent", "tui"}, imported


# -- ddp ---------------------------------------------------------------------------------------


def test_ddp_learns_checkpoints_and_resumes(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    argv = [TORCHRUN, "--standalone", "--nproc-per-node", "2", str(EXAMPLES / "ddp" / "train.py"),
            "--checkpoint-every", "20", "--checkpoint-dir", str(ckpt), "--seed", "1"]
    out = run(argv + ["--steps", "40"], clean_env(RIGDECK_METRICS_DIR=tmp_path / "m1"), tmp_path)
    assert "step=39 loss=" in out
    for rank in (0, 1):
        losses = [x["loss"] for x in steps(metrics(tmp_path / "m1", rank))]
        assert len(losses) == 40
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        assert last < 0.8 * first, (rank, first, last)
    assert (ckpt / "latest").read_text().strip() == "step-00000039"
    saves = [x for x in metrics(tmp_path / "m1", 0) if x.get("event") == "checkpoint"]
    assert [(x["status"], x["step"]) for x in saves] == [
        ("writing", 19), ("done", 19), ("writing", 39), ("done", 39)]
    # Only the owner writes and says so; every rank marks the save as a section (what the hang rule
    # reads: the others wait in its barrier), none but the owner a checkpoint event.
    assert not [x for x in metrics(tmp_path / "m1", 1) if x.get("event") == "checkpoint"]
    marks = [(x["phase"], x["section"]) for x in metrics(tmp_path / "m1", 1) if x.get("event") == "section"]
    assert marks == [("begin", "checkpoint"), ("end", "checkpoint")] * 2, marks

    # A restart resumes after the last checkpoint.
    out = run(argv + ["--steps", "46"], clean_env(RIGDECK_METRICS_DIR=tmp_path / "m2"), tmp_path)
    assert "resumed from step 39" in out
    for rank in (0, 1):
        assert [x["step"] for x in steps(metrics(tmp_path / "m2", rank))] == list(range(40, 46))
    assert (ckpt / "latest").read_text().strip() == "step-00000045"


def test_ddp_runs_as_a_single_plain_process(tmp_path: Path) -> None:
    out = run([PYTHON, str(EXAMPLES / "ddp" / "train.py"), "--steps", "3",
               "--checkpoint-dir", str(tmp_path / "ckpt")], clean_env(), tmp_path)
    assert "world=1" in out and "step=2 loss=" in out
    assert (tmp_path / "ckpt" / "latest").read_text().strip() == "step-00000002"


# -- pipeline ----------------------------------------------------------------------------------


@pytest.mark.parametrize("partitions", [2, 3])
def test_pipeline_schedules_follow_the_same_trajectory(tmp_path: Path, partitions: int) -> None:
    trajectories = {}
    for schedule in ("simple", "interleaved"):
        mdir = tmp_path / schedule
        envs = torch_ranks(partitions, free_port(), RIGDECK_METRICS_DIR=mdir,
                           RIGDECK_JOB_DIR=tmp_path / f"job-{schedule}")
        outs = run_ranks([PYTHON, str(EXAMPLES / "pipeline" / "train.py"),
                          "--partitions", str(partitions), "--microbatches", "4",
                          "--pipeline", schedule, "--steps", "30", "--seed", "3"], envs, tmp_path)
        last = partitions - 1
        assert f"pipeline={schedule}" in outs[last] and "step=29 loss=" in outs[last]
        lines = steps(metrics(mdir, last))
        assert [x["step"] for x in lines] == list(range(30))
        # The other stages report no loss, only their stage's figures.
        for r in range(partitions):
            events = [x for x in metrics(mdir, r) if "event" in x]
            assert [x["step"] for x in events if x["event"] == "mp_stage"] == [4, 9, 14, 19, 24, 29]
            if r < last:
                assert not steps(metrics(mdir, r))
        # Rank 0 profiled the unbalanced model and cut it: the heavy block (4) is never with
        # as many blocks as the equal split puts with it.
        plan = next(x["plan"] for x in metrics(mdir, 0) if x.get("event") == "mp_plan")
        assert plan == json.loads((tmp_path / f"job-{schedule}" / "model_parallel" / "plan.json").read_text())
        assert plan["partitions"] == partitions and plan["blocks"] == 9
        heavy = next(s for s in plan["stages"] if s["blocks"][0] <= 4 < s["blocks"][1])
        slowest, equal = max(s["time_s"] for s in plan["stages"]), plan["equal_split"]["max_time_s"]
        if partitions == 3:  # the equal split puts blocks 3, 4, 5 together; the plan does better
            assert equal > slowest and heavy["blocks"][1] - heavy["blocks"][0] < 3, plan
        else:  # 5 + 4 blocks: the heavy one with 4 others either way, about as slow
            assert equal >= slowest
        trajectories[schedule] = [x["loss"] for x in lines]
    simple, interleaved = trajectories["simple"], trajectories["interleaved"]
    assert simple == pytest.approx(interleaved, rel=1e-5, abs=1e-7)
    assert sum(simple[-5:]) / 5 < 0.6 * sum(simple[:5]) / 5  # and it learns


def test_pipeline_refuses_a_world_that_is_not_the_partition_count(tmp_path: Path) -> None:
    envs = torch_ranks(2, free_port())
    procs = [subprocess.Popen([PYTHON, str(EXAMPLES / "pipeline" / "train.py"),
                               "--partitions", "3"], env=e, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for e in envs]
    for p in procs:
        _out, err = p.communicate(timeout=120)
        assert p.returncode != 0 and (
            "model_parallel.partitions = 3 needs a world size of 3 (one stage per rank), "
            "this job has 2") in err, err[-2000:]


# -- mpi ---------------------------------------------------------------------------------------


def test_mpi_ranks_configure_from_open_mpi_alone(tmp_path: Path) -> None:
    mpirun = shutil.which("mpirun")
    require(mpirun, MPIRUN_MISSING)
    assert mpirun
    out = run([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2",
               PYTHON, str(EXAMPLES / "mpi" / "train.py"), "--steps", "60",
               "--master-port", str(free_port())],
              clean_env(RIGDECK_METRICS_DIR=tmp_path / "m"), tmp_path)
    assert "world=2 source=Open MPI master=127.0.0.1" in out
    for rank in (0, 1):
        losses = [x["loss"] for x in steps(metrics(tmp_path / "m", rank))]
        assert len(losses) == 60 and losses[-1] < 0.5 * losses[0]


# -- sharded -----------------------------------------------------------------------------------


def test_sharded_covers_every_input_once(tmp_path: Path) -> None:
    inp, out = tmp_path / "in", tmp_path / "out"
    envs = [clean_env(RIGDECK_RANK=r, RIGDECK_LOCAL_RANK=r, RIGDECK_WORLD_SIZE=2,
                      RIGDECK_LOCAL_WORLD_SIZE=2, RIGDECK_METRICS_DIR=tmp_path / "m")
            for r in range(2)]
    run_ranks([PYTHON, str(EXAMPLES / "sharded" / "process.py"), "--input", str(inp),
               "--output", str(out), "--generate", "31", "--seed", "5"], envs, tmp_path)
    inputs = sorted(p.name for p in inp.iterdir())
    assert len(inputs) == 31
    results = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    done = [f for r in results for f in r["files"]]
    assert sorted(done) == inputs  # each file processed once, by exactly one rank
    assert abs(len(results[0]["files"]) - len(results[1]["files"])) <= 1
    expected: collections.Counter = collections.Counter()
    for p in inp.iterdir():
        expected.update(p.read_text().split())
    got: collections.Counter = collections.Counter()
    for r in results:
        got.update(r["counts"])
    assert got == expected
    assert [x["files_done"] for x in metrics(tmp_path / "m", 1)] == \
        list(range(1, len(results[1]["files"]) + 1))


# -- sagemaker-script --------------------------------------------------------------------------


def sagemaker_tree(base: Path, current: str, hosts: list[str], hps: dict[str, Any]) -> dict:
    """The /opt/ml tree and SM_* variables SageMaker (or rigdeck's agent) gives a host."""
    cfg = base / "input" / "config"
    cfg.mkdir(parents=True)
    (cfg / "resourceconfig.json").write_text(json.dumps({
        "current_host": current, "hosts": hosts, "current_group_name": "homogeneousCluster",
        "network_interface_name": "lo",
        "instance_groups": [{"instance_group_name": "homogeneousCluster", "hosts": hosts}]}))
    (cfg / "hyperparameters.json").write_text(json.dumps({k: json.dumps(v)
                                                          for k, v in hps.items()}))
    train = base / "input" / "data" / "train"
    train.mkdir(parents=True)
    rows = [(i / 64, (i % 7) / 7, 1.0, -1.0) for i in range(64)]
    (train / "data.csv").write_text("\n".join(
        f"{a},{b},{c},{d},{2 * a - b + 0.5 * c + 0.25}" for a, b, c, d in rows) + "\n")
    env = {"SAGEMAKER_BASE_DIR": base, "SM_HOSTS": json.dumps(hosts), "SM_CURRENT_HOST": current,
           "SM_MODEL_DIR": base / "model", "SM_CHANNEL_TRAIN": train, "SM_NUM_GPUS": 0,
           "SM_CHANNELS": '["train"]', "SM_HPS": json.dumps(hps)}
    env.update({f"SM_HP_{k.upper()}": json.dumps(v) for k, v in hps.items()})
    return env


def test_sagemaker_script_single_host(tmp_path: Path) -> None:
    env = sagemaker_tree(tmp_path / "ml", "algo-1", ["algo-1"], {"epochs": 40, "lr": 0.1})
    out = run([PYTHON, str(EXAMPLES / "sagemaker-script" / "train.py")], clean_env(**env),
              tmp_path)
    assert "host=algo-1 rank=0/1" in out and "rows=64 epochs=40" in out
    losses = [float(line.split("loss=")[1]) for line in out.splitlines() if "loss=" in line]
    assert len(losses) == 40 and losses[-1] < 0.2 * losses[0]
    assert (tmp_path / "ml" / "model" / "model.pt").is_file()


def test_sagemaker_script_two_hosts_master_is_hosts0(tmp_path: Path) -> None:
    hosts = ["algo-1", "algo-2"]
    port = free_port()
    envs = []
    for h in hosts:  # what rigdeck's agent sets: the tree per host, MASTER_ADDR as an address
        sm = sagemaker_tree(tmp_path / h, h, hosts, {"epochs": 20, "lr": 0.1})
        envs.append(clean_env(**sm, MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
    outs = run_ranks([PYTHON, str(EXAMPLES / "sagemaker-script" / "train.py")], envs, tmp_path)
    assert "rank=0/2" in outs[0] and "rank=1/2" in outs[1] and "rows=32" in outs[1]
    # DDP keeps the replicas equal; only the master writes the model
    assert (tmp_path / "algo-1" / "model" / "model.pt").is_file()
    assert not (tmp_path / "algo-2" / "model").exists()
