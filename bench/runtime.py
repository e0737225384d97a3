"""Runtime costs inside a training rank: report() per call, and checkpoint save throughput.

(a) ``runtime.report(step=i, loss=x)`` per call, in microseconds, over many calls: with
    RIGDECK_METRICS_DIR set (one JSON line appended per call) and unset (the no-op). Best and
    median of several rounds. Target: under 20 us per call with the directory set.
(b) ``Checkpointer.save`` of a 512 MiB state (one float32 tensor) under the rank0 policy: write to
    a temporary name while hashing (sha256), fsync, rename, manifest, ``latest`` (deleting older
    checkpoints is left out of the timing, like deleting dd's file) -- against
    ``dd if=/dev/zero of=... bs=16M count=32 conv=fsync`` writing the same number of bytes to the
    same directory. Both alternate in one run (each after an ``os.sync()``), each repeated; the
    ratio is of the medians.
    Target: save throughput >= 0.8 of dd's.

Usage: .venv/bin/python bench/runtime.py [--dir DIR] [--rounds 3] [--calls 200000]
Writes bench/results/runtime.json.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402
from runtime import metrics  # noqa: E402
from runtime.checkpoint import Checkpointer  # noqa: E402

MIB = 1 << 20
STATE_BYTES = 512 * MIB
TARGET_REPORT_US = 20.0
TARGET_RATIO = 0.8


def report_cost(calls: int, rounds: int, metrics_dir: str | None) -> dict[str, Any]:
    metrics.reset()
    if metrics_dir is None:
        os.environ.pop("RIGDECK_METRICS_DIR", None)
    else:
        os.environ["RIGDECK_METRICS_DIR"] = metrics_dir
        os.environ.setdefault("RIGDECK_RANK", "0")
    report = metrics.report
    report(step=0, loss=1.0)  # opens the file
    per_call = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for i in range(calls):
            report(step=i, loss=0.123456789 * i)
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
    metrics.reset()
    os.environ.pop("RIGDECK_METRICS_DIR", None)
    return {"calls": calls, "us_per_call": per_call, "best_us": min(per_call),
            "median_us": statistics.median(per_call)}


def time_dd(directory: Path) -> float:
    target = directory / "dd.bin"
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=16M",
                    f"count={STATE_BYTES // (16 * MIB)}", "conv=fsync"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    assert target.stat().st_size == STATE_BYTES
    target.unlink()
    return elapsed


def time_save(directory: Path, step: int, state: dict[str, Any]) -> tuple[float, int]:
    # keep=None: deleting older checkpoints is housekeeping, not writing; it happens (untimed)
    # below, as dd's file is deleted untimed.
    ckpt = Checkpointer(str(directory / "ckpt"), "rank0", keep=None, environ={
        "SAGEMAKER_BASE_DIR": str(directory / "no-sagemaker")})
    t0 = time.perf_counter()
    path = ckpt.save(step, state)
    elapsed = time.perf_counter() - t0
    assert path is not None
    size = os.path.getsize(path)
    shutil.rmtree(directory / "ckpt")
    return elapsed, size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=None, help="where to write (default: a new temporary dir)")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=200_000)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "runtime.json"))
    args = p.parse_args()
    meta = run_meta()

    import torch

    work = Path(tempfile.mkdtemp(prefix="rigdeck-bench-runtime-", dir=args.dir))
    load_before = os.getloadavg()[0]
    try:
        on = report_cost(args.calls, args.rounds, str(work / "metrics"))
        off = report_cost(args.calls, args.rounds, None)
        print(f"report(): {on['median_us']:.2f} us/call with RIGDECK_METRICS_DIR "
              f"(best {on['best_us']:.2f}), {off['median_us']:.3f} us/call without "
              f"(target < {TARGET_REPORT_US} us)")

        state = {"weights": torch.ones(STATE_BYTES // 4, dtype=torch.float32)}
        dd_s: list[float] = []
        save_s: list[float] = []
        file_bytes = 0
        time_dd(work)  # warm-up, both sides: first allocation of blocks, first imports
        time_save(work, 0, state)
        for r in range(args.rounds):
            # Alternate which goes first; start each from a clean page cache (no dirty pages
            # of the other one still being written back).
            for which in (("dd", "save") if r % 2 == 0 else ("save", "dd")):
                os.sync()
                if which == "dd":
                    dd_s.append(time_dd(work))
                else:
                    elapsed, file_bytes = time_save(work, r, state)
                    save_s.append(elapsed)
            print(f"round {r}: dd {STATE_BYTES / MIB / dd_s[-1]:.0f} MiB/s, "
                  f"save {file_bytes / MIB / save_s[-1]:.0f} MiB/s", flush=True)
        dd_mibs = STATE_BYTES / MIB / statistics.median(dd_s)
        save_mibs = file_bytes / MIB / statistics.median(save_s)
        ratio = save_mibs / dd_mibs
        print(f"checkpoint save: {save_mibs:.0f} MiB/s vs dd conv=fsync {dd_mibs:.0f} MiB/s "
              f"(medians of {args.rounds}): ratio {ratio:.2f} (target >= {TARGET_RATIO})")
        result = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "torch": torch.__version__, "platform": platform.platform(),
                        # other work on the machine skews both sides; hashing suffers most
                        "load_average_1m": [load_before, os.getloadavg()[0]]},
            "report": {"with_metrics_dir": on, "without_metrics_dir": off,
                       "target_us": TARGET_REPORT_US,
                       "meets_target": on["median_us"] < TARGET_REPORT_US},
            "checkpoint": {
                "state_bytes": STATE_BYTES, "file_bytes": file_bytes, "dir": str(work),
                "dd_seconds": dd_s, "save_seconds": save_s,
                "dd_mib_s": dd_mibs, "save_mib_s": save_mibs, "ratio": ratio,
                "target_ratio": TARGET_RATIO, "meets_target": ratio >= TARGET_RATIO,
            },
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_result(args.out, result, meta)


if __name__ == "__main__":
    main()
