"""``rigdeck retry JOB`` and ``rigdeck priority JOB N``: an ended job launched again, a job's
priority changed. With a server, a member does either only to their own jobs, an admin to
anyone's (``tui.model.permissions``); both are recorded in the job's events with who did it."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_OK = 0
EXIT_USAGE = 2


def add_parsers(sub: Any, common: Any) -> None:
    p = sub.add_parser("retry", help="launch an ended job again (same spec and code, same owner) as a new job")
    common(p)
    p.add_argument("job", metavar="JOB")
    p.add_argument("--no-queue", action="store_true", help="refuse, rather than queue, if it cannot start now")
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("priority", help="set the priority of a job that has not ended (waiting: its place in "
                                        "line; running: its standing against preemption)")
    common(p)
    p.add_argument("job", metavar="JOB")
    p.add_argument("priority", type=int, metavar="N", help="higher starts first, and is never preempted by lower")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace, client_factory: Any) -> int:
    from tui.client import JobError, PlacementError

    with client_factory(args) as client:
        try:
            if args.command == "retry":
                view = client.retry(args.job, queue=not args.no_queue)
            else:
                view = client.reprioritise(args.job, args.priority)
        except (JobError, PlacementError) as e:
            print(f"rigdeck {args.command}: {e}", file=sys.stderr)
            return EXIT_USAGE
        if args.json:
            json.dump(view.to_json(), sys.stdout, indent=2)
            sys.stdout.write("\n")
        elif args.command == "retry":
            of = next((e.get("job") for e in view.events if e.get("event") == "retry of"), args.job)
            where = f"waits for {view.waiting}" if view.state == "queued" else \
                ", ".join(dict.fromkeys(n["host"] for n in view.placement)) or view.state
            print(f"{view.job_id}: retry of {of}, {view.state} ({where})")
        else:
            pos = next((e.position for e in client.queue() if e.job_id == view.job_id), None)
            print(f"{view.job_id}: priority {args.priority} ({view.state}"
                  + (f", position {pos} in the queue" if pos is not None else "") + ")")
    return EXIT_OK
