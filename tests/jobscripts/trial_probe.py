"""Runs in every rank of a sweep's trial: what does this rank see of its trial?

Reads the trial number and the parameters from every place a training script might: rigdeck's
RIGDECK_TRIAL, Vertex's CLUSTER_SPEC.task.trial, TF_CONFIG.task.trial (multi-node only) and
CLOUD_ML_TRIAL_ID, SageMaker's SM_HP_* and SM_HPS and the hyperparameters.json file, and the
command line the sweep filled in ({hp.NAME}). Writes them, as found, to
``<RIGDECK_JOB_DIR>/trial-probe/rank-<rank>.json`` for the test to compare with what the
controller recorded; rank 0 then reports the objective (``val_loss`` = the ``--x`` it was given).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import runtime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--x", type=float, required=True)
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--kind", required=True)
    args = ap.parse_args()
    env = os.environ
    rank = int(env.get("RANK", env.get("RIGDECK_RANK", "0")))
    cluster = json.loads(env.get("CLUSTER_SPEC") or "{}")
    tf = json.loads(env["TF_CONFIG"]) if "TF_CONFIG" in env else None
    config = env.get("SM_INPUT_CONFIG_DIR") or os.path.join(env.get("SAGEMAKER_BASE_DIR", ""), "input", "config")
    with open(os.path.join(config, "hyperparameters.json")) as f:
        hp_file = json.load(f)
    seen = {
        "rank": rank,
        "host": env.get("RIGDECK_CURRENT_HOST"),
        "RIGDECK_TRIAL": env.get("RIGDECK_TRIAL"),
        "RIGDECK_SWEEP_ID": env.get("RIGDECK_SWEEP_ID"),
        "CLOUD_ML_TRIAL_ID": env.get("CLOUD_ML_TRIAL_ID"),
        "cluster_spec_trial": (cluster.get("task") or {}).get("trial"),
        "tf_config_trial": (tf.get("task") or {}).get("trial") if tf is not None else None,
        "tf_config": tf is not None,
        "SM_HP": {k[len("SM_HP_"):]: v for k, v in env.items() if k.startswith("SM_HP_")},
        "SM_HPS": json.loads(env.get("SM_HPS") or "null"),
        "hyperparameters.json": hp_file,
        "argv": {"x": args.x, "k": args.k, "kind": args.kind},
    }
    out = os.path.join(env["RIGDECK_JOB_DIR"], "trial-probe")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"rank-{rank}.json"), "w") as f:
        json.dump(seen, f)
    if rank == 0:
        runtime.report(step=1, val_loss=args.x)
    return 0


if __name__ == "__main__":
    sys.exit(main())
