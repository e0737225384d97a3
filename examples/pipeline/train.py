"""Model parallelism: an unbalanced MLP cut into pipeline stages by rigdeck, one stage per rank.

The model is a stack of blocks, one of them much heavier than the others (its hidden layer
``--heavy`` times wider, in block ``--heavy-at``: four times the others' work by default).
``runtime.pipeline_stage`` profiles the blocks on rank 0, cuts the stack where the slowest
stage is fastest (``optimize = "speed"``) or the largest stage smallest (``"memory"``), and runs
this rank's stage under torch's ScheduleGPipe (``pipeline = "simple"``) or Schedule1F1B
(``"interleaved"``). Both schedules compute the same
gradients as one process would, so with the same ``--seed`` they follow the same loss trajectory.

Under rigdeck the ``[model_parallel]`` table of job.toml is the configuration
(``$RIGDECK_MODEL_PARALLEL``); run standalone, the options below are::

    .venv/bin/torchrun --standalone --nproc-per-node 3 examples/pipeline/train.py \\
        --microbatches 4 --pipeline interleaved

``--equal-split`` forces the equal-layer-count cuts instead of the partitioner's (to compare;
bench/pipeline_plan.py does). The batch is regenerated from the seed on the first stage (inputs)
and the last (targets), so nothing but activations and gradients crosses the ranks. The last
stage reports the loss; every rank prints its stage's figures at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

import runtime
from runtime.modelparallel import ENV as MODEL_PARALLEL_ENV
from runtime.partition import equal_cuts

INPUTS = 16
WARMUP_STEPS = 5  # left out of the steps/s figure (first-step set-up, caches)


class Residual(nn.Module):
    """``x + W2 tanh(W1 x)``, ``hidden`` wide inside: a hidden block (transformer-MLP-like)."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.tanh(self.up(x)))


def build_blocks(seed: int, width: int, depth: int, heavy: int, heavy_at: int) -> list[nn.Module]:
    """``depth`` blocks: input layer, residual hidden blocks of two layers each (block
    ``heavy_at`` ``heavy`` times wider inside), output layer."""
    torch.manual_seed(seed)
    blocks: list[nn.Module] = [nn.Sequential(nn.Linear(INPUTS, width), nn.Tanh())]
    for i in range(1, depth - 1):
        blocks.append(Residual(width, width * heavy if i == heavy_at else width))
    blocks.append(nn.Linear(width, 1))
    return blocks


class _AcceleratorTime(torch.autograd.Function):
    """Identity whose forward sleeps ``seconds`` and whose backward sleeps twice that."""

    @staticmethod
    def forward(ctx, x, seconds):  # type: ignore[no-untyped-def,override]
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def,override]
        time.sleep(2 * ctx.seconds)
        return grad, None


class SimulatedAccelerator(nn.Module):
    """A block whose compute also takes the time a *simulated* accelerator of ``gflops`` would
    spend on its matrix products (2 x parameters x rows flops forward, twice that backward),
    slept rather than computed: this machine's ranks share 2 CPU cores, while a real pipeline
    runs each stage on its own GPU, at once. The time is labelled simulated wherever shown."""

    def __init__(self, inner: nn.Module, gflops: float) -> None:
        super().__init__()
        self.inner = inner
        self.flops_per_row = 2 * sum(p.numel() for p in inner.parameters())
        self.rate = gflops * 1e9

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        seconds = self.flops_per_row * x.shape[0] / self.rate
        return _AcceleratorTime.apply(out, seconds)


def make_batch(seed: int, step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed smooth target function of the inputs; the same on every rank for a step."""
    teacher = torch.Generator().manual_seed(seed + 7919)
    w = torch.randn(INPUTS, 4, generator=teacher) / INPUTS**0.5
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(size, INPUTS, generator=g)
    y = torch.sin(x @ w).sum(dim=1, keepdim=True)
    return x, y


def config_from_args(args: argparse.Namespace, world: int) -> dict:
    return {"partitions": args.partitions or world, "microbatches": args.microbatches,
            "pipeline": args.pipeline, "optimize": args.optimize,
            "activation_checkpointing": args.checkpointing, "batch_size": args.batch,
            "plan": args.plan}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--partitions", type=int, help="stages (default: the world size)")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--pipeline", choices=("simple", "interleaved"), default="interleaved")
    p.add_argument("--optimize", choices=("speed", "memory"), default="speed")
    p.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    p.add_argument("--plan", help="a plan file (skips profiling)")
    p.add_argument("--equal-split", action="store_true",
                   help="equal-layer-count cuts instead of the partitioner's")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=9, help="blocks")
    p.add_argument("--heavy", type=int, default=4, help="how many times wider the heavy block is")
    p.add_argument("--heavy-at", type=int, default=4, help="which block is heavy")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--simulated-gflops", type=float, default=0.0,
                   help="add the time a simulated accelerator of this speed would take to each "
                        "block (slept, labelled simulated; 0: off)")
    args = p.parse_args()

    if os.environ.get(MODEL_PARALLEL_ENV):  # run by rigdeck from a spec: its table rules
        config = json.loads(os.environ[MODEL_PARALLEL_ENV])
        shape = config.get("profile_batch")
        batch = config.get("batch_size") or (shape[0] if isinstance(shape, list) else args.batch)
    else:
        config = config_from_args(args, runtime.cluster_info().world_size)
        batch = args.batch
    blocks = build_blocks(args.seed, args.width, args.depth, args.heavy, args.heavy_at)
    if args.simulated_gflops > 0:
        blocks = [SimulatedAccelerator(b, args.simulated_gflops) for b in blocks]
    cuts = equal_cuts(len(blocks), config["partitions"]) if args.equal_split else None
    stage = runtime.pipeline_stage(blocks, lambda: make_batch(args.seed, 0, batch)[0],
                                   nn.functional.mse_loss, config=config, cuts=cuts)
    plan = stage.plan
    if stage.is_last:
        print(f"partitions={plan['partitions']} microbatches={plan['microbatches']} "
              f"pipeline={plan['schedule']} optimize={plan['optimize']} cuts={plan['cuts']} "
              f"({'equal split' if args.equal_split else plan['source']}) "
              f"expected bubble={plan['bubble']:.2f}"
              + (f" simulated accelerator={args.simulated_gflops:g} GFLOP/s"
                 if args.simulated_gflops > 0 else ""), flush=True)

    opt = torch.optim.SGD(stage.module.parameters(), lr=args.lr, momentum=0.9)
    t0 = time.perf_counter()
    t_warm = t0
    for step in range(args.steps):
        if step == WARMUP_STEPS:
            t_warm = time.perf_counter()
        x, y = make_batch(args.seed, step, batch)
        opt.zero_grad(set_to_none=True)
        loss = stage.step(x, y)
        opt.step()
        if loss is not None:
            runtime.report(step=step, loss=loss, stage=stage.stage_index)
            sys.stdout.write(f"step={step} loss={loss:.6f}\n")  # one write: see below
            sys.stdout.flush()
    elapsed = time.perf_counter() - t0
    timed = stage.stats[WARMUP_STEPS:] or stage.stats
    measured = max(args.steps - WARMUP_STEPS, 0)
    summary = {
        "stage": stage.stage_index, "blocks": plan["stages"][stage.stage_index]["blocks"],
        "cuts": plan["cuts"], "equal_split": args.equal_split,
        "simulated_gflops": args.simulated_gflops,
        "step_time_s": statistics.median(s["step_time_s"] for s in timed),
        "busy_s": statistics.median(s["busy_s"] for s in timed),
        "peak_bytes": max(s["peak_bytes"] for s in timed),
        "steps_per_s": (measured / (time.perf_counter() - t_warm) if measured
                        else args.steps / elapsed),
    }
    # One write (torchrun runs ranks unbuffered, and their lines share one stream).
    sys.stdout.write("stage_summary " + json.dumps(summary) + "\n")
    sys.stdout.flush()
    if stage.is_last:
        print(f"done: {args.steps} steps in {elapsed:.1f}s", flush=True)
    runtime.finish()  # every rank meets, then this process ends here: nothing torn down


if __name__ == "__main__":
    main()
