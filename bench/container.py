"""Training speed and start-up of a `[container]` job against the same job on the hosts.

3 test bed hosts x 2 ranks, the ddp example (gloo on CPU), torchrun on every host, launched by
rigdeck both times:
- baseline:  the job as it is, its ranks on the hosts (the suite's Python and torch);
- container: the same spec with `[container] image = <the test image>` (tests/containerimage.py:
             Debian bookworm's python3 with the same torch 2.13 CPU build), one container per host.
Both sides time their steps the same way (the example's `runtime.report()` records). Start-up =
time from the launch command to the last rank's first step; speed = steps/s of rank 0 over its
last four fifths of steps. Rounds alternate the two sides; medians are reported, with the ratio
container / host. Needs root, podman and the test image (`make image`).
Usage: python bench/container.py [--rounds 3] [--steps 150]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402
from bench.launch import NODES, PER_NODE, SCRIPT, summarize, wait_steps  # noqa: E402
from tests import containerimage  # noqa: E402
from tests.testbed import TestBed, available  # noqa: E402


def run(bed: TestBed, tmp: Path, steps: int, env: dict[str, str], image: str | None) -> tuple[float, float]:
    spec = tmp / "job.toml"
    spec.write_text(
        'name = "bench-container"\n'
        f'command = ["{{python}}", "{SCRIPT}", "--steps", "{steps}", "--checkpoint-every", "100000"]\n'
        f'workdir = "{ROOT}"\nlauncher = "torchrun"\nnodes = {NODES}\nprocesses_per_node = {PER_NODE}\n'
        '[env]\nOMP_NUM_THREADS = "1"\n'
        + (f'[container]\nimage = "{image}"\n' if image else "")
    )
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "tui.cli", "launch", str(spec), "--json"],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    job_id = json.loads(out.stdout)["job_id"]
    dirs = lambda: [h.state_dir / "jobs" / job_id / "metrics" for h in bed.hosts]  # noqa: E731
    m = wait_steps(dirs, steps, 900)
    for _ in range(300):  # the job's end (its containers removed) before the next round starts
        st = subprocess.run([sys.executable, "-m", "tui.cli", "status", job_id, "--json"], capture_output=True,
                            text=True, env=env, cwd=ROOT)
        if st.returncode == 0 and json.loads(st.stdout)["state"] in ("succeeded", "failed", "stopped"):
            break
        time.sleep(1)
    return summarize(m, t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "container.json"))
    args = ap.parse_args()
    meta = run_meta()
    ok, why = available()
    if not ok:
        print(f"bench/container.py needs the test bed: {why}", file=sys.stderr)
        return 2
    image = containerimage.ensure()
    with TestBed(NODES, sim_gpus=0) as bed, tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        inv = bed.write_inventory(tmp / "hosts.toml", python=sys.executable)
        env = {**os.environ, "RIGDECK_INVENTORY": str(inv), "RIGDECK_HOME": str(tmp / "home")}
        subprocess.run([sys.executable, "-m", "tui.cli", "deploy"], env=env, cwd=ROOT, check=True,
                       capture_output=True)
        host, boxed = [], []
        for r in range(args.rounds):
            host.append(run(bed, tmp, args.steps, env, None))
            boxed.append(run(bed, tmp, args.steps, env, image))
            print(f"round {r + 1}: host start {host[-1][0]:.2f}s {host[-1][1]:.2f} steps/s | "
                  f"container start {boxed[-1][0]:.2f}s {boxed[-1][1]:.2f} steps/s", flush=True)
    start_h = statistics.median(x[0] for x in host)
    start_c = statistics.median(x[0] for x in boxed)
    sps_h = statistics.median(x[1] for x in host)
    sps_c = statistics.median(x[1] for x in boxed)
    print(f"\n{NODES} hosts x {PER_NODE} ranks, ddp example, {args.steps} steps, median of {args.rounds}")
    print(f"  launch to every rank's first step: host {start_h:.2f} s, container {start_c:.2f} s, "
          f"ratio {start_c / start_h:.2f}x")
    print(f"  training speed (rank 0):            host {sps_h:.2f} steps/s, container {sps_c:.2f} steps/s, "
          f"ratio {sps_c / sps_h:.3f}")
    result = {"rounds": args.rounds, "steps": args.steps, "image": image, "host": host, "container": boxed,
              "median": {"start_host_s": start_h, "start_container_s": start_c,
                         "steps_per_s_host": sps_h, "steps_per_s_container": sps_c},
              "ratio_start": start_c / start_h, "ratio_steps_per_s": sps_c / sps_h}
    write_result(args.out, result, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
