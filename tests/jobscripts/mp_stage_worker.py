"""A rank of tests/test_modelparallel.py: runs ``runtime.pipeline_stage`` scenarios in one process
group, one after the other, and writes what it saw to ``OUT/rank-R.json``.

  mp_stage_worker.py OUT SCENARIO [SCENARIO ...]

Scenarios (each trains a fresh copy of the same unbalanced model from the same seed):
  simple, interleaved   profiled and partitioned, 3 stages, 4 microbatches, STEPS steps
  ckpt-off, ckpt-on     the same cuts forced, activation checkpointing off / on
  from-file             the plan of the ``simple`` scenario read from a file (no profiling)
  reference             rank 0 only: the whole model in this one process, no pipeline
  too-many              3 partitions of a 2-block model (must exit on every rank, before training)
Each scenario gets its own RIGDECK_JOB_DIR (OUT/SCENARIO) and metrics dir (OUT/SCENARIO/metrics).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))

import runtime  # noqa: E402
from runtime import metrics  # noqa: E402

STEPS = 10
BATCH, INPUTS = 16, 8


def blocks(seed: int = 0) -> list[nn.Module]:
    torch.manual_seed(seed)
    return [nn.Sequential(nn.Linear(INPUTS, 16), nn.Tanh()),
            nn.Sequential(nn.Linear(16, 16), nn.Tanh()),
            nn.Sequential(nn.Linear(16, 384), nn.Tanh(), nn.Linear(384, 16), nn.Tanh()),  # heavy
            nn.Sequential(nn.Linear(16, 16), nn.Tanh()),
            nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))]


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same small data set every step (so that the loss falls within a few steps)."""
    g = torch.Generator().manual_seed(1000)
    x = torch.randn(BATCH, INPUTS, generator=g)
    return x, torch.sin(x.sum(dim=1, keepdim=True))


def train(stage: Any) -> list[float]:
    opt = torch.optim.SGD(stage.module.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        loss = stage.step(x, y)
        opt.step()
        if loss is not None:
            losses.append(loss)
    return losses


def reference() -> list[float]:
    model = nn.Sequential(*blocks())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    out, scenarios = Path(sys.argv[1]), sys.argv[2:]
    rank = int(os.environ["RANK"])
    result: dict[str, Any] = {}
    for name in scenarios:
        if name == "reference":
            if rank == 0:
                result[name] = {"losses": reference()}
            continue
        job_dir = out / name
        os.environ["RIGDECK_JOB_DIR"] = str(job_dir)
        os.environ["RIGDECK_METRICS_DIR"] = str(job_dir / "metrics")
        metrics.reset()
        config = {"partitions": 3, "microbatches": 4, "pipeline": "simple", "optimize": "speed"}
        cuts = None
        model = blocks()
        if name == "too-many":
            model = model[:2]
        elif name == "interleaved":
            config["pipeline"] = "interleaved"
        elif name in ("ckpt-off", "ckpt-on"):
            config["activation_checkpointing"] = name == "ckpt-on"
            cuts = [2, 3]
        elif name == "from-file":
            config["plan"] = str(out / "simple" / "model_parallel" / "plan.json")
        os.environ["RIGDECK_MODEL_PARALLEL"] = json.dumps(config)
        sample = lambda: batch(0)[0]  # noqa: E731 (a callable sample)
        stage = runtime.pipeline_stage(model, sample, nn.functional.mse_loss, cuts=cuts)
        losses = train(stage)
        result[name] = {"losses": losses, "plan": stage.plan, "stats": stage.stats,
                        "profiled": stage.profile is not None, "stage": stage.stage_index}
    metrics.reset()
    (out / f"rank-{rank}.json").write_text(json.dumps(result))
    runtime.finish()  # every rank meets, then this process ends here: nothing torn down


if __name__ == "__main__":
    main()
