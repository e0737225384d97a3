"""The data-parallel job of ``bench/goodput.py``: gloo all-reduces each step, a checkpoint every K
steps in a shared directory, resumed on start. The same script runs under rigdeck, under
torchrun started by hand and under ft_launcher; the faults come from outside, through files in
``--ctl``:

- ``hang``: holds a rank number; that rank removes the file and stops before its next all-reduce,
  alive, for good (a hung collective: every other rank waits in it).
- ``dead-<hostname>-<gpu>``: the GPU fell off the bus (XID 79). A rank placed on it fails at its
  next step the way a CUDA call on a lost GPU does, in every attempt on it, until the file goes.
  (The GPUs of the bed are simulated: this is what the real fault does to the process; the
  simulated GPU's telemetry gets the XID from ``sim-gpu-faults.json``, written at the same time.)

Each step is reported with ``runtime.report(step, loss, attempt=...)``: ``attempt`` names this
process's start, so the benchmark can tell the attempts of either launcher apart.

Checkpoints: by default a JSON file per checkpoint, written by rank 0 between two barriers (what a
script of one's own does). ``--memory``: through ``runtime.Checkpointer`` instead, the same disk
checkpoint every K steps plus a memory snapshot of every completed step (``snapshot``: each
host's tmpfs), resumed with ``load_latest`` from the newest step any rank's host holds.

``--nvrx`` (under ``ft_launcher``, NVIDIA's resiliency extension, only): what a user of it adds to
the script, a ``RankMonitorClient`` connected to ft_launcher's rank monitor once the process group
is up and a heartbeat after each step's all-reduce; the monitor kills a rank whose heartbeats stop
for longer than the timeouts given to ft_launcher, and ft_launcher restarts the gang.

    goodput_train.py --steps N --ckpt DIR --ctl DIR [--sleep S] [--checkpoint-every K] [--tag T]
                     [--memory] [--nvrx]
"""

import argparse
import json
import os
import socket
import time

import torch
import torch.distributed as dist

import runtime

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, required=True)
p.add_argument("--ckpt", required=True)
p.add_argument("--ctl", required=True)
p.add_argument("--sleep", type=float, default=0.3)
p.add_argument("--checkpoint-every", type=int, default=90)
p.add_argument("--tag", default="", help="only to find this run's processes by their command line")
p.add_argument("--memory", action="store_true", help="runtime.Checkpointer, with a memory snapshot every step")
p.add_argument("--nvrx", action="store_true", help="heartbeats to ft_launcher's rank monitor (nvidia-resiliency-ext)")
args = p.parse_args()

attempt = f"{socket.gethostname()}-{os.getpid()}-{time.time():.3f}"
host = socket.gethostname()
gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()

ft_client = None
if args.nvrx:
    # NVIDIA's resiliency extension: a client of the rank monitor ft_launcher started for this
    # rank. The initial heartbeat timeout runs from here, the heartbeat timeout between two beats.
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    ft_client = RankMonitorClient()
    ft_client.init_workload_monitoring()

checkpointer = runtime.Checkpointer(args.ckpt, keep=2) if args.memory else None
if checkpointer is not None:
    got = checkpointer.load_latest()
    start = got[0] + 1 if got is not None else 1
    if rank == 0 and got is not None:
        where = checkpointer.restored_from or {}
        print(f"resumed from step {got[0]} ({where.get('source', 'disk')})", flush=True)
else:
    saved = sorted(int(n[5:-5]) for n in os.listdir(args.ckpt) if n.startswith("step-") and n.endswith(".json"))
    start = saved[-1] + 1 if saved else 1
    if rank == 0 and saved:
        print(f"resumed from step {saved[-1]}", flush=True)


def check_gpus() -> None:
    for g in gpus:
        if os.path.exists(os.path.join(args.ctl, f"dead-{host}-{g}")):
            raise RuntimeError(f"CUDA error: unspecified launch failure on {host} GPU {g} "
                               "(simulated: the bench's XID 79)")


def maybe_hang() -> None:
    path = os.path.join(args.ctl, "hang")
    try:
        with open(path) as f:
            who = int(f.read().strip() or -1)
    except (OSError, ValueError):
        return
    if who != rank:
        return
    os.remove(path)
    print(f"rank {rank}: stopping before the all-reduce of this step, alive", flush=True)
    while True:
        time.sleep(1)


for step in range(start, args.steps + 1):
    check_gpus()
    maybe_hang()
    x = torch.ones(1) * step
    dist.all_reduce(x)
    runtime.report(step=step, loss=1.0 / step, attempt=attempt)
    if ft_client is not None:
        ft_client.send_heartbeat()  # a step made: the rank is not hung
    if checkpointer is not None:
        checkpointer.snapshot(step, {"step": step})
        if step % args.checkpoint_every == 0:
            checkpointer.save(step, {"step": step})  # rank 0 writes, every rank waits for it
    elif step % args.checkpoint_every == 0:
        dist.barrier()
        if rank == 0:
            path = os.path.join(args.ckpt, f"step-{step}.json")
            with open(path + ".tmp", "w") as f:
                json.dump({"step": step}, f)
            os.replace(path + ".tmp", path)
        dist.barrier()
    time.sleep(args.sleep)
if ft_client is not None:
    ft_client.shutdown_workload_monitoring()
dist.destroy_process_group()
