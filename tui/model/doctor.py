"""What ``rigdeck doctor`` finds: frozen dataclasses the controller builds and the app, the CLI
and the server's wire (tui.model.wire) share.

A finding is one measured or compared fact about a host, a pair of hosts or the whole set, with a
verdict and one line of advice. The checks (tui.control.doctor) run through the normal launch
path (measurement jobs) and the agents (versions, links, disks)."""

from __future__ import annotations

from dataclasses import dataclass

VERDICTS = ("ok", "warn", "bad")
# The checks, in the order a report lists them.
CHECKS = ("allreduce", "p2p", "disk", "versions", "network", "clock", "gpu")
NETWORK_CHECKS = ("allreduce", "p2p")  # measurement jobs; the rest ask the agents


def stages(checks: tuple[str, ...] | list[str]) -> list[list[str]]:
    """``checks`` in the order a person wants answers: the per-host checks first (seconds), then
    the point-to-point links, then the all-reduce (which is judged against the links). A face
    runs one stage after another and shows each as it ends."""
    host = [c for c in checks if c not in NETWORK_CHECKS]
    return [s for s in (host, [c for c in checks if c == "p2p"], [c for c in checks if c == "allreduce"]) if s]


@dataclass(frozen=True)
class Finding:
    """One fact with its verdict. ``subject``: a host (``h2``), a pair (``h1<->h3``), or
    ``all`` for the whole set of hosts."""

    check: str  # one of CHECKS
    subject: str
    verdict: str  # "ok", "warn" or "bad"
    summary: str  # one line: what was measured or compared, with its figures
    advice: str = ""  # one line: what to do about it ("" when ok)
    value: float | None = None  # the main figure (GB/s, MB/s, ms, ...), for sorting and charts
    unit: str = ""
    baseline: float | None = None  # what it was compared with (the median, the primary's, ...)
    # The raw figures: (name, value) pairs, e.g. (("size_mb", 64), ("algbw_gbps", 1.2), ...)
    details: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class DoctorReport:
    """One run of the doctor over some hosts."""

    hosts: tuple[str, ...]
    started: float
    ended: float | None
    findings: tuple[Finding, ...]
    # Checks that could not run, with why: (check, reason), e.g. ("gpu", "no NVML on any host").
    skipped: tuple[tuple[str, str], ...] = ()
    job_ids: tuple[str, ...] = ()  # the measurement jobs it ran (rigdeck status works on them)

    @property
    def worst(self) -> str:
        """"bad" if any finding is bad, else "warn" if any warns, else "ok"."""
        verdicts = {f.verdict for f in self.findings}
        return "bad" if "bad" in verdicts else "warn" if "warn" in verdicts else "ok"

    def by_check(self, check: str) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.check == check)


def combine(parts: list[DoctorReport]) -> DoctorReport:
    """One report of the stages' reports (``stages``), each check in CHECKS' order."""
    order = {c: i for i, c in enumerate(CHECKS)}
    findings = sorted((f for p in parts for f in p.findings), key=lambda f: order.get(f.check, len(order)))
    ends = [p.ended for p in parts]
    return DoctorReport(hosts=parts[0].hosts, started=min(p.started for p in parts),
                        ended=None if None in ends else max(e for e in ends if e is not None),
                        findings=tuple(findings), skipped=tuple(s for p in parts for s in p.skipped),
                        job_ids=tuple(j for p in parts for j in p.job_ids))
