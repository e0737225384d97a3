"""A sweep's trials on free GPUs: rigdeck's sweep against a loop of `rigdeck launch --wait`.

Issue 13, acceptance item 3: 24 short trials on 3 test bed hosts x 4 simulated GPUs, as many at
once as there are free GPUs (12).

- rigdeck:  `rigdeck sweep spec.toml --wait`, max_parallel = 12: the controller asks Optuna for
            each trial, queues it, and starts the next as soon as a GPU frees.
- baseline: the same 24 trials (the parameters the sweep chose, one spec file each) run by a
            shell loop of `rigdeck launch --wait`, 12 at a time: `xargs -P 12 -n 1` starts the
            next as soon as one of the 12 returns (the best a shell loop does in parallel).

Each trial is examples/sweep/objective.py (``--steps`` x ``--step-seconds``), one GPU. Measured
from the hosts' own records of every trial's rank (``ranks/rank-0.json`` started, and
``rank-0.exit.json`` ended), the same files for both sides:
- GPU-slot utilization = busy slot-seconds / available slot-seconds, from the first trial's
  start to the last one's end (12 slots);
- trial end -> next trial start on the same GPU: p50, p95, max.
Targets (rigdeck): utilization >= 0.9, gap p95 < 2 s. The sides alternate over ``--rounds``;
medians are reported. Needs root (the network-namespace test bed).

Usage: .venv/bin/python bench/sweep.py [--rounds 2] [--trials 24] [--steps 20] [--step-seconds 0.75]
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402
from tests.testbed import TestBed, available  # noqa: E402

EXAMPLE = ROOT / "examples" / "sweep"
HOSTS, GPUS = 3, 4
SLOTS = HOSTS * GPUS
TARGET_UTIL = 0.9
TARGET_GAP_P95_S = 2.0


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, -(-len(s) * q // 100) - 1))]  # nearest rank


SPEC = """name = "{name}"
command = ["{{python}}", "objective.py", "--lr", "{lr}", "--width", "{width}", "--optimizer", "{optimizer}",
           "--steps", "{steps}", "--step-seconds", "{step_s}"]
workdir = "{workdir}"
gpus_per_node = 1
total_steps = {steps}
"""


def sweep_spec(path: Path, trials: int, steps: int, step_s: float, seed: int, *, name: str = "bench-sweep",
               strategy: str = "random", early_stopping: str = "off", parallel: int = SLOTS) -> Path:
    """The example as a sweep (bench/sweep_quality.py's too)."""
    body = SPEC.format(name=name, lr="{hp.lr}", width="{hp.width}", optimizer="{hp.optimizer}",
                       steps=steps, step_s=step_s, workdir=EXAMPLE)
    body += f"""
[sweep]
strategy = "{strategy}"
early_stopping = "{early_stopping}"
max_trials = {trials}
max_parallel = {parallel}
seed = {seed}
objective = {{metric = "val_loss", goal = "minimize"}}
[sweep.parameters]
lr = {{type = "float", low = 1e-4, high = 1.0, log = true}}
width = {{type = "int", low = 16, high = 256, step = 16}}
optimizer = {{type = "categorical", choices = ["sgd", "adam", "adamw"]}}
"""
    path.write_text(body)
    return path


class Side:
    def __init__(self, bed: TestBed, tmp: Path, name: str):
        self.bed = bed
        self.tmp = tmp / name
        self.tmp.mkdir(parents=True)
        self.inventory = bed.write_inventory(self.tmp / "hosts.toml", python=sys.executable, connect_timeout=5.0,
                                             min_free_mb=1)
        self.env = {**os.environ, "RIGDECK_HOME": str(self.tmp / "home"), "RIGDECK_INVENTORY": str(self.inventory)}
        self.env.pop("RIGDECK_SERVER", None)

    def rigdeck(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([sys.executable, "-m", "tui.cli", *args], capture_output=True, text=True,
                              env=self.env, cwd=ROOT, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"rigdeck {' '.join(args)} exited {proc.returncode}: {proc.stderr[-2000:]}")
        return proc

    def intervals(self, job_ids: list[str]) -> list[dict[str, Any]]:
        """Each job's rank 0 on its host: (host, gpu, started, ended), from the host's files."""
        out = []
        for job_id in job_ids:
            view = json.loads(self.rigdeck("status", job_id, "--json").stdout)
            node = view["placement"][0]
            idx = [h.name for h in self.bed.hosts].index(node["host"])
            ranks = self.bed.hosts[idx].state_dir / "jobs" / job_id / "ranks"
            started = json.loads((ranks / "rank-0.json").read_text())["started"]
            ended = json.loads((ranks / "rank-0.exit.json").read_text())["ended"]
            out.append({"job_id": job_id, "host": node["host"], "gpu": node["gpus"][0], "started": started,
                        "ended": ended, "state": view["state"]})
        return out


def measure(intervals: list[dict[str, Any]]) -> dict[str, Any]:
    first = min(i["started"] for i in intervals)
    last = max(i["ended"] for i in intervals)
    busy = sum(i["ended"] - i["started"] for i in intervals)
    gaps = []
    by_slot: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for i in intervals:
        by_slot.setdefault((i["host"], i["gpu"]), []).append(i)
    for runs in by_slot.values():
        runs.sort(key=lambda i: i["started"])
        gaps += [b["started"] - a["ended"] for a, b in zip(runs, runs[1:], strict=False)]
    return {
        "trials": len(intervals),
        "succeeded": sum(1 for i in intervals if i["state"] == "succeeded"),
        "slots_used": len(by_slot),
        "span_s": round(last - first, 2),
        "busy_slot_s": round(busy, 2),
        "utilization": round(busy / (SLOTS * (last - first)), 4),
        "gaps": len(gaps),
        "gap_p50_s": round(statistics.median(gaps), 3) if gaps else None,
        "gap_p95_s": round(pct(gaps, 95), 3) if gaps else None,
        "gap_max_s": round(max(gaps), 3) if gaps else None,
        "trial_s_median": round(statistics.median(i["ended"] - i["started"] for i in intervals), 2),
    }


def run_sweep(side: Side, trials: int, steps: int, step_s: float, seed: int) -> tuple[dict[str, Any], list[dict]]:
    spec = sweep_spec(side.tmp / "sweep.toml", trials, steps, step_s, seed)
    t0 = time.time()
    out = json.loads(side.rigdeck("sweep", str(spec), "--wait", "--json").stdout)
    wall = time.time() - t0
    if out["row"]["state"] != "completed":
        raise RuntimeError(f"the sweep ended {out['row']['state']}: {out['row']}")
    trials_out = sorted(out["trials"], key=lambda t: t["number"])
    r = measure(side.intervals([t["job_id"] for t in trials_out]))
    return {**r, "command_wall_s": round(wall, 2)}, trials_out


def run_loop(side: Side, trials: list[dict[str, Any]], steps: int, step_s: float) -> dict[str, Any]:
    specs = []
    for t in trials:
        p = dict(t["params"])
        path = side.tmp / f"trial-{t['number']}.toml"
        path.write_text(SPEC.format(name=f"loop-t{t['number']}", lr=repr(float(p["lr"])), width=p["width"],
                                    optimizer=p["optimizer"], steps=steps, step_s=step_s, workdir=EXAMPLE))
        specs.append(str(path))
    rigdeck = f"{shlex.quote(sys.executable)} -m tui.cli"
    # The loop a user writes: every trial's spec, 12 `launch --wait` at a time, the job id of each
    # printed by launch --json into one file per trial.
    script = (f"cd {shlex.quote(str(ROOT))} && printf '%s\\n' {' '.join(shlex.quote(s) for s in specs)} | "
              f"xargs -P {SLOTS} -I{{}} sh -c '{rigdeck} launch --wait --json \"$1\" > \"$1.json\"' _ {{}}")
    t0 = time.time()
    proc = subprocess.run(["bash", "-c", script], env=side.env, capture_output=True, text=True, timeout=1800)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"the loop exited {proc.returncode}: {proc.stderr[-2000:]}")
    job_ids = [json.loads(Path(s + ".json").read_text())["job_id"] for s in specs]
    return {**measure(side.intervals(job_ids)), "command_wall_s": round(wall, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--trials", type=int, default=24)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-seconds", type=float, default=0.75)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sweep.json"))
    args = ap.parse_args()
    ok, why = available()
    if not ok:
        print(f"bench/sweep.py needs the test bed: {why}", file=sys.stderr)
        return 2
    meta = run_meta()
    bed = TestBed(HOSTS, sim_gpus=GPUS).up()
    results: dict[str, list[dict[str, Any]]] = {"rigdeck": [], "loop": []}
    try:
        with tempfile.TemporaryDirectory(prefix="rigdeck-bench-sweep-") as tmp_s:
            tmp = Path(tmp_s)
            Side(bed, tmp, "deploy").rigdeck("deploy")
            print(f"{args.trials} trials of {args.steps} x {args.step_seconds} s on {HOSTS} hosts x {GPUS} GPUs, "
                  f"{SLOTS} at a time; {args.rounds} rounds", flush=True)
            print(f"{'round':>5} {'side':<8} {'util':>6} {'gap p50':>8} {'gap p95':>8} {'gap max':>8} {'span s':>7} "
                  f"{'trial s':>7}", flush=True)
            for rnd in range(args.rounds):
                side = Side(bed, tmp, f"sweep-{rnd}")
                r, trials = run_sweep(side, args.trials, args.steps, args.step_seconds, seed=rnd)
                loop = run_loop(Side(bed, tmp, f"loop-{rnd}"), trials, args.steps, args.step_seconds)
                for name, res in (("rigdeck", r), ("loop", loop)):
                    res["round"] = rnd
                    results[name].append(res)
                    print(f"{rnd:>5} {name:<8} {res['utilization']:>6.3f} {res['gap_p50_s']:>8.2f} "
                          f"{res['gap_p95_s']:>8.2f} {res['gap_max_s']:>8.2f} {res['span_s']:>7.1f} "
                          f"{res['trial_s_median']:>7.1f}", flush=True)
    finally:
        bed.down()

    def med(side: str, key: str) -> float:
        return round(statistics.median(r[key] for r in results[side]), 3)

    summary = {side: {k: med(side, k) for k in ("utilization", "gap_p50_s", "gap_p95_s", "gap_max_s", "span_s")}
               for side in results}
    judged = {"utilization": summary["rigdeck"]["utilization"], "gap_p95_s": summary["rigdeck"]["gap_p95_s"],
              "target_met": {"utilization": summary["rigdeck"]["utilization"] >= TARGET_UTIL,
                             "gap_p95_s": summary["rigdeck"]["gap_p95_s"] < TARGET_GAP_P95_S}}
    print(f"\nmedian over {args.rounds} rounds      rigdeck    loop   rigdeck/loop")
    for key, label in (("utilization", "GPU-slot utilization"), ("gap_p50_s", "end->next start p50 s"),
                       ("gap_p95_s", "end->next start p95 s"), ("span_s", "first start->last end s")):
        a, b = summary["rigdeck"][key], summary["loop"][key]
        print(f"{label:<24} {a:>9.3f} {b:>7.3f}   {a / b if b else float('nan'):>6.2f}x")
    print(f"target utilization >= {TARGET_UTIL}: {'met' if judged['target_met']['utilization'] else 'MISSED'} "
          f"({judged['utilization']:.3f})")
    print(f"target end->next start p95 < {TARGET_GAP_P95_S} s: "
          f"{'met' if judged['target_met']['gap_p95_s'] else 'MISSED'} ({judged['gap_p95_s']:.2f} s)")
    write_result(args.out, {
        "what": __doc__.splitlines()[0], "trials": args.trials, "steps": args.steps,
        "step_seconds": args.step_seconds, "hosts": HOSTS, "gpus_per_host": GPUS, "rounds": args.rounds,
        "targets": {"utilization": TARGET_UTIL, "gap_p95_s": TARGET_GAP_P95_S},
        "summary": summary, "judged": judged, "results": results,
    }, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
