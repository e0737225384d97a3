"""``rigdeck pipeline SPEC``, ``rigdeck pipelines``, ``rigdeck pipeline status ID``,
``rigdeck pipeline stop ID``, ``rigdeck pipeline retry ID STEP``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
ACTIONS = {"status": 1, "stop": 1, "retry": 2}  # action -> how many arguments follow it
USAGE = {
    "status": "pipeline status takes one pipeline id (rigdeck pipelines lists them)",
    "stop": "pipeline stop takes one pipeline id (rigdeck pipelines lists them)",
    "retry": "pipeline retry takes a pipeline id and a step name: pipeline retry ID STEP",
}


def add_parsers(sub: Any, common: Any) -> None:
    p = sub.add_parser(
        "pipeline",
        help="run a multi-step pipeline from a spec with [[steps]]; `pipeline status ID`, "
             "`pipeline stop ID`, `pipeline retry ID STEP`",
        description="rigdeck pipeline SPEC [--wait] [--json] | pipeline status ID [--json] | "
                    "pipeline stop ID | pipeline retry ID STEP")
    common(p)
    p.add_argument("target", nargs="+", metavar="SPEC | status ID | stop ID | retry ID STEP")
    p.add_argument("--wait", action="store_true",
                   help="follow the pipeline until it ends, a line per step change; exit 0 only "
                        "if it succeeded (embedded: run it meanwhile)")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("pipelines", help="list pipelines: state, steps done, cached, failed")
    common(p)
    p.add_argument("--json", action="store_true")


# ---------------------------------------------------------------------------------------------
# Printing


def _duration(s: float | None) -> str:
    from tui.model.textformat import duration

    return duration(s)


def _safe(text: Any) -> str:
    """A value that may carry a rank's output (a failure's cause): no escape reaches the
    terminal."""
    from tui.model.termsafe import terminal_safe

    return terminal_safe(str(text))


def reason_text(s: Any, now: float) -> str:
    """The app's reason text (with a retry's countdown), made safe for the terminal."""
    from tui.model.pipelinetext import reason_text as text

    return _safe(text(s, now))


def artifacts_text(s: Any) -> str:
    from tui.model.textformat import size_bytes

    return ", ".join(f"{kind} {files} file{'' if files == 1 else 's'} {size_bytes(size)}"
                     for kind, files, size in s.artifacts)


def print_rows(rows: list[Any], now: float | None = None) -> None:
    if not rows:
        print("no pipelines")
        return
    now = time.time() if now is None else now
    width = max(8, *(len(r.pipeline_id) for r in rows))
    print(f"{'pipeline':<{width}} {'name':<16} {'state':<10} {'steps':>7} {'running':>7} {'cached':>6} "
          f"{'failed':>6} {'skipped':>7}  age")
    for r in rows:
        print(f"{r.pipeline_id:<{width}} {r.name:<16} {r.state:<10} {f'{r.done}/{r.steps}':>7} "
              f"{r.running:>7} {r.cached:>6} {r.failed:>6} {r.skipped:>7}  {_duration(now - r.created)}")


def step_lines(d: Any, now: float) -> list[str]:
    """The steps as a tree in dependency order (``PipelineDetail.tree``), a line each, then an
    indented line of what else there is to know (its job, condition, metrics, artifacts)."""
    from tui.model.pipelinetext import attempt_text, needs_also, step_time

    tree = d.tree()
    labels = []
    for prefix, s in tree:
        label = prefix + s.name + (" (sweep)" if s.kind == "sweep" else "")
        also = needs_also(s, d)
        if also:
            label += f" (+{','.join(also)})"
        labels.append(label)
    width = max(4, *(len(label) for label in labels)) if labels else 4
    out = [f"  {'step':<{width}}  {'state':<10} {'attempt':<7} {'time':>7}  {'cached':<6} "
           f"{'hosts':<14} reason"]
    for label, (prefix, s) in zip(labels, tree, strict=True):
        hosts = ",".join(s.hosts) or "-"
        out.append(f"  {label:<{width}}  {s.state:<10} {attempt_text(s):<7} "
                   f"{_duration(step_time(s, now)):>7}  {'yes' if s.cached else '-':<6} "
                   f"{hosts:<14} {reason_text(s, now) or '-'}")
        more = []
        if s.kind == "sweep" and s.sweep_id:
            more.append(f"sweep {s.sweep_id}")
        elif s.job_id:
            more.append(f"job {s.job_id}")
        if s.cached and s.cached_from:
            more.append(f"reuses {s.cached_from}")
        if s.when:
            more.append(f"when {s.when}")
        if s.metrics:
            more.append("metrics " + " ".join(f"{k}={v:.6g}" for k, v in s.metrics))
        if s.artifacts:
            more.append("artifacts " + artifacts_text(s))
        if more:
            out.append(f"  {' ' * len(prefix)}  {' · '.join(more)}")  # under its name
    return out


def print_detail(d: Any, now: float | None = None) -> None:
    now = time.time() if now is None else now
    r = d.row
    print(f"pipeline {r.pipeline_id} ({r.name}): {r.state}"
          + (f" ({_safe(r.reason)})" if r.reason else "")
          + (f"  [{r.path}]" if r.path else ""))
    ran = (r.ended if r.ended is not None else now) - r.created
    print(f"steps: {r.done} of {r.steps} done; {r.succeeded} succeeded, {r.cached} cached, "
          f"{r.failed} failed, {r.skipped} skipped; {r.running} running; "
          f"{'ran' if r.ended is not None else 'running for'} {_duration(ran)}")
    for line in step_lines(d, now):
        print(line)


def change_line(s: Any, now: float) -> str:
    """One step's new state, for --wait."""
    text = f"{s.name}: {s.state}"
    if s.attempt > 1 or (s.max_attempts > 1 and s.attempt):
        text += f" (attempt {s.attempt}/{s.max_attempts})"
    if s.state in ("queued", "starting", "running") and s.hosts:
        text += f" on {','.join(s.hosts)}"
    if s.cached and s.cached_from:
        text += f" (reuses {s.cached_from})"
    why = reason_text(s, now)
    if why and s.state not in ("running",):
        text += f": {why}"
    return text


def follow(client: Any, d: Any, quiet: bool) -> Any:
    """Until the pipeline ends: a line each time a step changes state or attempt (embedded,
    this process runs the pipeline meanwhile). The last detail seen."""
    seen = {s.name: (s.state, s.attempt) for s in d.steps}
    last = d
    for step in client.pipeline_wait(d.row.pipeline_id):
        last = step
        if quiet:
            continue
        now = time.time()
        for s in step.steps:
            key = (s.state, s.attempt)
            if seen.get(s.name) != key:
                seen[s.name] = key
                print(change_line(s, now), flush=True)
    return last


def dump(value: Any) -> None:
    from tui.client import wire_json

    json.dump(wire_json(value), sys.stdout, indent=2)
    sys.stdout.write("\n")


# ---------------------------------------------------------------------------------------------
# The commands


def known_errors() -> tuple[type[BaseException], ...]:
    """What a command reports as ``rigdeck: ...`` (exit 2) rather than a traceback: a spec, a
    reference or a request the controller refused; ``PipelineError`` once the client names it."""
    import tui.client as client_mod

    names = ("JobError", "JobSpecError", "PlacementError", "ServerError", "SweepError", "PipelineError")
    return tuple(getattr(client_mod, n) for n in names if isinstance(getattr(client_mod, n, None), type))


def run(args: argparse.Namespace, client_factory: Any) -> int:
    from tui.model.jobspec import JobSpecError

    if args.command == "pipelines":
        client = client_factory(args)
        try:
            rows = client.pipelines()
        except known_errors() as e:
            print(f"rigdeck: {e}", file=sys.stderr)
            return EXIT_USAGE
        finally:
            client.close()
        if args.json:
            dump(rows)
        else:
            print_rows(rows)
        return EXIT_OK
    target = list(args.target)
    action = target[0] if target[0] in ACTIONS else None
    if action is not None and len(target) != 1 + ACTIONS[action]:
        print(f"rigdeck: {USAGE[action]}", file=sys.stderr)
        return EXIT_USAGE
    if action is None and len(target) != 1:
        print("rigdeck: pipeline takes one spec file (or: pipeline status ID, pipeline stop ID, "
              "pipeline retry ID STEP)", file=sys.stderr)
        return EXIT_USAGE
    spec = None
    if action is None:
        from tui.model.pipelinespec import load_pipeline

        try:
            spec = load_pipeline(target[0])
        except JobSpecError as e:
            print(f"rigdeck: {e}", file=sys.stderr)
            return EXIT_USAGE
    client = client_factory(args)
    try:
        if action == "status":
            d = client.pipeline_detail(target[1])
            if args.wait and d.row.state not in _final():
                d = _refetch(client, follow(client, d, args.json))
        elif action == "stop":
            d = client.pipeline_stop(target[1])
        elif action == "retry":
            d = client.pipeline_retry(target[1], target[2])
            if not args.json:
                s = d.step(target[2])
                print(f"pipeline {d.row.pipeline_id}: step {target[2]} "
                      f"{s.state if s is not None else 'retried'}", flush=True)
            if args.wait:
                d = _refetch(client, follow(client, d, args.json))
        else:
            d = client.pipeline(spec)
            if not args.json:
                r = d.row
                started = [s.name for s in d.steps if s.state not in ("pending", "skipped", "cached")]
                cached = [s.name for s in d.steps if s.cached]
                print(f"pipeline {r.pipeline_id}: {r.steps} steps; started "
                      f"{', '.join(started) or 'none'}"
                      + (f"; cached {', '.join(cached)}" if cached else ""), flush=True)
                for line in step_lines(d, time.time()):
                    print(line, flush=True)
                if client.kind == "embedded" and not args.wait:
                    print("  (no server: the pipeline advances only while rigdeck runs: the app, or "
                          "pipeline --wait)", flush=True)
            if args.wait:
                d = _refetch(client, follow(client, d, args.json))
        if args.json:
            dump(d)
        elif action in ("stop", "status") or args.wait:
            print_detail(d)
    except known_errors() as e:
        print(f"rigdeck: {e}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        client.close()
    if args.wait:
        return EXIT_OK if d.row.state == "succeeded" else EXIT_FAILED
    return EXIT_OK


def _final() -> tuple[str, ...]:
    from tui.model.pipelineview import PIPELINE_FINAL

    return PIPELINE_FINAL


def _refetch(client: Any, last: Any) -> Any:
    """The pipeline's detail once it ended (the last the wait gave, if fetching fails)."""
    try:
        return client.pipeline_detail(last.row.pipeline_id)
    except Exception:
        return last
