"""The doctor's all-reduce bus bandwidth against a plain torch.distributed timing loop by hand.

On a 3-host test bed: ``rigdeck doctor --checks allreduce`` (1, 4, 16, 64 MB on CPU, 2 warm-up
and 10 timed all-reduces each, one rank per host over gloo) and ``rigdeck launch`` of
``tests/jobscripts/allreduce_loop.py`` (the same sizes, warm-up and iterations, written without
rigdeck), taking turns ``--rounds`` times, which goes first alternating. Both are compared at
64 MB. The bed's 3 hosts share this machine's cores, and other load only ever slows a run down:
each side's figure is its best round (the median is printed too). Target: within 10%.

Usage: .venv/bin/python bench/doctor_busbw.py [--rounds 7]
Writes bench/results/doctor_busbw.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402
from tests.testbed import TestBed  # noqa: E402

LOOP = ROOT / "tests" / "jobscripts" / "allreduce_loop.py"
SIZE_MB = 64


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "doctor_busbw.json"))
    args = ap.parse_args()
    meta = run_meta()
    print(f"commit {meta['commit']}, {os.cpu_count()} cores, load {meta['machine']['loadavg_at_start']}", flush=True)
    doctor: list[float] = []
    hand: list[float] = []
    with TestBed(3) as bed, tempfile.TemporaryDirectory() as tmp:
        inv = bed.write_inventory(Path(tmp) / "hosts.toml", python=sys.executable, connect_timeout=5.0)
        env = {**os.environ, "RIGDECK_HOME": str(Path(tmp) / "home"), "RIGDECK_INVENTORY": str(inv)}
        spec = Path(tmp) / "loop.toml"
        spec.write_text(f'name = "plain-allreduce"\ncommand = ["{{python}}", "{LOOP}", "1,4,16,{SIZE_MB}", "10", "2"]\n'
                        f'workdir = "{ROOT}"\nhosts = ["h1", "h2", "h3"]\nprocesses_per_node = 1\n')

        def cli(*a: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "tui.cli", *a], capture_output=True, text=True,
                                  env=env, cwd=ROOT, timeout=600)

        cli("deploy")
        def by_doctor() -> None:
            rep = json.loads(cli("doctor", "--checks", "allreduce", "--json").stdout)
            (ar,) = [f for f in rep["findings"] if f["check"] == "allreduce"]
            doctor.append(float(dict(ar["details"])[f"{SIZE_MB}MB"]["busbw_gbps"]))

        def by_hand() -> None:
            view = json.loads(cli("launch", str(spec), "--wait", "--json").stdout)
            logs = cli("logs", view["job_id"]).stdout
            found = {int(m.group(1)): float(m.group(2)) for m in re.finditer(
                r"plain-allreduce size_bytes=(\d+) time_s=[\d.]+ busbw_gbps=([\d.]+)", logs)}
            hand.append(found[SIZE_MB << 20])

        for r in range(args.rounds):
            # Which goes first alternates: a run just after another shares the cores with what
            # is left of it (ranks exiting, the agents' bookkeeping).
            for run in ((by_doctor, by_hand) if r % 2 == 0 else (by_hand, by_doctor)):
                run()
            print(f"round {r + 1} ({'doctor' if r % 2 == 0 else 'plain loop'} first): doctor {doctor[-1]:.4f} GB/s, "
                  f"plain loop {hand[-1]:.4f} GB/s", flush=True)
    d, p = max(doctor), max(hand)
    dm, pm = statistics.median(doctor), statistics.median(hand)
    ratio = d / p
    print(f"busbw at {SIZE_MB} MB over 3 hosts (gloo), {args.rounds} rounds taking turns:")
    print(f"  rigdeck doctor       best {d:.4f} GB/s  (median {dm:.4f})")
    print(f"  plain loop by hand   best {p:.4f} GB/s  (median {pm:.4f})")
    print(f"  doctor / plain       {ratio:.3f} best, {dm / pm:.3f} median "
          f"(target within 10%: {'met' if abs(ratio - 1) <= 0.10 else 'missed'})")
    write_result(args.out, {"benchmark": "doctor_busbw", "size_mb": SIZE_MB, "rounds": args.rounds,
                            "baseline": "tests/jobscripts/allreduce_loop.py launched by hand, "
                                        "same sizes and iterations",
                            "doctor_gbps": doctor, "plain_gbps": hand, "ratio_best": ratio,
                            "ratio_median": dm / pm}, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
