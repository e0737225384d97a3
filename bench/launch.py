"""Launch latency and training speed under rigdeck against the same job started by hand.

3 test bed hosts x 2 ranks, the ddp example (gloo on CPU), torchrun on every host.
- rigdeck:   `rigdeck launch job.toml` (placement, cluster files, agents start torchrun).
- baseline:  the same torchrun command on every host at once over plain `ssh host torchrun ...`,
             with the rendezvous written by hand, as people do today.
Both sides time their steps the same way: the example's `runtime.report()` lines (the baseline
gets RIGDECK_METRICS_DIR too, so its ranks write the same per-step timestamps).
Launch latency = time from the command to the last rank's first step; speed = steps/s of rank 0
over its last four fifths of steps. Rounds alternate the two sides; medians are reported.
Needs root (the network-namespace test bed). Usage: python bench/launch.py [--rounds 3] [--steps 150]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402
from tests.testbed import TestBed, available  # noqa: E402

SCRIPT = ROOT / "examples" / "ddp" / "train.py"
NODES, PER_NODE = 3, 2


def read_metrics(dirs: list[Path]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for d in dirs:
        for f in d.glob("rank-*.jsonl"):
            # runtime.report()'s rank-<N>.jsonl only: the agent keeps losses it parsed from a
            # rank's output in rank-<N>.stdout.jsonl beside it.
            rank_s = f.name[len("rank-"):-len(".jsonl")]
            if not rank_s.isdigit():
                continue
            rank = int(rank_s)
            recs = []
            for line in f.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if "loss" in rec and rec.get("event") is None:
                    recs.append(rec)
            out[rank] = recs
    return out


def wait_steps(dirs_fn, steps: int, timeout: float) -> dict[int, list[dict]]:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = read_metrics(dirs_fn())
        if len(m) == NODES * PER_NODE and all(len(v) >= steps for v in m.values()):
            return m
        time.sleep(0.1)
    raise TimeoutError(f"ranks did not reach {steps} steps in {timeout}s")


def summarize(m: dict[int, list[dict]], t0: float) -> tuple[float, float]:
    first = max(recs[0]["time"] for recs in m.values())
    r0 = m[0][len(m[0]) // 5:]  # steady state: skip the first fifth (warm-up, stragglers)
    rate = (len(r0) - 1) / (r0[-1]["time"] - r0[0]["time"])
    return first - t0, rate


def run_rigdeck(bed: TestBed, tmp: Path, steps: int, env: dict[str, str]) -> tuple[float, float]:
    spec = tmp / "job.toml"
    spec.write_text(
        'name = "bench-ddp"\n'
        f'command = ["{{python}}", "{SCRIPT}", "--steps", "{steps}", "--checkpoint-every", "100000"]\n'
        f'workdir = "{ROOT}"\nlauncher = "torchrun"\nnodes = {NODES}\nprocesses_per_node = {PER_NODE}\n'
        '[env]\nOMP_NUM_THREADS = "1"\n'
    )
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "tui.cli", "launch", str(spec), "--json"],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    job_id = json.loads(out.stdout)["job_id"]
    dirs = lambda: [h.state_dir / "jobs" / job_id / "metrics" for h in bed.hosts]  # noqa: E731
    m = wait_steps(dirs, steps, 600)
    subprocess.run([sys.executable, "-m", "tui.cli", "status", job_id], capture_output=True, env=env, cwd=ROOT)
    return summarize(m, t0)


def run_by_hand(bed: TestBed, tmp: Path, steps: int, port: int) -> tuple[float, float]:
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
            "--checkpoint-every", "100000", "--checkpoint-dir", str(ckpt),
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
    return summarize(m, t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "launch.json"))
    args = ap.parse_args()
    meta = run_meta()
    ok, why = available()
    if not ok:
        print(f"bench/launch.py needs the test bed: {why}", file=sys.stderr)
        return 2
    with TestBed(NODES, sim_gpus=0) as bed, tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        inv = bed.write_inventory(tmp / "hosts.toml", python=sys.executable)
        env = {**os.environ, "RIGDECK_INVENTORY": str(inv), "RIGDECK_HOME": str(tmp / "home")}
        # Deploy first, as a user would have: launch latency is about starting jobs, not installs.
        subprocess.run([sys.executable, "-m", "tui.cli", "deploy"], env=env, cwd=ROOT, check=True,
                       capture_output=True)
        ours, hand = [], []
        for r in range(args.rounds):
            hand.append(run_by_hand(bed, tmp, args.steps, 29400 + r))
            ours.append(run_rigdeck(bed, tmp, args.steps, env))
            print(f"round {r + 1}: by hand launch {hand[-1][0]:.2f}s {hand[-1][1]:.2f} steps/s | "
                  f"rigdeck launch {ours[-1][0]:.2f}s {ours[-1][1]:.2f} steps/s", flush=True)
    lat_h = statistics.median(x[0] for x in hand)
    lat_o = statistics.median(x[0] for x in ours)
    sps_h = statistics.median(x[1] for x in hand)
    sps_o = statistics.median(x[1] for x in ours)
    print(f"\n{NODES} hosts x {PER_NODE} ranks, ddp example, {args.steps} steps, median of {args.rounds}")
    print(f"  launch to every rank's first step: by hand {lat_h:.2f} s, rigdeck {lat_o:.2f} s, "
          f"ratio {lat_o / lat_h:.2f}x (target <= 1.3x)")
    print(f"  training speed (rank 0):            by hand {sps_h:.2f} steps/s, rigdeck {sps_o:.2f} steps/s, "
          f"ratio {sps_o / sps_h:.3f} (target >= 0.98)")
    result = {"rounds": args.rounds, "steps": args.steps, "by_hand": hand, "rigdeck": ours,
              "median": {"launch_by_hand_s": lat_h, "launch_rigdeck_s": lat_o,
                         "steps_per_s_by_hand": sps_h, "steps_per_s_rigdeck": sps_o},
              "ratio_launch": lat_o / lat_h, "ratio_steps_per_s": sps_o / sps_h}
    write_result(args.out, result, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
