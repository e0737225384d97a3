"""runtime.pipeline_stage across 3 real processes (torch.distributed over gloo on this machine):
profiling and partitioning on rank 0, the plan broadcast, GPipe and 1F1B training that matches
one process's losses, activation checkpointing's memory, a plan file, and a model with fewer
blocks than partitions.

One launch of 3 ranks runs every scenario in turn (tests/jobscripts/mp_stage_worker.py); the
tests below read what it wrote.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runtime.partition import partition
from tests.kit import communicate_all

ROOT = Path(__file__).resolve().parent.parent
WORKER = ROOT / "tests" / "jobscripts" / "mp_stage_worker.py"
WORLD = 3
FOREIGN = ("RIGDECK_", "SM_", "OMPI_", "PMIX_", "TORCHELASTIC_", "AIP_")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(out: Path, *scenarios: str, timeout: float = 180) -> list[subprocess.CompletedProcess[str]]:
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    procs = []
    for rank in range(WORLD):
        env = {**base, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(ROOT),
               "RANK": str(rank), "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(out), *scenarios], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return communicate_all(procs, timeout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("mp")
    done = launch(out, "reference", "simple", "interleaved", "ckpt-off", "ckpt-on", "from-file")
    for rank, proc in enumerate(done):
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(WORLD)]
    return {"out": out, "ranks": ranks}


def events(out: Path, scenario: str, rank: int) -> list[dict[str, Any]]:
    path = out / scenario / "metrics" / f"rank-{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("schedule", ["simple", "interleaved"])
def test_schedules_learn_and_match_one_process(runs: dict[str, Any], schedule: str) -> None:
    ranks, out = runs["ranks"], runs["out"]
    reference = ranks[0]["reference"]["losses"]
    losses = ranks[WORLD - 1][schedule]["losses"]
    assert len(losses) == 10 and all(not r[schedule]["losses"] for r in ranks[:-1])
    assert losses == pytest.approx(reference, rel=1e-5, abs=1e-7)
    assert losses[-1] < 0.7 * losses[0], losses  # it learns

    # Rank 0 profiled and partitioned; every rank runs the plan it broadcast.
    assert [r[schedule]["profiled"] for r in ranks] == [True, False, False]
    plan = ranks[0][schedule]["plan"]
    assert all(r[schedule]["plan"] == plan for r in ranks)
    assert plan["schedule"] == schedule and plan["source"] == "profiled"
    assert (plan["partitions"], plan["microbatches"], plan["blocks"]) == (3, 4, 5)
    assert plan["bubble"] == pytest.approx(2 / 6)
    files = out / schedule / "model_parallel"
    assert json.loads((files / "plan.json").read_text()) == plan
    profile = json.loads((files / "profile.json").read_text())
    assert len(profile["blocks"]) == 5 and profile["microbatch_size"] == 4
    heavy = profile["blocks"][2]  # the wide block: most parameters and activations
    assert heavy["param_bytes"] == 4 * (16 * 384 + 384 + 384 * 16 + 16)
    assert heavy["param_bytes"] == max(b["param_bytes"] for b in profile["blocks"])
    assert heavy["activation_bytes"] == max(b["activation_bytes"] for b in profile["blocks"])
    assert all(b["forward_s"] > 0 and b["backward_s"] > 0 for b in profile["blocks"])
    assert [b["output_bytes"] for b in profile["blocks"]] == [4 * 16 * 4] * 4 + [4 * 1 * 4]
    # The plan is the partitioner's plan for that profile.
    assert plan == partition(profile, 3, "speed", 4, schedule)

    # Events: the plan once on rank 0; every rank's stage figures every 5 steps.
    plans = [e for e in events(out, schedule, 0) if e.get("event") == "mp_plan"]
    assert [e["plan"] for e in plans] == [plan]
    for rank in range(WORLD):
        stages = [e for e in events(out, schedule, rank) if e.get("event") == "mp_stage"]
        assert [(e["stage"], e["step"]) for e in stages] == [(rank, 4), (rank, 9)]
        assert not any(e.get("event") == "mp_plan" for e in events(out, schedule, rank) if rank)
        for e in stages:
            assert e["step_time_s"] > 0 and 0 < e["busy_s"] < e["step_time_s"]
            assert isinstance(e["peak_bytes"], int) and e["peak_bytes"] > 0


def test_interleaved_keeps_fewer_activations_than_simple(runs: dict[str, Any]) -> None:
    ranks = runs["ranks"]
    for rank in range(WORLD - 1):  # 1F1B holds at most p - stage microbatches; GPipe all 4
        simple = ranks[rank]["simple"]["stats"][-1]["peak_bytes"]
        onefb = ranks[rank]["interleaved"]["stats"][-1]["peak_bytes"]
        assert onefb < simple, (rank, onefb, simple)


def test_activation_checkpointing_lowers_peak_memory(runs: dict[str, Any]) -> None:
    ranks = runs["ranks"]
    for rank in range(WORLD):
        off, on = ranks[rank]["ckpt-off"], ranks[rank]["ckpt-on"]
        assert off["plan"]["cuts"] == on["plan"]["cuts"] == [2, 3]  # forced: the same stages
        peak_off = max(s["peak_bytes"] for s in off["stats"][1:])
        peak_on = max(s["peak_bytes"] for s in on["stats"][1:])
        busy_off = sorted(s["busy_s"] for s in off["stats"][1:])[4]
        busy_on = sorted(s["busy_s"] for s in on["stats"][1:])[4]
        step_off = sorted(s["step_time_s"] for s in off["stats"][1:])[4]
        step_on = sorted(s["step_time_s"] for s in on["stats"][1:])[4]
        print(f"stage {rank}: peak {peak_off} -> {peak_on} bytes with checkpointing; median busy "
              f"{busy_off * 1e3:.2f} -> {busy_on * 1e3:.2f} ms, step {step_off * 1e3:.2f} -> "
              f"{step_on * 1e3:.2f} ms")
        assert peak_on < peak_off, (rank, peak_on, peak_off)
        assert busy_on > 0 and step_on > 0
        # Checkpointing recomputes; the numbers stay the same.
        assert on["losses"] == pytest.approx(off["losses"], rel=1e-6)


def test_a_plan_file_skips_profiling(runs: dict[str, Any]) -> None:
    ranks, out = runs["ranks"], runs["out"]
    assert not any(r["from-file"]["profiled"] for r in ranks)
    assert not (out / "from-file" / "model_parallel").exists()  # nothing profiled, nothing written
    plan = ranks[0]["from-file"]["plan"]
    assert plan["source"] == "file" and plan["cuts"] == ranks[0]["simple"]["plan"]["cuts"]
    assert ranks[WORLD - 1]["from-file"]["losses"] == pytest.approx(
        ranks[0]["reference"]["losses"], rel=1e-5, abs=1e-7)
    plans = [e for e in events(out, "from-file", 0) if e.get("event") == "mp_plan"]
    assert [e["plan"]["source"] for e in plans] == ["file"]


def test_more_partitions_than_blocks_stops_every_rank_before_training(tmp_path: Path) -> None:
    done = launch(tmp_path, "too-many", timeout=120)
    for proc in done:
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert ("rigdeck model parallel: model_parallel.partitions = 3 but the model has only 2 "
                "blocks") in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "too-many" / "model_parallel").exists()
    assert not list(tmp_path.glob("rank-*.json"))


# -- in this process: profiling, and the errors found before any process group ------------------


def test_profile_measures_blocks_and_leaves_the_model_as_it_was() -> None:
    import torch
    from torch import nn

    from runtime.modelparallel import profile_blocks

    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(8, 16), nn.Tanh()),
              nn.Sequential(nn.BatchNorm1d(16), nn.Dropout(0.5), nn.Linear(16, 2))]
    before = {k: v.clone() for k, v in blocks[1].state_dict().items()}
    sample = torch.randn(4, 8)
    rng = torch.get_rng_state()
    prof = profile_blocks(blocks, sample, "cpu")
    assert torch.equal(torch.get_rng_state(), rng)
    assert all(torch.equal(v, before[k]) for k, v in blocks[1].state_dict().items())
    assert all(p.grad is None for b in blocks for p in b.parameters())
    first, second = prof["blocks"]
    assert first["param_bytes"] == first["grad_bytes"] == 4 * (8 * 16 + 16)
    # Linear saves its input (4x8 floats), Tanh its output (4x16); the weight is a parameter.
    assert first["activation_bytes"] == 4 * (4 * 8 + 4 * 16)
    assert first["output_bytes"] == 4 * 4 * 16 and first["output_shape"] == [4, 16]
    assert second["output_bytes"] == 4 * 4 * 2 and prof["input_bytes"] == 4 * 4 * 8
    assert all(b["runs"] >= 5 and b["forward_s"] > 0 and b["backward_s"] > 0 for b in prof["blocks"])


def stage_error(config: dict[str, Any], nblocks: int = 3, batch: int = 8, **kw: Any) -> str:
    import torch
    from torch import nn

    with pytest.raises(SystemExit) as e:
        runtime_blocks = [nn.Linear(4, 4) for _ in range(nblocks)]
        import runtime

        runtime.pipeline_stage(runtime_blocks, torch.randn(batch, 4), nn.functional.mse_loss,
                               config=config, **kw)
    return str(e.value)


def test_bad_configurations_stop_before_anything_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RIGDECK_MODEL_PARALLEL"):
        monkeypatch.delenv(name, raising=False)
    base = {"partitions": 2, "microbatches": 4, "pipeline": "simple"}
    assert "model_parallel.partitions = 4 but the model has only 3 blocks" in stage_error(
        {**base, "partitions": 4})
    assert "model_parallel.pipeline = 'interleaved' needs model_parallel.microbatches >= " \
        "model_parallel.partitions (1 < 2)" in stage_error({**base, "microbatches": 1, "pipeline": "interleaved"})
    assert "unknown model_parallel key colour" in stage_error({**base, "colour": "red"})
    assert "model_parallel.partitions = 2 needs a world size of 2 (one stage per rank), this " \
        "job has 1" in stage_error(base)
    assert "$RIGDECK_MODEL_PARALLEL is not set" in stage_error(None)  # type: ignore[arg-type]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    assert "model_parallel.microbatches = 4 does not divide the batch size 6" in stage_error(base, batch=6)
    assert "the sample batch has 6 rows, fewer than one microbatch (batch size 32 / " \
        "model_parallel.microbatches 4 = 8)" in stage_error({**base, "batch_size": 32}, batch=6)
    plan = partition({"blocks": [{"forward_s": 1, "backward_s": 1, "param_bytes": 1, "grad_bytes": 1,
                                  "activation_bytes": 1, "output_bytes": 1}] * 3}, 3, "speed", 4, "simple")
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    assert "model_parallel.plan " + str(tmp_path / "plan.json") + ": has 3 stages, " \
        "model_parallel.partitions is 2" in stage_error({**base, "plan": str(tmp_path / "plan.json")})
    assert "cannot read" in stage_error({**base, "plan": str(tmp_path / "missing.json")})
