"""Launch to first step through rigdeck on Slurm against a hand-written sbatch + srun torchrun.

A Slurm bed (tests/slurmbed.py: a real slurmctld and slurmd per host, simulated GPUs as GRES),
3 nodes x 2 GPUs, the ddp example (gloo on CPU), torchrun on every node.
- rigdeck:   `rigdeck launch job.toml` with `[slurm]` in the inventory: the [slurm] check, sbatch
             through the login host's agent, the allocation read, the plans to the agents, the job
             host started by srun in the step, cluster files, torchrun.
- baseline:  what a person writes by hand: one batch script that finds the first node's address
             with scontrol and runs `srun --ntasks-per-node=1 sh -c 'torchrun --node-rank
             $SLURM_NODEID --master-addr ADDR ...'` (the bed's node names do not resolve, so no
             c10d rendezvous by name), submitted with `sbatch -N 3 --gres=gpu:2` on the login host.
Both sides time their steps the same way: the example's `runtime.report()` lines (the baseline
gets RIGDECK_METRICS_DIR, so its ranks write the same per-step timestamps). Launch latency = time
from the command to the last rank's first step. Rounds alternate the two sides; medians are
reported with their ratio (rigdeck / by hand). Needs root (the test bed).
Usage: python bench/slurm.py [--rounds 3] [--steps 40]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import write_result  # noqa: E402
from bench.common import (  # noqa: E402
    NODES,
    PER_NODE,
    SCRIPT,
    bed_args,
    bed_env,
    job_metrics,
    launch,
    wait_first_steps,
    write_ddp_spec,
)
from tests import slurmbed  # noqa: E402
from tests.slurmbed import SlurmBed  # noqa: E402
from tests.testbed import TestBed, available  # noqa: E402

# The hand-written batch script: every value it needs comes in its environment (sbatch --export).
BY_HAND = """#!/bin/sh
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
addr=$(scontrol -o show node "$first" | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')
exec srun --ntasks-per-node=1 sh -c 'exec "$PY" -m torch.distributed.run --nnodes "$SLURM_NNODES" \\
  --nproc-per-node 2 --node-rank "$SLURM_NODEID" --master-addr "$0" --master-port "$PORT" \\
  "$TRAIN" --steps "$STEPS" --checkpoint-every 100000 --checkpoint-dir "$CKPT"' "$addr"
"""


def wait_gone(slurm: SlurmBed, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.2)


def run_rigdeck(bed: TestBed, slurm: SlurmBed, tmp: Path, steps: int, env: dict[str, str]) -> float:
    t0, job_id = launch(write_ddp_spec(tmp / "job.toml", "bench-slurm", steps, "gpus_per_node"), env)
    dirs = job_metrics(bed, job_id)
    first = wait_first_steps(dirs, 600)
    wait_gone(slurm)  # the job ran to its end (then rigdeck records it, at the next look)
    subprocess.run([sys.executable, "-m", "tui.cli", "status", job_id], capture_output=True, env=env, cwd=ROOT)
    return first - t0


def run_by_hand(slurm: SlurmBed, tmp: Path, steps: int, port: int) -> float:
    mdir = Path(tempfile.mkdtemp(dir=tmp))
    ckpt = Path(tempfile.mkdtemp(dir=tmp))
    script = tmp / "by-hand.sh"
    script.write_text(BY_HAND)
    script.chmod(0o755)
    exports = {"PY": sys.executable, "TRAIN": str(SCRIPT), "STEPS": str(steps), "CKPT": str(ckpt),
               "PORT": str(port), "RIGDECK_METRICS_DIR": str(mdir), "OMP_NUM_THREADS": "1",
               "GLOO_SOCKET_IFNAME": "eth0", "PYTHONPATH": str(ROOT)}
    t0 = time.time()
    slurm.run(["env", *[f"{k}={v}" for k, v in exports.items()], "sbatch", "--parsable", "-N", str(NODES),
               "--ntasks-per-node=1", f"--gres=gpu:{PER_NODE}", "--export=ALL", f"--output={tmp}/by-hand-%j.out",
               str(script)])
    try:
        first = wait_first_steps(lambda: [mdir], 300)
    except TimeoutError:
        for out in tmp.glob("by-hand-*.out"):
            print(f"--- {out.name}\n" + "\n".join(out.read_text().splitlines()[-20:]), file=sys.stderr)
        raise
    wait_gone(slurm)
    return first - t0


def main() -> int:
    parsed = bed_args(__doc__, "slurm", 40, "the test bed and Slurm", available, slurmbed.available)
    if parsed is None:
        return 2
    args, meta = parsed
    with TestBed(NODES, sim_gpus=4) as bed, tempfile.TemporaryDirectory(dir="/tmp") as tmpd:
        tmp = Path(tmpd)
        tmp.chmod(0o755)
        slurm = SlurmBed(bed).up()
        try:
            inv = bed.write_inventory(tmp / "hosts.toml", python=sys.executable)
            inv.write_text(inv.read_text() + '\n[slurm]\nlogin = "h1"\npartition = "bed"\n')
            env = bed_env(inv, tmp / "home")
            ours, hand = [], []
            for r in range(args.rounds):
                hand.append(run_by_hand(slurm, tmp, args.steps, 29400 + r))
                ours.append(run_rigdeck(bed, slurm, tmp, args.steps, env))
                print(f"round {r + 1}: by hand {hand[-1]:.2f}s | rigdeck {ours[-1]:.2f}s", flush=True)
        finally:
            slurm.down()
    lat_h, lat_o = statistics.median(hand), statistics.median(ours)
    print(f"\n{NODES} Slurm nodes x {PER_NODE} GPUs (simulated), ddp example, median of {args.rounds}")
    print(f"  launch to every rank's first step: sbatch + srun torchrun by hand {lat_h:.2f} s, "
          f"rigdeck on Slurm {lat_o:.2f} s, ratio {lat_o / lat_h:.2f}x")
    result = {"rounds": args.rounds, "steps": args.steps, "by_hand_s": hand, "rigdeck_s": ours,
              "median": {"launch_by_hand_s": lat_h, "launch_rigdeck_s": lat_o}, "ratio_launch": lat_o / lat_h}
    write_result(args.out, result, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
