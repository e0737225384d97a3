"""A training script written for SageMaker, unchanged: it imports nothing of rigdeck.

It reads what the SageMaker training toolkit provides: ``SM_HOSTS``, ``SM_CURRENT_HOST``,
``SM_MODEL_DIR``, ``SM_CHANNEL_TRAIN`` (optional CSV files: features..., target), ``SM_HP_*``,
``SM_NUM_GPUS``, and ``input/config/resourceconfig.json`` under ``$SAGEMAKER_BASE_DIR`` (default
``/opt/ml``). One process per host: rank = the current host's index in the host list, master =
``hosts[0]`` (``MASTER_ADDR`` when set, as rigdeck sets it, since a host name may not resolve).
When a launcher has set ``RANK``/``WORLD_SIZE`` (torchrun) those win. Rank 0 writes the model to
``SM_MODEL_DIR``, as SageMaker expects.
"""

from __future__ import annotations

import glob
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def hyperparameter(name: str, default):
    """``SM_HP_<NAME>`` (JSON-encoded by the SDK for non-strings), else hyperparameters.json."""
    raw = os.environ.get(f"SM_HP_{name.upper()}")
    if raw is None:
        base = os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml")
        try:
            with open(os.path.join(base, "input", "config", "hyperparameters.json")) as f:
                raw = json.load(f).get(name)
        except FileNotFoundError:
            raw = None
    if raw is None:
        return default
    try:
        return type(default)(json.loads(raw))
    except (TypeError, ValueError):
        return type(default)(raw)


def sagemaker_cluster() -> tuple[list[str], str]:
    base = os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml")
    resource = {}
    path = os.path.join(base, "input", "config", "resourceconfig.json")
    if os.path.exists(path):
        with open(path) as f:
            resource = json.load(f)
    hosts = json.loads(os.environ["SM_HOSTS"]) if "SM_HOSTS" in os.environ else \
        resource.get("hosts", ["algo-1"])
    current = os.environ.get("SM_CURRENT_HOST") or resource.get("current_host", hosts[0])
    return hosts, current


def load_data(channel: str | None, features: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = []
    for path in sorted(glob.glob(os.path.join(channel, "*.csv"))) if channel else []:
        with open(path) as f:
            rows += [[float(v) for v in line.split(",")] for line in f if line.strip()]
    if not rows:  # no channel: a synthetic linear task
        g = torch.Generator().manual_seed(0)
        x = torch.randn(512, features, generator=g)
        w = torch.arange(1, features + 1, dtype=torch.float32).unsqueeze(1) / features
        return x, x @ w + 0.5
    data = torch.tensor(rows, dtype=torch.float32)
    return data[:, :-1], data[:, -1:]


def main() -> None:
    hosts, current = sagemaker_cluster()
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    else:
        world, rank = len(hosts), hosts.index(current)
    epochs = hyperparameter("epochs", 30)
    lr = hyperparameter("lr", 0.1)
    features = hyperparameter("features", 4)
    use_cuda = int(os.environ.get("SM_NUM_GPUS", "0")) > 0 and torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if use_cuda else \
        torch.device("cpu")

    if world > 1:
        os.environ.setdefault("MASTER_ADDR", hosts[0])
        os.environ.setdefault("MASTER_PORT", "7777")  # the toolkit's torch_distributed port
        if use_cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if use_cuda else "gloo", init_method="env://",
                                rank=rank, world_size=world)

    x, y = load_data(os.environ.get("SM_CHANNEL_TRAIN"), features)
    x, y = x[rank::world].to(device), y[rank::world].to(device)  # each rank its share of rows
    torch.manual_seed(0)
    model = nn.Linear(x.shape[1], 1).to(device)
    net = DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    print(f"host={current} rank={rank}/{world} hosts={hosts} rows={len(x)} epochs={epochs}",
          flush=True)
    for epoch in range(epochs):
        loss = nn.functional.mse_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch={epoch} loss={loss.item():.6f}", flush=True)

    if rank == 0:
        model_dir = os.environ.get("SM_MODEL_DIR") or os.path.join(
            os.environ.get("SAGEMAKER_BASE_DIR", "/opt/ml"), "model")
        os.makedirs(model_dir, exist_ok=True)
        torch.save(model.state_dict(), os.path.join(model_dir, "model.pt"))
        print(f"model written to {model_dir}/model.pt", flush=True)
    if world > 1:
        dist.barrier()  # nobody tears down gloo while a peer still talks to it
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Leave without the interpreter's teardown: gloo's worker threads can still be releasing a
    # collective's tensors then, and torch aborts the process ("terminate called without an
    # active exception", SIGABRT) after the training succeeded. Seen here on a loaded machine,
    # with destroy_process_group() called; pytorch/pytorch#179291 describes the same abort.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
