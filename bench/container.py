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

import json
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
    bed_args,
    bed_env,
    job_metrics,
    launch,
    summarize,
    wait_steps,
    write_ddp_spec,
)
from tests import containerimage  # noqa: E402
from tests.testbed import TestBed, available  # noqa: E402


def run(bed: TestBed, tmp: Path, steps: int, env: dict[str, str], image: str | None) -> tuple[float, float]:
    extra = f'[container]\nimage = "{image}"\n' if image else ""
    t0, job_id = launch(write_ddp_spec(tmp / "job.toml", "bench-container", steps, extra=extra), env)
    dirs = job_metrics(bed, job_id)
    m = wait_steps(dirs, steps, 900)
    for _ in range(300):  # the job's end (its containers removed) before the next round starts
        st = subprocess.run([sys.executable, "-m", "tui.cli", "status", job_id, "--json"], capture_output=True,
                            text=True, env=env, cwd=ROOT)
        if st.returncode == 0 and json.loads(st.stdout)["state"] in ("succeeded", "failed", "stopped"):
            break
        time.sleep(1)
    return summarize(m, t0)


def main() -> int:
    parsed = bed_args(__doc__, "container", 150, "the test bed", available)
    if parsed is None:
        return 2
    args, meta = parsed
    image = containerimage.ensure()
    with TestBed(NODES, sim_gpus=0) as bed, tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        env = bed_env(bed.write_inventory(tmp / "hosts.toml", python=sys.executable), tmp / "home")
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
