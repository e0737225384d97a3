"""A stand-in training rank for job tests: N steps, a line and a metrics record per step.

Uses only what the agent provides (RIGDECK_METRICS_DIR, RANK) so it needs neither torch nor an
installed rigdeck. Options: --steps N --sleep S --ignore-term --fail-rank R --fail-at STEP.
"""

import argparse
import json
import os
import signal
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--sleep", type=float, default=0.1)
ap.add_argument("--ignore-term", action="store_true")
ap.add_argument("--fail-rank", type=int, default=None)
ap.add_argument("--fail-at", type=int, default=None)
args = ap.parse_args()
if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank = int(os.environ.get("RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
mdir = os.environ.get("RIGDECK_METRICS_DIR")
fd = os.open(os.path.join(mdir, f"rank-{rank}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND) if mdir else None
restart = os.environ.get("RIGDECK_RESTART_COUNT", "0")
print(f"rank {rank} starting (restart {restart}) on {os.environ.get('RIGDECK_CURRENT_HOST')}", flush=True)
for step in range(args.steps):
    loss = 1.0 / (step + 1)
    print(f"rank {rank} step={step} loss={loss:.6f}", flush=True)
    if fd is not None:
        os.write(fd, (json.dumps({"time": time.time(), "rank": rank, "step": step, "loss": loss}) + "\n").encode())
    if args.fail_rank == rank and args.fail_at == step:
        print("failing on purpose", file=sys.stderr, flush=True)
        sys.exit(3)
    time.sleep(args.sleep)
print(f"rank {rank} done", flush=True)
