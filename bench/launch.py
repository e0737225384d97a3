"""Launch latency and training speed under rigdeck against the same job started by hand.

3 test bed hosts x 2 ranks, the ddp example (gloo on CPU), torchrun on every host.
- rigdeck:   `rigdeck launch job.toml` (placement, cluster files, agents start torchrun).
- baseline:  the same torchrun command on every host at once over plain `ssh host torchrun ...`,
             with the rendezvous written by hand, as people do today.
Both sides time their steps the same way: the example's `runtime.report()` lines (the baseline
gets RIGDECK_METRICS_DIR too, so its ranks write the same per-step timestamps).
Launch latency = time from the command to the last rank's first step; speed = steps/s of rank 0
over its last four fifths of steps; training time = rank 0's first step to its last. Under
rigdeck the job runs as users get it: the job host's hang watch on, and the example's memory
snapshot of every step (``runtime.Checkpointer.snapshot`` into the host's tmpfs); by hand the
same script runs with ``--no-memory-snapshots`` (no healing to feed): the training time's ratio
is what healing costs when nothing fails, the snapshots' copies included.
Rounds alternate the two sides; medians are reported.
Needs root (the network-namespace test bed). Usage: python bench/launch.py [--rounds 3] [--steps 150]
"""

from __future__ import annotations

import random
import shlex
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
    summarize,
    training_s,
    wait_steps,
    write_ddp_spec,
)
from tests.testbed import TestBed, available  # noqa: E402


def run_rigdeck(bed: TestBed, tmp: Path, steps: int, env: dict[str, str]) -> tuple[float, float, float]:
    t0, job_id = launch(write_ddp_spec(tmp / "job.toml", "bench-ddp", steps), env)
    dirs = job_metrics(bed, job_id)
    m = wait_steps(dirs, steps, 600)
    subprocess.run([sys.executable, "-m", "tui.cli", "status", job_id], capture_output=True, env=env, cwd=ROOT)
    return (*summarize(m, t0), training_s(m))


def run_by_hand(bed: TestBed, tmp: Path, steps: int, port: int) -> tuple[float, float, float]:
    mdir = Path(tempfile.mkdtemp(dir=tmp))
    ckpt = Path(tempfile.mkdtemp(dir=tmp))
    master = bed.hosts[0].address
    t0 = time.time()
    procs = []
    logs = []
    for i, h in enumerate(bed.hosts):
        remote = shlex.join([
            # What a careful person types: gloo needs the interface when hostnames do not resolve.
            "env", "OMP_NUM_THREADS=1", "GLOO_SOCKET_IFNAME=eth0", f"RIGDECK_METRICS_DIR={mdir}",
            f"PYTHONPATH={ROOT}",
            sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES),
            "--nproc-per-node", str(PER_NODE), "--node-rank", str(i), "--master-addr", master,
            "--master-port", str(port), str(SCRIPT), "--steps", str(steps),
            "--checkpoint-every", "100000", "--checkpoint-dir", str(ckpt), "--no-memory-snapshots",
        ])
        procs.append(subprocess.Popen(
            ["ssh", "-i", str(bed.user_key), "-o", f"UserKnownHostsFile={bed.known_hosts}",
             "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", f"root@{h.address}", remote],
            stdout=subprocess.DEVNULL, stderr=open(tmp / f"hand-{i}.log", "w"),
        ))
        logs.append(tmp / f"hand-{i}.log")
    try:
        m = wait_steps(lambda: [mdir], steps, 300)
    except TimeoutError:
        for log in logs:
            print(f"--- {log.name}\n" + "\n".join(log.read_text().splitlines()[-15:]), file=sys.stderr)
        raise
    for p in procs:
        p.wait(60)
    return (*summarize(m, t0), training_s(m))


def training_spread(hand: list[float], ours: list[float], resamples: int = 4000,
                    seed: int = 0) -> dict[str, object]:
    """How far the training time's ratio can be read: each round's own ratio (rigdeck / by hand,
    the two sides of a round run one after the other), their median, and a 95% interval of the
    ratio of medians from resampling the rounds (pairs kept together; seeded, so a result file
    says the same each time it is computed)."""
    pairs = list(zip(hand, ours, strict=True))
    ratios = [o / h for h, o in pairs]
    rng = random.Random(seed)
    boot = []
    for _ in range(resamples):
        pick = [rng.choice(pairs) for _ in pairs]
        boot.append(statistics.median(o for _, o in pick) / statistics.median(h for h, _ in pick))
    boot.sort()
    low, high = boot[int(0.025 * resamples)], boot[int(0.975 * resamples) - 1]
    return {"round_ratios": ratios, "round_ratios_min": min(ratios), "round_ratios_max": max(ratios),
            "median_round_ratio": statistics.median(ratios), "interval_95": [low, high]}


def main() -> int:
    parsed = bed_args(__doc__, "launch", 150, "the test bed", available)
    if parsed is None:
        return 2
    args, meta = parsed
    with TestBed(NODES, sim_gpus=0) as bed, tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        env = bed_env(bed.write_inventory(tmp / "hosts.toml", python=sys.executable), tmp / "home")
        ours, hand = [], []
        for r in range(args.rounds):
            hand.append(run_by_hand(bed, tmp, args.steps, 29400 + r))
            ours.append(run_rigdeck(bed, tmp, args.steps, env))
            print(f"round {r + 1}: by hand launch {hand[-1][0]:.2f}s {hand[-1][1]:.2f} steps/s "
                  f"training {hand[-1][2]:.2f}s | rigdeck launch {ours[-1][0]:.2f}s {ours[-1][1]:.2f} steps/s "
                  f"training {ours[-1][2]:.2f}s", flush=True)
    lat_h = statistics.median(x[0] for x in hand)
    lat_o = statistics.median(x[0] for x in ours)
    sps_h = statistics.median(x[1] for x in hand)
    sps_o = statistics.median(x[1] for x in ours)
    train_h = statistics.median(x[2] for x in hand)
    train_o = statistics.median(x[2] for x in ours)
    print(f"\n{NODES} hosts x {PER_NODE} ranks, ddp example, {args.steps} steps, median of {args.rounds}")
    print(f"  launch to every rank's first step: by hand {lat_h:.2f} s, rigdeck {lat_o:.2f} s, "
          f"ratio {lat_o / lat_h:.2f}x (target <= 1.3x)")
    print(f"  training speed (rank 0):            by hand {sps_h:.2f} steps/s, rigdeck {sps_o:.2f} steps/s, "
          f"ratio {sps_o / sps_h:.3f} (target >= 0.98)")
    print(f"  training time (rank 0, every step): by hand {train_h:.2f} s, rigdeck {train_o:.2f} s, "
          f"ratio {train_o / train_h:.3f} (target <= 1.02)")
    spread = training_spread([x[2] for x in hand], [x[2] for x in ours])
    print(f"  the training time's rounds: their own ratios {spread['round_ratios_min']:.3f}-"
          f"{spread['round_ratios_max']:.3f}, median {spread['median_round_ratio']:.3f}; the ratio of "
          f"medians' 95% interval (bootstrap of the rounds) {spread['interval_95'][0]:.3f}-"
          f"{spread['interval_95'][1]:.3f}")
    result = {"rounds": args.rounds, "steps": args.steps, "by_hand": hand, "rigdeck": ours,
              "median": {"launch_by_hand_s": lat_h, "launch_rigdeck_s": lat_o,
                         "steps_per_s_by_hand": sps_h, "steps_per_s_rigdeck": sps_o,
                         "training_by_hand_s": train_h, "training_rigdeck_s": train_o},
              "ratio_launch": lat_o / lat_h, "ratio_steps_per_s": sps_o / sps_h,
              "ratio_training": train_o / train_h, "training_spread": spread}
    write_result(args.out, result, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
