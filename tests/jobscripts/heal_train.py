"""A small data-parallel loop for the healing tests: gloo all-reduces each step, a checkpoint every
few steps in a shared directory, resumed on start; faults on demand in the first attempt only.

    heal_train.py --steps N --ckpt DIR [--sleep S] [--checkpoint-every K]
                  [--hang-rank R --hang-step S]  rank R stops before step S's all-reduce, for good
                  [--nan-from S]                 the loss is NaN from step S on
                  [--faults-always]              the faults in every attempt, not the first only
                  [--dead-gpus DIR]              a rank fails at its next step, as a CUDA call on a
                                                 lost GPU does, while DIR/dead-<hostname>-<gpu> exists
                                                 for its GPU (CUDA_VISIBLE_DEVICES), in any attempt
                  [--container-devices DIR]      a simulated test device: the device nodes of the
                                                 job's containers, where DIR exists (a [container]
                                                 mount: inside the container only). The container of
                                                 attempt N has GPU g while DIR/attempt-N/nvidia<g>
                                                 exists; without it the rank fails as NVML does in a
                                                 container that lost its devices ("Failed to
                                                 initialize NVML: Unknown Error") while the host
                                                 still has the GPU
                  [--first-attempt-holds]        the first attempt never ends: its ranks wait before
                                                 the last step until rigdeck stops them, so a test's
                                                 fault finds the job running however slow the machine
                  [--hold-attempts K]            so do the first K attempts
                  [--slow-step S --slow-factor F] step S takes F times as long as the others
                  [--save-seconds X]             checkpoints go through runtime.Checkpointer (and are
                                                 resumed from it), each save lasting X s more: it
                                                 sleeps inside the save, after the data is written
                  [--memory]                     checkpoints go through runtime.Checkpointer, with a
                                                 memory snapshot (Checkpointer.snapshot) every step
                                                 (every=1); under [checkpoint] owner = "all" each
                                                 rank's state holds its own "mine" (checked on resume);
                                                 prints where it resumed from (memory or disk, whose)

Reports each step with ``runtime.report(step, loss)``; prints ``resumed from step K`` when it starts
from a checkpoint.
"""

import argparse
import json
import math
import os
import socket
import time

import torch
import torch.distributed as dist

import runtime

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True)
p.add_argument("--ckpt", required=True)
p.add_argument("--sleep", type=float, default=0.2)
p.add_argument("--checkpoint-every", type=int, default=5)
p.add_argument("--hang-rank", type=int)
p.add_argument("--hang-step", type=int)
p.add_argument("--nan-from", type=int)
p.add_argument("--faults-always", action="store_true")
p.add_argument("--dead-gpus")
p.add_argument("--container-devices")
p.add_argument("--first-attempt-holds", action="store_true")
p.add_argument("--hold-attempts", type=int, default=0)
p.add_argument("--slow-step", type=int)
p.add_argument("--slow-factor", type=float, default=5.0)
p.add_argument("--save-seconds", type=float)
p.add_argument("--memory", action="store_true")
args = p.parse_args()

dist.init_process_group("gloo", init_method="env://")
rank, world = dist.get_rank(), dist.get_world_size()
attempt = int(os.environ.get("RIGDECK_RESTART_COUNT", "0"))
faults = attempt == 0 or args.faults_always
# The newest checkpoint, or, after rigdeck restarted the job for a NaN loss at step N, the newest
# saved before N (as runtime.Checkpointer does with RIGDECK_RESUME_BEFORE_STEP).
before = int(os.environ.get("RIGDECK_RESUME_BEFORE_STEP") or 10**9)
saved = sorted(int(n[5:-5]) for n in os.listdir(args.ckpt)  # (not a Checkpointer's manifest: step-N.manifest.json)
               if n.startswith("step-") and n.endswith(".json") and n[5:-5].isdigit())
saved = [s for s in saved if s < before]
checkpointer = None
weight = torch.zeros(1)
where = ""
if args.save_seconds is not None or args.memory:
    from runtime import checkpoint

    checkpointer = runtime.Checkpointer(args.ckpt)
    if args.save_seconds is not None:
        # runtime.checkpoint's named point inside a save (what tests replace): a slow disk, simulated
        checkpoint._stage = lambda name: time.sleep(args.save_seconds) if name == "data-written" else None
    if checkpointer.policy == "all":  # (each rank's state its own: "mine" is weight + rank)
        got = checkpointer.load_latest(state={"step": 0, "weight": torch.zeros(1), "mine": torch.zeros(1)})
    else:
        got = checkpointer.load_latest()
    saved = [got[0]] if got is not None else []
    if got is not None:
        weight = got[1].get("weight", weight)
        if "mine" in got[1] and got[1]["mine"].item() != weight.item() + rank:
            raise SystemExit(f"rank {rank} restored another rank's state: {got[1]}")
        if checkpointer.restored_from is not None:
            r = checkpointer.restored_from
            where = f" ({r['source']} of rank {r['rank']}" + (f" on {r['host']})" if r.get("host") else ")")
start = 1
if saved:
    start = saved[-1] + 1
    if rank == 0:
        print(f"resumed from step {saved[-1]}{where}", flush=True)


def wait_for_peers(x: torch.Tensor) -> None:
    dist.all_reduce(x)


def stuck() -> None:
    while True:  # a rank that stopped making progress, alive
        time.sleep(1)


def check_gpus() -> None:
    devices = args.container_devices
    for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(","):
        if args.dead_gpus and g and os.path.exists(os.path.join(args.dead_gpus, f"dead-{socket.gethostname()}-{g}")):
            raise RuntimeError(f"CUDA error: unspecified launch failure (GPU {g}, simulated)")
        if devices and g and os.path.isdir(devices) and not os.path.exists(
                os.path.join(devices, f"attempt-{attempt}", f"nvidia{g}")):
            raise RuntimeError(f"Failed to initialize NVML: Unknown Error (GPU {g}, simulated: its device node "
                               f"is gone from this container)")


for step in range(start, args.steps + 1):
    check_gpus()
    if step == args.steps and attempt < max(args.hold_attempts, 1 if args.first_attempt_holds else 0):
        # alive, making no progress, until stopped (or its GPU dies): a section of its own, so
        # rigdeck's hang rule gives it the default timeout, not one learned from the steps
        with runtime.section("hold"):
            while True:
                time.sleep(0.2)
                check_gpus()
    if faults and args.hang_rank == rank and args.hang_step == step:
        stuck()
    x = torch.ones(1) * (step + rank)
    wait_for_peers(x)
    loss = 1.0 / step
    if faults and args.nan_from is not None and step >= args.nan_from:
        loss = math.nan
    weight += x  # the state each step changes: the same on every rank (the all-reduced sum)
    runtime.report(step=step, loss=loss)
    if args.memory and checkpointer is not None:
        state = {"step": step, "weight": weight}
        if checkpointer.policy == "all":  # each rank's own: every rank writes its snapshot
            state["mine"] = weight + rank
        checkpointer.snapshot(step, state, every=1)
    if step % args.checkpoint_every == 0 and checkpointer is not None:
        checkpointer.save(step, {"step": step, "weight": weight})  # every rank: the owner writes, the others wait
    elif step % args.checkpoint_every == 0:
        dist.barrier()
        if rank == 0:
            path = os.path.join(args.ckpt, f"step-{step}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({"step": step}, f)
            os.replace(path + ".tmp", path)
        dist.barrier()
    time.sleep(args.sleep * (args.slow_factor if step == args.slow_step else 1.0))
if rank == 0 and checkpointer is not None:  # the state carried over every restart, checked
    expected = sum(world * s + world * (world - 1) // 2 for s in range(1, args.steps + 1))
    print(f"weight {weight.item():g}, expected {expected:g}", flush=True)
dist.barrier()
dist.destroy_process_group()
