"""Data parallelism for the ``mpirun`` launcher: ranks know their place only from Open MPI.

``mpirun`` sets ``OMPI_COMM_WORLD_RANK``/``_SIZE``/``_LOCAL_RANK``/``_LOCAL_SIZE`` and nothing
for torch; ``runtime.init_distributed()`` derives RANK/WORLD_SIZE from them and sets the torch
variables, with the master from rigdeck's variables when the agent launched the job, else
``--master-addr`` (default 127.0.0.1) and ``--master-port``. Each rank fits a small MLP to its own
samples of a regression task; DDP averages the gradients (gloo on CPU, NCCL on GPUs).

    mpirun --allow-run-as-root --oversubscribe -np 2 .venv/bin/python examples/mpi/train.py
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn as nn

import runtime


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate at --batch (one rank)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--master-addr", default=None,
                   help="rendezvous address when no launcher variable names one "
                        "(default 127.0.0.1: every rank on this machine)")
    p.add_argument("--master-port", type=int, default=29533,
                   help="rendezvous port when no launcher variable names one")
    args = p.parse_args()

    if args.master_addr and "MASTER_ADDR" not in os.environ \
            and "RIGDECK_MASTER_ADDR" not in os.environ:
        os.environ["MASTER_ADDR"] = args.master_addr
    info = runtime.init_distributed(default_master_port=args.master_port)

    torch.manual_seed(args.seed)
    teacher = torch.randn(8, 1)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).to(info.device)
    net = runtime.ddp(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    gen = torch.Generator().manual_seed(args.seed * 7919 + info.rank)  # each rank its own data
    global_batch = args.batch * info.world_size
    if info.rank == 0:
        print(f"world={info.world_size} source={'+'.join(info.source)} "
              f"master={info.master_addr}:{info.master_port} hosts={list(info.hosts)}",
              flush=True)
    t0 = time.perf_counter()
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = runtime.scaled_lr(args.lr, args.batch, global_batch, step, args.warmup)
        x = torch.randn(args.batch, 8, generator=gen)
        y = torch.tanh(x @ teacher) + 0.01 * torch.randn(args.batch, 1, generator=gen)
        loss = nn.functional.mse_loss(net(x.to(info.device)), y.to(info.device))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        runtime.report(step=step, loss=loss)
        if info.rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step={step} loss={loss.item():.5f}", flush=True)
    if info.rank == 0:
        print(f"done: {args.steps} steps in {time.perf_counter() - t0:.1f}s", flush=True)
    runtime.finish()  # every rank meets, then this process ends here: nothing torn down


if __name__ == "__main__":
    main()
