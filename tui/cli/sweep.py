"""``rigdeck sweep SPEC``, ``rigdeck sweeps``, ``rigdeck sweep status ID``, ``rigdeck sweep stop ID``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
ACTIONS = ("status", "stop")


def add_parsers(sub: Any, common: Any) -> None:
    p = sub.add_parser(
        "sweep", help="run a hyperparameter sweep from a spec with a [sweep] table; "
                      "`sweep status ID`, `sweep stop ID`",
        description="rigdeck sweep SPEC [--wait] [--json] | sweep status ID [--json] | sweep stop ID")
    common(p)
    p.add_argument("target", nargs="+", metavar="SPEC | status ID | stop ID")
    p.add_argument("--wait", action="store_true", help="follow the sweep until it ends (embedded: run it meanwhile)")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("sweeps", help="list sweeps: state, trials, best objective")
    common(p)
    p.add_argument("--json", action="store_true")


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _duration(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def print_rows(rows: list[Any]) -> None:
    if not rows:
        print("no sweeps")
        return
    print(f"{'sweep':<34} {'state':<10} {'strategy':<10} {'trials':>9}  {'pruned':>6} {'failed':>6}  best")
    for r in rows:
        best = f"trial {r.best_trial}: {r.metric}={_fmt(r.best_value)}" if r.best_trial is not None else "-"
        print(f"{r.sweep_id:<34} {r.state:<10} {r.strategy:<10} {r.done:>4}/{r.max_trials:<4}  {r.pruned:>6} "
              f"{r.failed:>6}  {best}")


def print_detail(d: Any) -> None:
    r = d.row
    pruning = "no pruning" if r.pruner == "off" else f"{r.pruner} pruning"
    print(f"sweep {r.sweep_id}: {r.state}" + (f" ({r.reason})" if r.reason else "")
          + f"  [{r.strategy}, {pruning}; objective {r.metric}, {r.goal}]")
    best = d.best()
    if best is not None:
        print(f"best: trial {best.number}  {r.metric}={_fmt(best.value)}  {best.params_text()}")
    else:
        print("best: none yet (no trial completed)")
    print(f"trials: {r.trials} of {r.max_trials} asked; {r.completed} completed, {r.pruned} pruned, "
          f"{r.failed} failed or stopped; {r.running} running, {r.queued} queued")
    if not d.trials:
        return
    print(f"  {'#':>4} {'state':<10} {r.metric[:12]:>12} {'best step':>9} {'pruned at':>9} {'time':>7}  params")
    now = time.time()
    for t in d.trials:
        dur = t.duration if t.ended is not None else (now - t.started if t.started else None)
        note = f"  ({t.error})" if t.error else ""
        retry = f" (attempt {t.attempt})" if t.attempt > 1 else ""
        print(f"  {t.number:>4} {t.state:<10} {_fmt(t.value):>12} {_fmt(t.best_step):>9} {_fmt(t.pruned_step):>9} "
              f"{_duration(dur):>7}  {t.params_text()}{retry}{note}")


def detail_json(d: Any) -> dict[str, Any]:
    from tui.client import wire_json

    best = d.best()
    return {"best": wire_json(best) if best is not None else None, **wire_json(d)}


def _follow(client: Any, d: Any, quiet: bool) -> None:
    """Until the sweep ends: a line each time a trial changes state (embedded, this process
    runs the sweep meanwhile)."""
    seen: dict[int, str] = {t.number: t.state for t in d.trials}
    for step in client.sweep_wait(d.row.sweep_id):
        if quiet:
            continue
        for t in sorted(step.trials, key=lambda t: t.number):
            if seen.get(t.number) != t.state:
                seen[t.number] = t.state
                extra = f" {step.row.metric}={_fmt(t.value)}" if t.value is not None else ""
                extra += f" at step {t.pruned_step}" if t.state == "pruned" else ""
                extra += f" ({t.error})" if t.error else ""
                print(f"trial {t.number}: {t.state}{extra}", flush=True)


def run(args: argparse.Namespace, client_factory: Any) -> int:
    from tui.client import JobError, PlacementError, SweepError
    from tui.model.jobspec import JobSpecError, load_jobspec

    if args.command == "sweeps":
        client = client_factory(args)
        try:
            rows = client.sweeps()
        finally:
            client.close()
        if args.json:
            from tui.client import wire_json

            json.dump(wire_json(rows), sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print_rows(rows)
        return EXIT_OK
    target = list(args.target)
    action = target[0] if target[0] in ACTIONS else None
    if action is not None and len(target) != 2:
        print(f"rigdeck: sweep {action} takes one sweep id (rigdeck sweeps lists them)", file=sys.stderr)
        return EXIT_USAGE
    if action is None and len(target) != 1:
        print("rigdeck: sweep takes one spec file (or: sweep status ID, sweep stop ID)", file=sys.stderr)
        return EXIT_USAGE
    spec = None
    if action is None:
        try:
            spec = load_jobspec(target[0])
        except JobSpecError as e:
            print(f"rigdeck: {e}", file=sys.stderr)
            return EXIT_USAGE
        if spec.sweep is None:
            print(f"rigdeck: {target[0]}: no [sweep] table: a sweep needs one (rigdeck launch runs a "
                  "single job)", file=sys.stderr)
            return EXIT_USAGE
    client = client_factory(args)
    try:
        if action == "status":
            d = client.sweep_detail(target[1])
            if args.wait:
                _follow(client, d, args.json)
                d = client.sweep_detail(d.row.sweep_id)
        elif action == "stop":
            d = client.sweep_stop(target[1])
        else:
            d = client.sweep(spec)
            if not args.json:
                print(f"sweep {d.row.sweep_id}: {d.row.max_trials} trials, {d.row.strategy}; "
                      f"{d.row.running} started, {d.row.queued} queued", flush=True)
                if client.kind == "embedded" and not args.wait:
                    print("  (no server: the sweep advances only while rigdeck runs: the app, or "
                          "sweep --wait)", flush=True)
            if args.wait:
                _follow(client, d, args.json)
                d = client.sweep_detail(d.row.sweep_id)
        if args.json:
            json.dump(detail_json(d), sys.stdout, indent=2)
            sys.stdout.write("\n")
        elif action == "stop" or args.wait or action == "status":
            print_detail(d)
    except (SweepError, JobError, PlacementError, JobSpecError) as e:
        print(f"rigdeck: {e}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        client.close()
    if args.wait:
        return EXIT_OK if d.row.state == "completed" else EXIT_FAILED
    return EXIT_OK
