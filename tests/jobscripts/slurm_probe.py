"""Inside a rank of a job launched through Slurm: what the rank saw, written to
``<dir>/<SLURMD_NODENAME>-r<RANK>.json`` (Slurm's and rigdeck's views of the allocation: the
Slurm job, the GPUs, the cluster files' variables), then the rest of the command run in its
place (``slurm_probe.py DIR -- python train.py ...``). Stdlib only."""

from __future__ import annotations

import json
import os
import sys

NAMES = ("SLURM_JOB_ID", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURMD_NODENAME", "SLURM_NODEID", "CUDA_VISIBLE_DEVICES",
         "RANK", "LOCAL_RANK", "WORLD_SIZE", "SM_CURRENT_HOST", "SM_HOSTS", "SAGEMAKER_BASE_DIR", "CLUSTER_SPEC",
         "TF_CONFIG", "RIGDECK_HOSTFILE", "MASTER_ADDR", "RIGDECK_JOB_ID")


def main() -> None:
    out, rest = sys.argv[1], sys.argv[sys.argv.index("--") + 1:]
    seen = {n: os.environ.get(n) for n in NAMES}
    seen["SM"] = {k: v for k, v in os.environ.items() if k.startswith("SM_")}
    seen["pid"] = os.getpid()
    path = os.path.join(out, f"{os.environ.get('SLURMD_NODENAME')}-r{os.environ.get('RANK')}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(seen, f)
    os.replace(path + ".tmp", path)
    os.execvp(rest[0], rest)


if __name__ == "__main__":
    main()
