"""A training loop's timing for the live signals: each step waits for its batch (through
runtime.timed) and works, and reports; one rank can be slower, the loader can be slow.

Options: --steps N --work S (seconds a step works) --slow-rank R --slow-extra S (rank R works
S more every step) --loader-sleep S (each batch takes S to come).
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
import runtime  # noqa: E402  (the checkout's runtime, found from this file)

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=300)
ap.add_argument("--work", type=float, default=0.1)
ap.add_argument("--slow-rank", type=int, default=None)
ap.add_argument("--slow-extra", type=float, default=0.0)
ap.add_argument("--loader-sleep", type=float, default=0.0)
args = ap.parse_args()
rank = runtime.cluster_info().rank


def loader():
    for i in range(args.steps):
        if args.loader_sleep:
            time.sleep(args.loader_sleep)
        yield i


for step, _batch in enumerate(runtime.timed(loader())):
    time.sleep(args.work + (args.slow_extra if rank == args.slow_rank else 0.0))
    runtime.report(step=step, loss=1.0 / (step + 1))
print(f"rank {rank} done", flush=True)
