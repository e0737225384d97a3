"""Data-parallel training of a small character-level transformer on text it writes itself.

Uses the rigdeck runtime end to end: ``init_distributed`` (torchrun, rigdeck or mpirun variables),
``ddp`` (bucket_cap_mb=64), ``scaled_lr`` (linear scaling rule with warmup), ``report`` every step,
and a ``Checkpointer`` that saves every ``--checkpoint-every`` steps under the job's ownership
policy, keeps a memory snapshot of the last steps on each host (``snapshot``: every step, or every
N where that would cost more than 0.5% of the step time; ``--no-memory-snapshots`` turns it off) and
resumes from the newest step held, in memory or on disk, on start.

    .venv/bin/torchrun --standalone --nproc-per-node 2 examples/ddp/train.py --steps 60
    .venv/bin/python examples/ddp/train.py --steps 60          # world size 1
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import runtime

SUBJECTS = ["the cat", "a dog", "the old man", "my sister", "the bird", "a child", "the cook"]
VERBS = ["sees", "likes", "chases", "finds", "feeds", "paints", "hears"]
OBJECTS = ["the ball", "a red apple", "the moon", "a small fish", "the garden", "an old hat"]
ENDINGS = [" today", " at night", " again", "", " slowly", " in the rain"]


def make_corpus(seed: int, sentences: int = 4000) -> str:
    """Sentences from a tiny grammar: structure a small model can learn within a minute."""
    rng = random.Random(seed)
    return " ".join(
        f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}{rng.choice(ENDINGS)}."
        for _ in range(sentences)
    )


class CharTransformer(nn.Module):
    def __init__(self, vocab: int, context: int, width: int = 64, layers: int = 2,
                 heads: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(context, width)
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context),
                             persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        h = self.blocks(h, mask=self.mask[:t, :t], is_causal=True)
        return self.head(self.norm(h))


def batch(data: torch.Tensor, size: int, context: int, seed: int, rank: int, step: int,
          device: str) -> tuple[torch.Tensor, torch.Tensor]:
    # Seeded by (seed, rank, step): each rank sees its own data, and a resumed run the same data.
    g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1_009 + rank)
    start = torch.randint(0, len(data) - context - 1, (size,), generator=g)
    x = torch.stack([data[s:s + context] for s in start.tolist()])
    y = torch.stack([data[s + 1:s + 1 + context] for s in start.tolist()])
    return x.to(device), y.to(device)


def sharded_state(model: nn.Module, opt: torch.optim.Optimizer, step: int) -> dict:
    """Model and optimizer state keyed by parameter name, as torch.distributed.checkpoint wants
    it (the ``all`` policy: every rank saves and reloads its own part)."""
    model_state, optim_state = get_state_dict(model, opt)
    return {"model": model_state, "optim": optim_state, "step": step}


def state_of(model: nn.Module, opt: torch.optim.Optimizer, step: int, policy: str) -> dict:
    """What a checkpoint or a memory snapshot keeps: ``sharded_state`` under ``all``, else the
    whole model and optimizer state (every rank holds the same)."""
    if policy == "all":
        return sharded_state(model, opt, step)
    return {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--checkpoint-dir", default=os.environ.get("RIGDECK_CHECKPOINT_DIR")
                   or "checkpoints")
    p.add_argument("--no-memory-snapshots", action="store_true",
                   help="no memory snapshots: a restart resumes from the disk checkpoints only")
    p.add_argument("--async-save", action="store_true",
                   help="disk checkpoints written by a thread while training goes on")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=16, help="sequences per rank and step")
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate at --batch (one rank)")
    p.add_argument("--warmup", type=int, default=20, help="warmup steps to the scaled rate")
    args = p.parse_args()

    info = runtime.init_distributed()
    text = make_corpus(args.seed)
    chars = sorted(set(text))
    data = torch.tensor([chars.index(c) for c in text], dtype=torch.long)

    torch.manual_seed(args.seed)  # same initial weights everywhere (DDP broadcasts rank 0's too)
    model = CharTransformer(len(chars), args.context).to(info.device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    ckpt = runtime.Checkpointer(args.checkpoint_dir, async_save=args.async_save)

    start = 0
    if ckpt.policy == "all":  # dcp loads in place, into a state of the same shape
        restored = ckpt.load_latest(state=sharded_state(model, opt, -1))
    else:
        restored = ckpt.load_latest()
    if restored is not None:
        step, state = restored
        if ckpt.policy == "all":
            set_state_dict(model, opt, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
        else:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optim"])
        start = step + 1
        if info.rank == 0:
            src = ckpt.restored_from or {}
            where = (f"memory of rank {src.get('rank')}" + (f" on {src['host']}" if src.get("host") else "")
                     if src.get("source") == "memory" else ckpt.dir)
            print(f"resumed from step {step} ({where})", flush=True)
    net = runtime.ddp(model)

    global_batch = args.batch * info.world_size
    if info.rank == 0:
        print(f"world={info.world_size} hosts={list(info.hosts)} device={info.device} "
              f"source={'+'.join(info.source)} global_batch={global_batch} "
              f"checkpoints={ckpt.dir} owner={ckpt.policy}", flush=True)
    snapshots = not args.no_memory_snapshots
    t0 = time.perf_counter()
    for step in range(start, args.steps):
        lr = runtime.scaled_lr(args.lr, args.batch, global_batch, step, args.warmup)
        for group in opt.param_groups:
            group["lr"] = lr
        x, y = batch(data, args.batch, args.context, args.seed, info.rank, step, info.device)
        logits = net(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.item()
        runtime.report(step=step, loss=value, lr=lr)
        if info.rank == 0:
            print(f"step={step} loss={value:.4f} lr={lr:.2e}", flush=True)
        if (step + 1) % args.checkpoint_every == 0 or step == args.steps - 1:
            ckpt.save(step, state_of(model, opt, step, ckpt.policy))
        elif snapshots:  # (under "all" every rank calls it at the same steps: a collective there)
            # the state as a function: built only on the steps and the ranks that write one
            ckpt.snapshot(step, functools.partial(state_of, model, opt, step, ckpt.policy))
    if info.rank == 0:
        print(f"done: {args.steps - start} steps in {time.perf_counter() - t0:.2f}s", flush=True)
    runtime.finish()  # every rank meets, then this process ends here: nothing torn down


if __name__ == "__main__":
    main()
