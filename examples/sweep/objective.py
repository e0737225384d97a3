"""A training stand-in whose optimum is known, for sweeps: a loss curve shaped by three
hyperparameters, reported every step the way the sweep asks.

Not a model: ``val_loss`` at step ``s`` is ``floor(lr, width, optimizer) + 1.5 * exp(-rate * s)``,
where ``floor`` is 0 exactly at lr = 0.01, width = 128, optimizer = "adamw" and grows away from
it (a quadratic bowl in log10(lr) and in width, plus a penalty per optimizer), and ``rate`` is
slower for a tiny learning rate. So a sweep's result can be checked against the truth: the best
possible final ``val_loss`` is ``1.5 * exp(-rate * steps)`` above 0, and a pruner that stops a
trial early sees the same order of trials as their final values (curves do not cross much).

Reports ``val_loss`` by ``--report``:
  runtime    runtime.report(step=s, val_loss=v)          (rigdeck's metrics file)
  print      a line "step=S val_loss=V" on stdout         (for [[sweep.metric_definitions]])
  hypertune  hypertune.HyperTune().report_hyperparameter_tuning_metric(...)  (Vertex's library)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

OPTIMUM = {"lr": 0.01, "width": 128, "optimizer": "adamw"}
PENALTY = {"adamw": 0.0, "adam": 0.05, "sgd": 0.3}


def floor(lr: float, width: int, optimizer: str) -> float:
    return (math.log10(lr) + 2.0) ** 2 / 4.0 + ((width - 128) / 128.0) ** 2 + PENALTY[optimizer]


def val_loss(lr: float, width: int, optimizer: str, step: int) -> float:
    rate = 0.08 + 0.12 * min(1.0, lr / 0.01)
    return floor(lr, width, optimizer) + 1.5 * math.exp(-rate * step)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--width", type=int, required=True)
    ap.add_argument("--optimizer", choices=sorted(PENALTY), required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--step-seconds", type=float, default=0.1)
    ap.add_argument("--report", choices=("runtime", "print", "hypertune"), default="runtime")
    args = ap.parse_args()
    rank = int(os.environ.get("RANK", os.environ.get("RIGDECK_RANK", "0")))
    reporter = None
    if args.report == "runtime":
        import runtime

        reporter = runtime.report
    elif args.report == "hypertune":
        import hypertune

        reporter = hypertune.HyperTune().report_hyperparameter_tuning_metric
    for step in range(1, args.steps + 1):
        time.sleep(args.step_seconds)
        v = val_loss(args.lr, args.width, args.optimizer, step)
        if args.report == "runtime":
            reporter(step=step, val_loss=v)
        elif args.report == "hypertune":
            if rank == 0:
                reporter(hyperparameter_metric_tag="val_loss", metric_value=v, global_step=step)
        else:
            print(f"step={step} val_loss={v:.6f}", flush=True)
    if rank == 0:
        print(json.dumps({"trial": os.environ.get("RIGDECK_TRIAL"), "final_val_loss": v}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
