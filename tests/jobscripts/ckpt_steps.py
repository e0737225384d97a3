"""A preemptible stand-in training rank (stdlib only, no torch): N steps, a metrics record each;
every rank saves a checkpoint of its progress every K steps in $RIGDECK_CHECKPOINT_DIR and, on
start, resumes after its newest one, writing a ``resumed`` event record and printing
``rank R resumed from step K`` (K = 0: a later attempt that found no checkpoint). Stopped
(SIGTERM), it just dies: what it did since its last checkpoint is redone, at most K - 1 steps.

    ckpt_steps.py --steps N [--sleep S] [--checkpoint-every K]
"""

import argparse
import json
import os
import time

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, required=True)
ap.add_argument("--sleep", type=float, default=0.2)
ap.add_argument("--checkpoint-every", type=int, default=5)
args = ap.parse_args()

rank = int(os.environ.get("RANK") or 0)
mine = os.path.join(os.environ["RIGDECK_CHECKPOINT_DIR"], f"rank-{rank}")
os.makedirs(mine, exist_ok=True)
mdir = os.environ.get("RIGDECK_METRICS_DIR")
fd = os.open(os.path.join(mdir, f"rank-{rank}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND) if mdir else None


def record(rec):
    if fd is not None:
        os.write(fd, (json.dumps({"time": time.time(), "rank": rank, **rec}) + "\n").encode())


saved = sorted(int(n[5:-5]) for n in os.listdir(mine) if n.startswith("step-") and n.endswith(".json"))
start = (saved[-1] if saved else 0) + 1
if saved or int(os.environ.get("RIGDECK_RESTART_COUNT") or 0):  # stopped before its first checkpoint: step 0
    print(f"rank {rank} resumed from step {start - 1}", flush=True)
    record({"event": "resumed", "from_step": start - 1})
for step in range(start, args.steps + 1):
    time.sleep(args.sleep)
    loss = 1.0 / step
    record({"step": step, "loss": loss})
    print(f"rank {rank} step={step} loss={loss:.6f}", flush=True)
    if step % args.checkpoint_every == 0:
        path = os.path.join(mine, f"step-{step}.json")
        with open(path + ".tmp", "w") as f:
            json.dump({"step": step}, f)
        os.replace(path + ".tmp", path)
print(f"rank {rank} done", flush=True)
