"""A rank that prints links to experiment trackers as the trackers print them, colours and all:
rank 0 what ``wandb.init()`` and ``wandb.finish()`` print (its project line, the run's line twice),
the other ranks what MLflow logs when a run ends (the run's and the experiment's line). Then exits 0.
It imports neither tracker: the lines are written as they would appear on the rank's output."""

import os
import sys

WANDB_RUN = "https://wandb.ai/acme/llm-pretrain/runs/3kx9q2vb"
MLFLOW = "http://10.213.1.5:5000/#/experiments/7"
MLFLOW_RUN = MLFLOW + "/runs/0f1e2d3c4b5a69788796a5b4c3d2e1f0"
BLUE, BOLD, UNDER, YELLOW, RESET = "\x1b[34m", "\x1b[1m", "\x1b[4m", "\x1b[33m", "\x1b[0m"
WANDB = BLUE + BOLD + "wandb" + RESET + ":"

rank = int(os.environ.get("RANK") or 0)
if rank == 0:
    print(WANDB + " Tracking run with wandb version 0.17.0", file=sys.stderr)
    print(WANDB + " Syncing run " + YELLOW + "gallant-sun-12" + RESET, file=sys.stderr)
    print(WANDB + " ⭐️ View project at " + BLUE + UNDER + "https://wandb.ai/acme/llm-pretrain" + RESET, file=sys.stderr)
    print(WANDB + " 🚀 View run at " + BLUE + UNDER + WANDB_RUN + RESET, file=sys.stderr, flush=True)
    for step in range(3):
        print(f"step={step} loss={1.0 / (step + 1):.3f}", flush=True)
    print(WANDB + " 🚀 View run " + YELLOW + "gallant-sun-12" + RESET + " at: " + BLUE + UNDER + WANDB_RUN + RESET,
          file=sys.stderr, flush=True)
else:
    prefix = "2024/06/01 10:15:02 INFO mlflow.tracking._tracking_service.client: "
    print(prefix + "🏃 View run bemused-finch-123 at: " + MLFLOW_RUN, file=sys.stderr)
    print(prefix + "🧪 View experiment at: " + MLFLOW, file=sys.stderr, flush=True)
