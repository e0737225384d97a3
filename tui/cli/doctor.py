"""``rigdeck doctor [HOST ...] [--checks a,b] [--json]``: measure and compare the hosts; a table of
findings (check, subject, verdict, summary, advice). Exit 1 when any finding is bad, 0 otherwise,
2 on bad input."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from tui.model.doctor import CHECKS, DoctorReport, combine, stages

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


class _Table:
    """The findings as rows, printed as each stage of the doctor ends (a slow link's check takes
    longest: the per-host checks are on screen by then)."""

    def __init__(self) -> None:
        self.widths: tuple[int, int] | None = None

    def rows(self, report: DoctorReport) -> None:
        from tui.model.termsafe import terminal_safe as safe_line

        if self.widths is None:
            pairs = [len(a) + len(b) + 3 for i, a in enumerate(report.hosts) for b in report.hosts[i + 1:]]
            self.widths = (max(5, *(len(c) for c in CHECKS)), max(7, *(len(h) for h in report.hosts), *pairs))
            wc, ws = self.widths
            print(f"{'check':<{wc}}  {'subject':<{ws}}  {'verdict':<7}  summary  |  advice", flush=True)
        wc, ws = self.widths
        for f in report.findings:
            verdict = f.verdict.upper() if f.verdict != "ok" else "ok"
            print(f"{f.check:<{wc}}  {safe_line(f.subject):<{ws}}  {verdict:<7}  {safe_line(f.summary)}  |  "
                  f"{safe_line(f.advice) or '-'}", flush=True)


def print_end(report: DoctorReport) -> None:
    if not report.findings:
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
    table = _Table()
    parts: list[DoctorReport] = []
    try:
        # One stage at a time, each shown as it ends: the per-host checks, the links, the all-reduce.
        for stage in stages(checks or list(CHECKS)):
            parts.append(client.doctor(args.hosts or None, stage))
            if not args.json:
                table.rows(parts[-1])
    except DoctorError as e:
        print(f"rigdeck: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (JobError, PlacementError) as e:
        print(f"rigdeck: doctor: a measurement job could not start: {e}", file=sys.stderr)
        return EXIT_BAD
    finally:
        client.close()
    report = combine(parts)
    if args.json:
        json.dump(wire_json(report), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_end(report)
    return EXIT_BAD if report.worst == "bad" else EXIT_OK
