"""A rank that writes TensorBoard scalars with torch's own SummaryWriter, for ``rigdeck
tensorboard``'s acceptance test (tests/test_tensorboard_bed.py). No rigdeck import.

Every rank joins a gloo group (env:// rendezvous), and at each step all-reduces a tensor and
writes ``loss`` and ``reduced`` (the all-reduced sum) to ``$AIP_TENSORBOARD_LOG_DIR/rank-R``.
It writes in phases of ``STEPS`` steps (``python tb_writer.py STEPS PHASES``); after each it
flushes, leaves ``<job dir>/written-<steps so far>`` and waits for the test to create
``<job dir>/go-<steps so far>`` (each host's own job dir), so the test reads the files while
the job runs, at a point it chose, not at a time it guessed.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter

steps, phases = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("gloo", init_method="env://")
rank = dist.get_rank()
job_dir = os.environ["RIGDECK_JOB_DIR"]
writer = SummaryWriter(log_dir=os.path.join(os.environ["AIP_TENSORBOARD_LOG_DIR"], f"rank-{rank}"))


def wait_for(name: str) -> None:
    path = os.path.join(job_dir, name)
    deadline = time.monotonic() + 600
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"rank {rank}: {path} never came")
        time.sleep(0.1)


for phase in range(phases):
    for step in range(phase * steps, (phase + 1) * steps):
        t = torch.tensor([float(step + rank)])
        dist.all_reduce(t)
        writer.add_scalar("loss", 1.0 / (step + 1), step)
        writer.add_scalar("reduced", t.item(), step)
    writer.flush()
    done = (phase + 1) * steps
    open(os.path.join(job_dir, f"written-{done}"), "w").close()
    print(f"rank {rank}: {done} steps written", flush=True)
    wait_for(f"go-{done}")
writer.close()
dist.barrier()
dist.destroy_process_group()
