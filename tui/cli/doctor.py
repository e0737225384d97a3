"""``rigdeck doctor [HOST ...] [--checks a,b] [--json]``: measure and compare the hosts; a table of
findings (check, subject, verdict, summary, advice). Exit 1 when any finding is bad, 0 otherwise,
2 on bad input."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tui.model.doctor import CHECKS, DoctorReport

EXIT_OK = 0
EXIT_BAD = 1
EXIT_USAGE = 2


def add_parser(sub: Any, common: Any) -> None:
    p = sub.add_parser(
        "doctor", help="measure the hosts (all-reduce bus bandwidth, point-to-point links, ...) and say "
                       "where the bottleneck is; exit 1 when a check is bad",
        description="rigdeck doctor [HOST ...] [--checks a,b] [--json]: measurement jobs through the "
                    "normal launch path; exit 1 when any finding is bad")
    common(p)
    p.add_argument("hosts", nargs="*", metavar="HOST", help="hosts to check (default: every host of the inventory)")
    p.add_argument("--checks", metavar="A,B", help=f"only these checks, of: {','.join(CHECKS)}")
    p.add_argument("--json", action="store_true", help="the report as JSON (docs/contracts.md)")


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def print_report(report: DoctorReport) -> None:
    from tui.model.termsafe import terminal_safe as safe_line

    rows = [(f.check, f.subject, f.verdict, safe_line(f.summary), safe_line(f.advice) or "-")
            for f in report.findings]
    if rows:
        wc = max(5, *(len(r[0]) for r in rows))
        ws = max(7, *(len(r[1]) for r in rows))
        print(f"{'check':<{wc}}  {'subject':<{ws}}  {'verdict':<7}  summary  |  advice")
        for check, subject, verdict, summary, advice in rows:
            print(f"{check:<{wc}}  {subject:<{ws}}  {verdict.upper() if verdict != 'ok' else 'ok':<7}  "
                  f"{summary}  |  {advice}")
    else:
        print("no findings")
    for check, why in report.skipped:
        print(f"skipped {check}: {why}")
    if report.job_ids:
        print(f"measurement jobs: {', '.join(report.job_ids)}")
    took = f" in {report.ended - report.started:.0f} s" if report.ended else ""
    print(f"doctor: {report.worst} over {', '.join(report.hosts)}{took}")


def run(args: argparse.Namespace, client_factory: Any) -> int:
    from tui.client import DoctorError, JobError, PlacementError, wire_json

    checks = [c.strip() for c in args.checks.split(",") if c.strip()] if args.checks else None
    bad = [c for c in checks or () if c not in CHECKS]
    if bad or (checks is not None and not checks):
        print(f"rigdeck: doctor: --checks: expected some of {','.join(CHECKS)}, got {args.checks!r}",
              file=sys.stderr)
        return EXIT_USAGE
    client = client_factory(args)
    try:
        report = client.doctor(args.hosts or None, checks)
    except DoctorError as e:
        print(f"rigdeck: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (JobError, PlacementError) as e:
        print(f"rigdeck: doctor: a measurement job could not start: {e}", file=sys.stderr)
        return EXIT_BAD
    finally:
        client.close()
    if args.json:
        json.dump(wire_json(report), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_report(report)
    return EXIT_BAD if report.worst == "bad" else EXIT_OK
