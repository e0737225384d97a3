"""Where does this rank run: in a container, or on the host itself? For the tests of containers
at a sweep's, a pipeline's and a worker pool's grain (tests/test_container_grains.py).

Records, as this rank finds them: ``/run/.containerenv`` (Podman makes it in every container it
runs; the bed's hosts have none), its own cgroup (a Podman container's holds ``libpod``), its
Python and the rank's place (pool, trial, pipeline step, host). The record goes to
``<RIGDECK_JOB_DIR>/where/<pool or "rank">-<rank>.json`` and to the log (a ``where: `` line).
Stdlib only (``runtime`` only with ``--report``).

  --report X         rank 0 reports val_loss = X (a sweep's objective)
  --output NAME      the record also into SM_OUTPUT_DATA_DIR/NAME (a pipeline step's artifact)
  --input CH/NAME    input/data/CH/NAME must hold an earlier record (else exit 5); it goes into
                     this one's, under "input"
  --until NAME       wait (at most 120 s) until <job dir>/where/NAME exists, then end 0
  --serve            wait until stopped (SIGTERM: exit 0)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def record() -> dict[str, object]:
    env = os.environ
    try:
        with open("/proc/self/cgroup") as f:
            cgroup = f.read()
    except OSError:
        cgroup = ""
    return {
        "containerenv": os.path.exists("/run/.containerenv"),
        "cgroup": cgroup,
        "libpod": "libpod" in cgroup,
        "python": sys.executable,
        "prefix": sys.prefix,
        "pid": os.getpid(),
        "host": env.get("RIGDECK_CURRENT_HOST"),
        "rank": env.get("RIGDECK_RANK"),
        "pool": env.get("RIGDECK_POOL"),
        "trial": env.get("RIGDECK_TRIAL"),
        "step": env.get("RIGDECK_PIPELINE_STEP"),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--report", type=float)
    ap.add_argument("--output")
    ap.add_argument("--input")
    ap.add_argument("--until")
    ap.add_argument("--serve", action="store_true")
    a = ap.parse_args()
    seen = record()
    if a.input:
        path = os.path.join(os.environ["SAGEMAKER_BASE_DIR"], "input", "data", a.input)
        try:
            with open(path) as f:
                seen["input"] = json.load(f)
        except (OSError, ValueError) as e:
            print(f"no record at {path}: {e}", flush=True)
            return 5
    text = json.dumps(seen)
    print("where: " + text, flush=True)
    out = os.path.join(os.environ["RIGDECK_JOB_DIR"], "where")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{seen['pool'] or 'rank'}-{seen['rank']}.json"), "w") as f:
        f.write(text)
    if a.output:
        with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], a.output), "w") as f:
            f.write(text)
    if a.report is not None and seen["rank"] in ("0", None):
        import runtime

        runtime.report(step=1, val_loss=a.report)
    if a.until:
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(out, a.until)) and time.monotonic() < deadline:
            time.sleep(0.2)
    if a.serve:
        signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
        while True:
            time.sleep(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
