"""Logistic regression, data-parallel: each rank trains on its shards of input/data/train.

The shards come from the pipeline's preprocess step (every host of this step has all of them
in its ``SM_CHANNEL_TRAIN``); rank r takes the shards whose index is r modulo the world size.
Gradients are averaged by DistributedDataParallel. Rank 0 saves ``model.json`` (the weights, so
evaluation needs no torch) and ``model.pt`` into ``SM_MODEL_DIR`` and a checkpoint into the
checkpoint dir; the loss is reported every step."""

from __future__ import annotations

import glob
import json
import os

import torch

import runtime


def load(paths: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = [], []
    for p in paths:
        with open(p) as f:
            next(f)
            for line in f:
                x, y, label = line.strip().split(",")
                xs.append([float(x), float(y)])
                ys.append([float(label)])
    return torch.tensor(xs), torch.tensor(ys)


def main() -> int:
    hps = json.loads(os.environ.get("SM_HPS", "{}"))
    lr, steps = float(hps.get("lr", 0.5)), int(hps.get("steps", 60))
    runtime.init_distributed()
    dist = torch.distributed
    rank, world = dist.get_rank(), dist.get_world_size()
    channel = os.environ["SM_CHANNEL_TRAIN"]
    shards = sorted(glob.glob(os.path.join(channel, "shard-*.csv")))
    if not shards:
        raise SystemExit(f"no shards in {channel}")
    mine = shards[rank::world]
    x, y = load(mine)
    print(f"rank {rank}/{world}: {len(mine)} of {len(shards)} shards, {len(x)} rows", flush=True)
    torch.manual_seed(0)
    model = runtime.ddp(torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for step in range(1, steps + 1):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        runtime.report(step=step, loss=loss.item())
        if step % 10 == 0 and rank == 0:
            print(f"step {step} loss={loss.item():.4f}", flush=True)
    if rank == 0:
        lin = model.module
        weights = {"w": lin.weight.detach().flatten().tolist(), "b": float(lin.bias.detach()[0])}
        model_dir = os.environ["SM_MODEL_DIR"]
        with open(os.path.join(model_dir, "model.json"), "w") as f:
            json.dump(weights, f)
        torch.save(lin.state_dict(), os.path.join(model_dir, "model.pt"))
        ckpt = os.environ.get("RIGDECK_CHECKPOINT_DIR")
        if ckpt:
            torch.save({"step": steps, "model": lin.state_dict()}, os.path.join(ckpt, f"step-{steps}.pt"))
    runtime.finish()  # every rank meets, then this process ends here (exit 0): nothing torn down
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
