"""A pipeline step for the tests: writes files into its SageMaker dirs, fails on purpose,
checks what it was given, reports metrics. Stdlib only (the runtime's report is used when the
job has it).

  --write NAME=TEXT       a file in output/data (NAME may hold the node rank as {node})
  --model NAME=TEXT       a file in the model dir (rank 0 only)
  --checkpoint NAME=TEXT  a file in the checkpoint dir (rank 0 only)
  --expect CH/NAME=TEXT   input/data/CH/NAME must hold TEXT (else exit 5)
  --expect-checkpoint NAME=TEXT  the checkpoint dir must hold NAME with TEXT before it writes
  --fail-attempts N       exit 4 while RIGDECK_STEP_ATTEMPT <= N
  --fail-unless PATH      exit 4 unless PATH exists (a file the test makes to "fix" the step)
  --metric NAME=VALUE     report it (step 1)
  --sleep S               sleep before finishing
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def pairs(items: list[str]) -> list[tuple[str, str]]:
    return [tuple(i.split("=", 1)) for i in items]  # type: ignore[misc]


def main() -> int:
    ap = argparse.ArgumentParser()
    for flag in ("--write", "--model", "--checkpoint", "--expect", "--expect-checkpoint", "--metric"):
        ap.add_argument(flag, action="append", default=[])
    ap.add_argument("--fail-attempts", type=int, default=0)
    ap.add_argument("--fail-unless")
    ap.add_argument("--sleep", type=float, default=0.0)
    a = ap.parse_args()
    node = int(os.environ.get("NODE_RANK", "0"))
    rank = int(os.environ.get("RANK", "0"))
    attempt = int(os.environ.get("RIGDECK_STEP_ATTEMPT", "1"))
    print(f"step {os.environ.get('RIGDECK_PIPELINE_STEP')} attempt {attempt} node {node} rank {rank} "
          f"on {os.environ.get('SM_CURRENT_HOST')}", flush=True)
    if attempt <= a.fail_attempts:
        print(f"failing attempt {attempt} on purpose", flush=True)
        return 4
    if a.fail_unless and not os.path.exists(a.fail_unless):
        print(f"failing: {a.fail_unless} is not there", flush=True)
        return 4
    base = os.environ["SAGEMAKER_BASE_DIR"]
    for spec, text in pairs(a.expect):
        path = os.path.join(base, "input", "data", spec)
        try:
            got = open(path).read()
        except OSError as e:
            print(f"missing input {path}: {e}", flush=True)
            return 5
        if got != text:
            print(f"input {path} holds {got!r}, not {text!r}", flush=True)
            return 5
    ckpt = os.environ["RIGDECK_CHECKPOINT_DIR"]
    for name, text in pairs(a.expect_checkpoint):
        path = os.path.join(ckpt, name)
        try:
            got = open(path).read()
        except OSError as e:
            print(f"missing checkpoint {path}: {e}", flush=True)
            return 5
        if got != text:
            print(f"checkpoint {path} holds {got!r}, not {text!r}", flush=True)
            return 5
    for name, text in pairs(a.write):
        with open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], name.replace("{node}", str(node))), "w") as f:
            f.write(text)
    if rank == 0:
        for name, text in pairs(a.model):
            with open(os.path.join(os.environ["SM_MODEL_DIR"], name), "w") as f:
                f.write(text)
        for name, text in pairs(a.checkpoint):
            with open(os.path.join(ckpt, name), "w") as f:
                f.write(text)
        if a.metric:
            import runtime

            runtime.report(step=1, **{k: float(v) for k, v in pairs(a.metric)})
    time.sleep(a.sleep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
