"""Model parallelism: one MLP split into pipeline stages, one stage per rank.

The parameters SageMaker's model-parallel library exposes: ``--partitions`` (stages; the world
size must equal it), ``--microbatches`` (each batch is cut into this many), and ``--pipeline``:
``simple`` (torch's ScheduleGPipe: every microbatch forward, then every one backward) or
``interleaved`` (Schedule1F1B: forwards and backwards alternate once the pipe is full). Both
compute the same gradients, so with the same ``--seed`` they follow the same loss trajectory.

Every rank builds the whole model from the seed and keeps its own slice of layers; the batch is
regenerated from the seed on the first stage (inputs) and the last (targets), so nothing but
activations and gradients crosses the ranks. The last stage reports the loss.

    .venv/bin/torchrun --standalone --nproc-per-node 2 examples/pipeline/train.py --partitions 2
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

import runtime

SCHEDULES = {"simple": ScheduleGPipe, "interleaved": Schedule1F1B}


def build_layers(seed: int, inputs: int, width: int, depth: int) -> list[nn.Module]:
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Sequential(nn.Linear(inputs, width), nn.Tanh())]
    layers += [nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(depth - 2)]
    layers.append(nn.Linear(width, 1))
    return layers


def stage_slice(n_layers: int, stages: int, index: int) -> slice:
    """Layers of stage ``index``: contiguous, sizes differing by at most one."""
    base, extra = divmod(n_layers, stages)
    start = index * base + min(index, extra)
    return slice(start, start + base + (1 if index < extra else 0))


def make_batch(seed: int, step: int, size: int, inputs: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed smooth target function of the inputs; the same on every rank for a step."""
    teacher = torch.Generator().manual_seed(seed + 7919)
    w = torch.randn(inputs, 4, generator=teacher) / inputs**0.5
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(size, inputs, generator=g)
    y = torch.sin(x @ w).sum(dim=1, keepdim=True)
    return x, y


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--partitions", type=int, default=2, choices=(2, 3))
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--pipeline", choices=sorted(SCHEDULES), default="interleaved")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--depth", type=int, default=6, help="layers, split across the stages")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    info = runtime.init_distributed()
    if info.world_size != args.partitions:
        sys.exit(f"--partitions {args.partitions} needs a world size of {args.partitions}, "
                 f"this job has {info.world_size}")
    if args.batch % args.microbatches:
        sys.exit(f"--batch {args.batch} must be a multiple of --microbatches {args.microbatches}")
    if args.pipeline == "interleaved" and args.microbatches < args.partitions:
        sys.exit("--pipeline interleaved needs at least as many microbatches as partitions")

    inputs = 16
    layers = build_layers(args.seed, inputs, args.width, args.depth)
    index, stages = info.rank, args.partitions
    first, last = index == 0, index == stages - 1
    module = nn.Sequential(*layers[stage_slice(len(layers), stages, index)])
    device = torch.device(info.device)
    module.to(device)
    # Static shapes (requires_grad marks what has a gradient to pass back): no metadata exchange
    # at the first step, whose object send/recv needs numpy.
    micro = args.batch // args.microbatches
    stage = PipelineStage(
        module, index, stages, device,
        input_args=torch.empty(micro, inputs if first else args.width, requires_grad=not first),
        output_args=torch.empty(micro, 1 if last else args.width, requires_grad=True))
    schedule = SCHEDULES[args.pipeline](stage, n_microbatches=args.microbatches,
                                        loss_fn=nn.functional.mse_loss)
    opt = torch.optim.SGD(module.parameters(), lr=args.lr, momentum=0.9)
    if last:
        sizes = [len(range(len(layers))[stage_slice(len(layers), stages, i)])
                 for i in range(stages)]
        print(f"partitions={stages} microbatches={args.microbatches} pipeline={args.pipeline} "
              f"layers per stage={sizes}", flush=True)

    t0 = time.perf_counter()
    for step in range(args.steps):
        x, y = make_batch(args.seed, step, args.batch, inputs)
        opt.zero_grad(set_to_none=True)
        if first:
            schedule.step(x.to(device))
        elif last:
            losses: list[torch.Tensor] = []
            schedule.step(target=y.to(device), losses=losses)
            loss = torch.stack(losses).mean().item()
            runtime.report(step=step, loss=loss, stage=index)
            print(f"step={step} loss={loss:.6f}", flush=True)
        else:
            schedule.step()
        opt.step()
    if last:
        print(f"done: {args.steps} steps in {time.perf_counter() - t0:.1f}s", flush=True)
    runtime.shutdown_distributed()  # a barrier, then destroy_process_group()


if __name__ == "__main__":
    main()
    runtime.exit_process()  # skip the interpreter teardown gloo can abort
