"""The partitioner's plan against the equal-layer split, on the unbalanced pipeline example.

examples/pipeline/train.py (9 blocks, block 4 four times wider inside) runs under
``torchrun --standalone --nproc-per-node 3`` (3 stages over gloo on this machine, 4 microbatches,
interleaved), once with the plan ``runtime.pipeline_stage`` makes from its profile
(``optimize = "speed"``) and once with ``--equal-split`` (3 blocks per stage), in alternating
order over ``--rounds`` rounds. Each rank prints its stage's figures after the warm-up steps:
the median wall step time, the median time busy in its own forward and backward, the peak
memory, and the steps/s it went at. Printed: per stage, both plans' figures; the steps/s of each
(1 / the last stage's median step time; the median over rounds, and the best round); the ratio
automatic / equal (target: above 1). Other load on the machine slows some rounds: the median
step and the alternating order are there for it.

Two settings: ``cpu``, the example as shipped, its blocks computed on this machine's 2 cores,
which the 3 ranks share (so the stages cannot all run at once: a split changes little there);
and ``simulated``, the same model with each block's time on a simulated accelerator added
(``--simulated-gflops 2``, slept, so the stages overlap as on one GPU each; batch 64).

Usage: .venv/bin/python bench/pipeline_plan.py [--rounds 3] [--steps 60] [--settings cpu,simulated]
Writes bench/results/pipeline_plan.json.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402

EXAMPLE = ROOT / "examples" / "pipeline" / "train.py"
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
STAGES = 3
FOREIGN = ("RIGDECK_", "SM_", "OMPI_", "PMIX_", "TORCHELASTIC_", "AIP_")
FOREIGN_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"}


def run_once(equal: bool, steps: int, work: Path, extra: list[str]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(FOREIGN) and k not in FOREIGN_NAMES}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=str(ROOT),
               RIGDECK_JOB_DIR=str(work))
    argv = [TORCHRUN, "--standalone", "--nproc-per-node", str(STAGES), str(EXAMPLE),
            "--steps", str(steps), "--microbatches", "4", "--pipeline", "interleaved"]
    argv += extra
    if equal:
        argv.append("--equal-split")
    proc = subprocess.run(argv, env=env, cwd=work, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    stages = {}
    for found in re.finditer(r"stage_summary (\{[^{}]*\})", proc.stdout):
        summary = json.loads(found.group(1))
        stages[summary["stage"]] = summary
    if sorted(stages) != list(range(STAGES)):
        raise SystemExit(f"expected {STAGES} stage summaries, got {sorted(stages)}:\n{proc.stdout[-3000:]}")
    plan = json.loads((work / "model_parallel" / "plan.json").read_text())
    last = stages[STAGES - 1]
    # steps/s from the last stage's median step (robust to a few steps stalled by other load on
    # the machine), and over the whole run after the warm-up
    return {"stages": [stages[i] for i in range(STAGES)], "plan": plan,
            "steps_per_s": 1.0 / last["step_time_s"], "run_steps_per_s": last["steps_per_s"]}


# The two settings measured: the example as shipped (its blocks computed on this machine's CPU,
# which the 3 ranks share: 2 cores, so the stages cannot all run at once and any split does
# about the same total work at about the same pace), and the same model with each block's time
# on a *simulated* accelerator added (slept; see the example's SimulatedAccelerator), which
# the ranks do not share, as the stages of a real pipeline each have their own GPU.
SETTINGS = {
    "cpu": [],
    "simulated": ["--simulated-gflops", "2", "--batch", "64"],
}


def measure(setting: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {"auto": [], "equal": []}
    for r in range(args.rounds):
        order = ("auto", "equal") if r % 2 == 0 else ("equal", "auto")
        for mode in order:
            work = tmp / f"{setting}-{mode}-{r}"
            work.mkdir()
            res = run_once(mode == "equal", args.steps, work, SETTINGS[setting])
            runs[mode].append(res)
            print(f"{setting} round {r} {mode:5}: cuts {res['stages'][0]['cuts']}, "
                  f"{res['steps_per_s']:.2f} steps/s (median step), "
                  f"{res['run_steps_per_s']:.2f} over the run", flush=True)
    summary: dict[str, Any] = {"options": SETTINGS[setting]}
    for mode in ("auto", "equal"):
        per_stage = []
        for s in range(STAGES):
            per_stage.append({
                "stage": s, "blocks": runs[mode][0]["stages"][s]["blocks"],
                "step_time_s": statistics.median(x["stages"][s]["step_time_s"] for x in runs[mode]),
                "busy_s": statistics.median(x["stages"][s]["busy_s"] for x in runs[mode]),
                "peak_bytes": max(x["stages"][s]["peak_bytes"] for x in runs[mode]),
                "expected_time_s": runs[mode][0]["plan"]["stages"][s]["time_s"]})
        summary[mode] = {"cuts": runs[mode][0]["stages"][0]["cuts"], "stages": per_stage,
                         "steps_per_s": statistics.median(x["steps_per_s"] for x in runs[mode]),
                         "best_steps_per_s": max(x["steps_per_s"] for x in runs[mode]),
                         "rounds": [x["steps_per_s"] for x in runs[mode]],
                         "rounds_over_run": [x["run_steps_per_s"] for x in runs[mode]]}
    summary["ratio"] = summary["auto"]["steps_per_s"] / summary["equal"]["steps_per_s"]
    summary["ratio_best"] = (summary["auto"]["best_steps_per_s"]
                             / summary["equal"]["best_steps_per_s"])
    return summary


def show(setting: str, summary: dict[str, Any], rounds: int) -> None:
    label = {"cpu": "CPU compute only (3 ranks on 2 shared cores)",
             "simulated": "with simulated accelerator time (2 GFLOP/s per stage, slept; batch 64)"}
    print(f"\n{setting}: {label[setting]}")
    print(f"{'plan':6} {'stage':>5} {'blocks':>8} {'step ms':>8} {'busy ms':>8} "
          f"{'expected ms/mb':>14} {'peak KiB':>9}")
    for mode in ("auto", "equal"):
        for st in summary[mode]["stages"]:
            print(f"{mode:6} {st['stage']:>5} {str(st['blocks']):>8} {st['step_time_s'] * 1e3:>8.2f} "
                  f"{st['busy_s'] * 1e3:>8.2f} {st['expected_time_s'] * 1e3:>14.3f} "
                  f"{st['peak_bytes'] / 1024:>9.1f}")
    auto, equal, ratio = summary["auto"], summary["equal"], summary["ratio"]
    print(f"automatic plan {auto['cuts']}: {auto['steps_per_s']:.2f} steps/s; equal-layer split "
          f"{equal['cuts']}: {equal['steps_per_s']:.2f} steps/s (medians of {rounds} rounds); "
          f"ratio auto/equal {ratio:.3f} (target > 1: {'met' if ratio > 1 else 'missed'}); "
          f"best rounds {auto['best_steps_per_s']:.2f} vs {equal['best_steps_per_s']:.2f}, "
          f"ratio {summary['ratio_best']:.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--settings", default="cpu,simulated",
                   help="which of cpu, simulated (comma-separated)")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "pipeline_plan.json"))
    args = p.parse_args()
    settings = [x for x in args.settings.split(",") if x]
    unknown = set(settings) - set(SETTINGS)
    if unknown:
        raise SystemExit(f"--settings: unknown {', '.join(sorted(unknown))} (known: cpu, simulated)")
    meta = run_meta()
    print(f"commit {meta['commit']}{' (with edits)' if meta['dirty'] else ''}, "
          f"{meta['machine']['cpu_count']} cores, load {meta['machine']['loadavg_at_start']}")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rigdeck-bench-pipeline-") as tmp:
        for setting in settings:
            results[setting] = measure(setting, args, Path(tmp))
    for setting in settings:
        show(setting, results[setting], args.rounds)
    result = {"benchmark": "pipeline_plan", "steps": args.steps, "rounds": args.rounds,
              "stages": STAGES, "microbatches": 4, "schedule": "interleaved", **results}
    write_result(args.out, result, meta)


if __name__ == "__main__":
    main()
