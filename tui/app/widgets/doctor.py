"""The Doctor view's parts: the findings table (grouped by check, bad first), the summary and
skipped lines, and the p2p bandwidth matrix (host x host, the slowest link marked).

Plain functions from a ``tui.model.doctor.DoctorReport`` to raw cells and markup; the app runs
the doctor off the UI thread (``run_doctor``, which never raises) and hands the report here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import RenderableType
from rich.text import Text
from textual.markup import escape

from tui.app.widgets.difftable import Col, DiffTable
from tui.app.widgets.format import Palette, duration
from tui.model.doctor import CHECKS, DoctorReport, Finding

NO_REPORT = ("no doctor run yet: press D to run the checks over every host "
             "(short measurement jobs: it takes a while)")
VERDICT_LEVEL = {"ok": "ok", "warn": "warn", "bad": "crit"}  # palette level of a verdict
VERDICT_MARKUP = {"ok": "$success", "warn": "$warning", "bad": "$error"}
_RANK = {"bad": 0, "warn": 1, "ok": 2}


def _check_rank(check: str) -> int:
    return CHECKS.index(check) if check in CHECKS else len(CHECKS)


def sorted_findings(report: DoctorReport) -> list[Finding]:
    """In the order of CHECKS (unknown checks last), bad first within a check, then warn, ok."""
    return sorted(
        report.findings,
        key=lambda f: (_check_rank(f.check), f.check, _RANK.get(f.verdict, 3), f.subject),
    )


def figure(value: float | None, unit: str) -> str:
    """``9.84 GB/s``, ``412 MB/s``, ``0.8 ms``; "-" without a value. A rate under 1 GB/s is
    shown in MB/s (1 GB = 1000 MB, as the findings count)."""
    if value is None:
        return "-"
    if unit == "GB/s" and abs(value) < 1:
        value, unit = value * 1000.0, "MB/s"
    if abs(value) >= 100 or value == int(value):
        text = f"{value:.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".strip()


def keyed_findings(report: DoctorReport | None) -> list[tuple[str, Finding]]:
    """The findings in table order, each keyed ``check/subject`` (``#n`` added to a repeat)."""
    if report is None:
        return []
    out = []
    seen: dict[str, int] = {}
    for f in sorted_findings(report):
        key = f"{f.check}/{f.subject}"
        n = seen.get(key, 0)
        seen[key] = n + 1
        out.append((f"{key}#{n}" if n else key, f))
    return out


def finding_rows(report: DoctorReport | None) -> list[tuple[str, tuple[Any, ...]]]:
    """One row per finding: the check named on the first row of its group only."""
    out = []
    last_check = None
    for key, f in keyed_findings(report):
        out.append((key, (f.check if f.check != last_check else "", f.subject, f.verdict,
                          figure(f.value, f.unit), f.summary, f.advice)))
        last_check = f.check
    return out


def finding_detail(f: Finding | None) -> str:
    """The finding under the cursor in full (the table cuts long ones): its summary, its advice
    and its raw figures."""
    if f is None:
        return ""
    lines = [f"[b]{escape(f.check)} {escape(f.subject)}[/b] "
             f"[{VERDICT_MARKUP.get(f.verdict, '$text-muted')}]{escape(f.verdict)}[/] · {escape(f.summary)}"]
    extra = []
    if f.advice:
        extra.append(f"[$warning]{escape(f.advice)}[/]" if f.verdict != "ok" else escape(f.advice))
    if f.details:
        extra.append("[$text-muted]" + " ".join(f"{escape(str(k))}={escape(str(v))}" for k, v in f.details) + "[/]")
    if extra:
        lines.append(" · ".join(extra))
    return "\n".join(lines)


def verdict_counts(report: DoctorReport) -> dict[str, int]:
    counts = {"bad": 0, "warn": 0, "ok": 0}
    for f in report.findings:
        counts[f.verdict] = counts.get(f.verdict, 0) + 1
    return counts


def summary_markup(report: DoctorReport, now: float) -> str:
    """The report in one line: worst verdict, counts per verdict, over which hosts, when it ran
    and how long it took, the jobs it ran."""
    worst = report.worst
    c = verdict_counts(report)
    parts = [
        f"[b]doctor: [{VERDICT_MARKUP[worst]}]{worst}[/][/b]",
        (f"[$error]{c['bad']} bad[/]" if c["bad"] else "0 bad")
        + " · " + (f"[$warning]{c['warn']} warn[/]" if c["warn"] else "0 warn")
        + f" · {c['ok']} ok",
        f"{len(report.hosts)} host(s) {escape(','.join(report.hosts))}",
        f"ran {duration(max(0.0, now - report.started))} ago"
        + (f", took {duration(report.ended - report.started)}" if report.ended is not None else ""),
        (f"{len(report.job_ids)} job(s) " + escape(", ".join(report.job_ids))) if report.job_ids
        else "no jobs",
    ]
    return " · ".join(parts)


def skipped_markup(report: DoctorReport) -> str:
    """``skipped: gpu: no NVML (simulated GPUs)``, or "" when every check ran."""
    if not report.skipped:
        return ""
    return "[$text-muted]skipped: " + "; ".join(
        f"[b]{escape(check)}[/b]: {escape(why)}" for check, why in report.skipped) + "[/]"


# ---------------------------------------------------------------------------------------------
# The p2p matrix


def pair_of(subject: str) -> tuple[str, str] | None:
    """``h1<->h3`` -> ("h1", "h3"); None for a subject that is not a pair."""
    a, sep, b = subject.partition("<->")
    a, b = a.strip(), b.strip()
    return (a, b) if sep and a and b and a != b else None


@dataclass(frozen=True)
class Matrix:
    """The p2p findings as host x host: ``cells[(a, b)] = (figure, level)`` both ways round,
    level "slowest" on the slowest link(s), else the verdict's palette level."""

    hosts: tuple[str, ...]
    cells: dict[tuple[str, str], tuple[str, str]]
    slowest: tuple[Finding, ...]
    # Hosts every measured link of which is bad (or slowest) while some other link is not:
    # the host to look at (its NIC, its cable, a rate limit), named red in the matrix.
    suspects: tuple[str, ...] = ()

    def level(self, a: str, b: str) -> str | None:
        cell = self.cells.get((a, b))
        return cell[1] if cell else None


def p2p_matrix(report: DoctorReport | None) -> Matrix | None:
    """None when the report has no p2p finding with a pair and a value."""
    if report is None:
        return None
    pairs = []
    for f in report.by_check("p2p"):
        p = pair_of(f.subject)
        if p is not None and f.value is not None:
            pairs.append((p, f))
    if not pairs:
        return None
    low = min(f.value for _, f in pairs if f.value is not None)
    slowest = tuple(f for _, f in pairs if f.value == low)
    named = {h for (a, b), _ in pairs for h in (a, b)}
    hosts = tuple(h for h in report.hosts if h in named) + tuple(
        sorted(named - set(report.hosts)))
    cells: dict[tuple[str, str], tuple[str, str]] = {}
    for (a, b), f in pairs:
        lvl = "slowest" if f in slowest else VERDICT_LEVEL.get(f.verdict, "muted")
        cells[(a, b)] = cells[(b, a)] = (figure(f.value, f.unit), lvl)
    def poor(a: str, b: str) -> bool:
        return cells[(a, b)][1] in ("crit", "slowest")

    good_somewhere = any(not poor(a, b) for (a, b) in cells)
    suspects = tuple(h for h in hosts if good_somewhere and all(
        poor(a, b) for (a, b) in cells if a == h)) if len(hosts) > 2 else ()
    return Matrix(hosts, cells, slowest, suspects)


_CELL_MARKUP = {"ok": "", "warn": "$warning", "crit": "$error", "slowest": "reverse $error b",
                "muted": "$text-muted"}


def matrix_markup(m: Matrix) -> str:
    """The matrix as aligned lines of markup, and a line naming the slowest link and how far it
    is below the typical link (the finding's baseline: the median of each host's fastest link)."""
    width = max([len(h) for h in m.hosts] + [len(t) for t, _ in m.cells.values()] + [3])
    side = max(len(h) for h in m.hosts)
    def name(h: str, fmt: str) -> str:
        style = "b $error" if h in m.suspects else "b"
        return f"[{style}]{escape(h):{fmt}}[/]"

    lines = [" " * side + " " + " ".join(name(h, f">{width}") for h in m.hosts)]
    for a in m.hosts:
        row = [name(a, f"<{side}")]
        for b in m.hosts:
            cell = m.cells.get((a, b))
            if a == b or cell is None:
                row.append(f"[$text-muted]{'·' if a == b else '-':>{width}}[/]")
                continue
            text, lvl = cell
            style = _CELL_MARKUP.get(lvl, "")
            row.append(f"[{style}]{escape(text):>{width}}[/]" if style else f"{escape(text):>{width}}")
        lines.append(" ".join(row))
    notes = []
    for f in m.slowest:
        note = f"[$error]slowest: [b]{escape(f.subject)}[/b] {escape(figure(f.value, f.unit))}"
        if f.baseline and f.value is not None:
            below = 100.0 * (1.0 - f.value / f.baseline)
            note += f", {below:.0f}% below the typical link {escape(figure(f.baseline, f.unit))}"
        notes.append(note + "[/]")
    if m.suspects:
        notes.append("[$error]every link of [b]" + ", ".join(escape(h) for h in m.suspects)
                     + "[/b] is slow: look at that host's network[/]")
    return "\n".join(lines + notes)


# ---------------------------------------------------------------------------------------------
# The findings table


def _text(s: object, style: Any = None) -> Text:
    return Text("-" if s is None or s == "" else str(s), style=style or "", no_wrap=True,
                overflow="ellipsis")


class FindingsTable(DiffTable):
    def columns_for(self, w: Any) -> list[Col]:
        return [
            Col("check", "Check", 9),
            Col("subject", "Subject"),
            Col("verdict", "Verdict", 7),
            Col("value", "Figure"),
            Col("summary", "Summary", 44 if w.wide else 34),
            Col("advice", "Advice", w.why + 16 if w.wide else w.why),
        ]

    def render_cell(self, column: str, raw: Any, palette: Palette) -> RenderableType:
        if column == "check":
            return Text(raw, style=palette["strong"], no_wrap=True) if raw else Text("")
        if column == "verdict":
            return _text(raw, palette[VERDICT_LEVEL.get(raw, "muted")])
        if column == "advice":
            return _text(raw, palette["muted"])
        return _text(raw)


# ---------------------------------------------------------------------------------------------
# Running (on a worker thread: a run starts measurement jobs and waits for them)


@dataclass(frozen=True)
class DoctorRun:
    """What one run brought: the report, or the error that ended it."""

    report: DoctorReport | None
    error: str | None
    seconds: float


def run_doctor(client: Any, hosts: Sequence[str] | None = None) -> DoctorRun:
    """``client.doctor(hosts)``; never raises: a failed call is the run's error."""
    t0 = time.monotonic()
    try:
        report = client.doctor(hosts=list(hosts) if hosts else None)
    except NotImplementedError:
        return DoctorRun(None, "doctor: this controller has no doctor yet (NotImplementedError)",
                         time.monotonic() - t0)
    except Exception as e:
        return DoctorRun(None, f"doctor: {str(e) or type(e).__name__}", time.monotonic() - t0)
    return DoctorRun(report, None, time.monotonic() - t0)
