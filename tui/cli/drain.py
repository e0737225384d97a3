"""``rigdeck drain HOST[:GPU]... [--reason TEXT] [--now]``, ``rigdeck undrain HOST[:GPU]...`` and
``rigdeck drains``: take GPUs or whole hosts out of placement (and, with ``--now``, move the jobs
running there), put them back, list what is out. Drains are kept in the controller's history:
they outlive it, and a server's are every operator's."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tui.model.identity import local_user
from tui.model.termsafe import terminal_safe

EXIT_OK = 0
EXIT_USAGE = 2


def add_parsers(sub: Any, common: Any) -> None:
    p = sub.add_parser("drain", help="keep GPUs or hosts out of placement (HOST or HOST:GPU); --now also moves "
                                     "the jobs running there")
    common(p)
    p.add_argument("targets", nargs="+", metavar="HOST[:GPU]")
    p.add_argument("--reason", default="", metavar="TEXT", help="why (kept with the drain, shown everywhere)")
    p.add_argument("--now", action="store_true",
                   help="also stop the jobs running there and restart them elsewhere from their checkpoints")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("undrain", help="put drained GPUs or hosts back into placement")
    common(p)
    p.add_argument("targets", nargs="+", metavar="HOST[:GPU]")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("drains", help="the GPUs and hosts kept out of placement: who, when, why")
    common(p)
    p.add_argument("--json", action="store_true")


def print_drains(drains: Sequence[Mapping[str, Any]], empty: str = "nothing is drained") -> None:
    if not drains:
        print(empty)
        return
    width = max(len(str(d["target"])) for d in drains)
    for d in drains:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(d.get("at") or 0)))
        now = ", jobs moved" if d.get("now") else ""
        print(f"{d['target']:<{width}}  {when}  by {d.get('who') or '?'} ({d.get('source')}{now})  "
              f"{terminal_safe(str(d.get('reason') or '-'))}")


def run(args: argparse.Namespace, client_factory: Any) -> int:
    from tui.model.health import DrainTargetError

    try:
        with client_factory(args) as client:
            if args.command == "drains":
                out = client.drains()
            elif args.command == "drain":
                out = client.drain(args.targets, reason=args.reason, now=args.now, who=_who())
            else:
                out = client.undrain(args.targets)
    except DrainTargetError as e:
        print(f"rigdeck {args.command}: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        json.dump(out, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif args.command == "undrain":
        print_drains(out, empty="none of these was drained")
    else:
        print_drains(out)
    return EXIT_OK


def _who() -> str:
    return local_user() or "?"
