"""How well a sweep searches: Optuna's strategies on the example whose optimum is known.

Issue 13, acceptance items 1 and 2, on the test bed (3 hosts x 4 simulated GPUs), every trial a
real job (examples/sweep/objective.py: val_loss is lowest at lr = 0.01, width = 128,
optimizer = adamw; at ``--steps`` S the best value any trial can reach is 1.5 exp(-0.2 S)).

1. ``bayesian`` (TPE) against ``random``: 3 seeds x 30 trials each. Printed: each sweep's best
   val_loss and its distance to the optimum; the target is bayesian's median distance below
   random's median distance.
2. Hyperband pruning (Optuna's HyperbandPruner) against no pruning, on the same proposals: the
   ``random`` strategy with ``early_stopping = "hyperband"`` against the same seed's ``random``
   sweep (a trial's parameters depend on its seed and number only, so both sweeps propose the
   same trials, and the comparison is the pruning's alone): the share of trials pruned (target
   >= 1/3), the steps run against running every trial to the end (target <= 60%), and its best
   against the no-pruning sweep's best (target: within 10%). Printed too, not judged: the
   ``hyperband`` strategy (TPE proposals and the pruner) against ``bayesian``, whose proposals
   part ways as soon as they learn from different results.

Every sweep runs ``max_parallel`` trials at once (default 4: a model-based sampler learns from
what ended; with every GPU busy at once it would propose most trials before any result). Steps
take ``--step-seconds`` (0.2): a pruned trial runs on for as long as its stop takes (the next
poller round, the signal; under a second), which costs a few steps of that length, as it would
of real training steps; the steps counted are those each trial actually reported.
Needs root (the network-namespace test bed).

Usage: .venv/bin/python bench/sweep_quality.py [--seeds 3] [--trials 30] [--steps 30] [--parallel 4]
                                               [--step-seconds 0.2]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402
from bench.sweep import Side, sweep_spec  # noqa: E402
from tests.testbed import TestBed, available  # noqa: E402

EXAMPLE = ROOT / "examples" / "sweep"
TARGET_PRUNED = 1 / 3
TARGET_STEPS = 0.6
TARGET_BEST = 0.10


def optimum(steps: int) -> float:
    """The smallest val_loss a trial of ``steps`` steps can end with (objective.py)."""
    return 1.5 * math.exp(-0.2 * steps)


CONFIGS = {  # name -> (strategy, early_stopping)
    "random": ("random", "off"),
    "bayesian": ("bayesian", "off"),
    "random+hb": ("random", "hyperband"),
    "hyperband": ("hyperband", "off"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--step-seconds", type=float, default=0.2)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sweep_quality.json"))
    args = ap.parse_args()
    ok, why = available()
    if not ok:
        print(f"bench/sweep_quality.py needs the test bed: {why}", file=sys.stderr)
        return 2
    meta = run_meta()
    best_possible = optimum(args.steps)
    runs: list[dict[str, Any]] = []
    bed = TestBed(3, sim_gpus=4).up()
    try:
        with tempfile.TemporaryDirectory(prefix="rigdeck-bench-sweepq-") as tmp_s:
            side = Side(bed, Path(tmp_s), "quality")
            side.rigdeck("deploy")
            print(f"{args.trials} trials x {args.seeds} seeds, {args.steps} steps each, {args.parallel} at a time; "
                  f"the optimum's val_loss at step {args.steps}: {best_possible:.6f}", flush=True)
            print(f"{'strategy':<10} {'seed':>4} {'best':>10} {'distance':>10} {'pruned':>7} {'steps run':>10}",
                  flush=True)
            for seed in range(args.seeds):
                for strategy in CONFIGS:
                    kind, early = CONFIGS[strategy]
                    path = sweep_spec(side.tmp / f"{strategy}-{seed}.toml", args.trials, args.steps, args.step_seconds,
                                      seed, name=f"q-{strategy.replace('+', '-')}-{seed}", strategy=kind,
                                      early_stopping=early, parallel=args.parallel)
                    out = json.loads(side.rigdeck("sweep", str(path), "--wait", "--json").stdout)
                    trials = out["trials"]
                    done = [t for t in trials if t["state"] == "completed"]
                    best = min(t["value"] for t in done)
                    steps_run = sum(t["last_step"] or 0 for t in trials)
                    r = {"strategy": strategy, "seed": seed, "state": out["row"]["state"], "trials": len(trials),
                         "completed": len(done), "pruned": sum(1 for t in trials if t["state"] == "pruned"),
                         "failed": sum(1 for t in trials if t["state"] in ("failed", "stopped")),
                         "best": best, "distance": best - best_possible, "steps_run": steps_run,
                         "steps_all": args.trials * args.steps, "best_params": dict(out["best"]["params"])}
                    runs.append(r)
                    print(f"{strategy:<10} {seed:>4} {best:>10.6f} {r['distance']:>10.6f} {r['pruned']:>7} "
                          f"{steps_run:>5}/{r['steps_all']:<5}", flush=True)
    finally:
        bed.down()

    def of(strategy: str) -> list[dict[str, Any]]:
        return [r for r in runs if r["strategy"] == strategy]

    med_random = statistics.median(r["distance"] for r in of("random"))
    med_bayes = statistics.median(r["distance"] for r in of("bayesian"))
    hb = of("random+hb")
    pruned_share = sum(r["pruned"] for r in hb) / sum(r["trials"] for r in hb)
    steps_share = sum(r["steps_run"] for r in hb) / sum(r["steps_all"] for r in hb)
    nopr = {r["seed"]: r["best"] for r in of("random")}
    best_ratio = [r["best"] / nopr[r["seed"]] for r in hb]  # per seed: hyperband's best / no pruning's
    tpe_hb = of("hyperband")
    tpe_nopr = {r["seed"]: r["best"] for r in of("bayesian")}
    tpe_info = {"pruned_share": round(sum(r["pruned"] for r in tpe_hb) / sum(r["trials"] for r in tpe_hb), 3),
                "steps_share": round(sum(r["steps_run"] for r in tpe_hb) / sum(r["steps_all"] for r in tpe_hb), 3),
                "best_over_bayesian": [round(r["best"] / tpe_nopr[r["seed"]], 4) for r in tpe_hb]}
    # Within 10%: hyperband's best at most 10% above the no-pruning sweep's (lower is better).
    within = [x <= 1 + TARGET_BEST for x in best_ratio]
    judged = {
        "bayesian_median_distance": med_bayes, "random_median_distance": med_random,
        "bayesian_closer": med_bayes < med_random,
        "pruned_share": round(pruned_share, 3), "steps_share": round(steps_share, 3),
        "hyperband_best_over_nopruning": [round(x, 4) for x in best_ratio],
        "tpe_hyperband_vs_bayesian": tpe_info,
        "target_met": {"bayesian_closer": med_bayes < med_random, "pruned_share": pruned_share >= TARGET_PRUNED,
                       "steps_share": steps_share <= TARGET_STEPS, "best_within_10pct": all(within)},
    }
    print(f"\n1. distance to the optimum, median over {args.seeds} seeds: bayesian {med_bayes:.6f}, random "
          f"{med_random:.6f} ({med_bayes / med_random if med_random else float('nan'):.2f}x): "
          f"{'met' if judged['target_met']['bayesian_closer'] else 'MISSED'}")
    print(f"2. hyperband pruning on random proposals: {pruned_share:.0%} of trials pruned (target >= 33%): "
          f"{'met' if judged['target_met']['pruned_share'] else 'MISSED'}; steps run {steps_share:.0%} of every trial "
          f"to the end (target <= 60%): {'met' if judged['target_met']['steps_share'] else 'MISSED'}; best / "
          f"no-pruning best per seed {', '.join(f'{x:.3f}' for x in best_ratio)} (target <= 1.10): "
          f"{'met' if judged['target_met']['best_within_10pct'] else 'MISSED'}")
    print(f"   (not judged) the hyperband strategy (TPE + pruner) against bayesian: {tpe_info['pruned_share']:.0%} "
          f"pruned, steps {tpe_info['steps_share']:.0%}, best / bayesian's best per seed "
          f"{', '.join(f'{x:.3f}' for x in tpe_info['best_over_bayesian'])}")
    write_result(args.out, {"what": __doc__.splitlines()[0], "seeds": args.seeds, "trials": args.trials,
                            "steps": args.steps, "parallel": args.parallel, "optimum": best_possible,
                            "judged": judged, "runs": runs}, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
