"""``rigdeck usage [--by user|group|job] [--since DATE] [--json]``: who used the GPUs. The
figures are the jobs' recorded GPU time (``tui.model.usage``: each attempt's GPUs times its
span), summed; with a server, everyone's jobs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from tui.model import wire
from tui.model.usage import BY, parse_since, report_lines

EXIT_OK = 0
EXIT_USAGE = 2


def add_parsers(sub: Any, common: Any) -> None:
    p = sub.add_parser("usage", help="GPU hours, jobs, preemptions and goodput per user, group or job")
    common(p)
    p.add_argument("--by", choices=BY, default="user", help="one row per user (default), group or job")
    p.add_argument("--since", default=None, metavar="DATE",
                   help="only GPU time after DATE: YYYY-MM-DD, YYYY-MM-DDTHH:MM (local time) or Nd (days back)")
    p.add_argument("--json", action="store_true")


def run(args: argparse.Namespace, client_factory: Any) -> int:
    since = None
    if args.since is not None:
        try:
            since = parse_since(args.since, time.time())
        except ValueError as e:
            print(f"rigdeck usage: {e}", file=sys.stderr)
            return EXIT_USAGE
    with client_factory(args) as client:
        report = client.usage(by=args.by, since=since)
    if args.json:
        json.dump(wire.encode(report), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print("\n".join(report_lines(report)))
    return EXIT_OK
