"""A training loop's timing for the live signals: each step waits for its batch (through
runtime.timed) and works, and reports; one rank can be slower, the loader can be slow.

Options: --steps N --work S (seconds a step works) --slow-rank R --slow-extra S (rank R works
S more every step) --loader-sleep S (each batch takes S to come) --ddp N (synchronous training:
a Linear(N, N) in DDP over gloo, its all-reduce timed by runtime.comm_timer; the work and the
sleeps happen before the backward pass, so fast ranks wait for slow ones inside the all-reduce).
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
ap.add_argument("--ddp", type=int, default=0)
args = ap.parse_args()
rank = runtime.cluster_info().rank
model = None
if args.ddp:
    import torch

    torch.set_num_threads(1)
    runtime.init_distributed("gloo")
    model = runtime.ddp(torch.nn.Linear(args.ddp, args.ddp))
    runtime.comm_timer(model)


def loader():
    for i in range(args.steps):
        if args.loader_sleep:
            time.sleep(args.loader_sleep)
        yield i


for step, _batch in enumerate(runtime.timed(loader())):
    time.sleep(args.work + (args.slow_extra if rank == args.slow_rank else 0.0))
    if model is not None:
        model(torch.ones(2, args.ddp)).sum().backward()
    runtime.report(step=step, loss=1.0 / (step + 1))
print(f"rank {rank} done", flush=True)
if model is not None:
    runtime.finish()  # every rank meets, then this process ends here: nothing torn down
