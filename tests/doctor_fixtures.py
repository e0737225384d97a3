"""A recorded doctor report for the Doctor view's tests: a DoctorReport as the controller builds
it (tui.model.doctor), no network, no clocks.

Three hosts; h3's link is rate-limited (``tc ... tbf`` on the test bed), so both of its p2p links
are bad at about 12% of the median; the all-reduce bus bandwidth, the disks and the clocks are ok;
torch drifts: 2.5.1 on h1 and h2, missing on h3; the GPU check is skipped (simulated GPUs: no
NVML).
"""

from __future__ import annotations

import threading
from typing import Any

from tests.ui_fixtures import NOW
from tui.model.doctor import DoctorReport, Finding

HOSTS = ("h1", "h2", "h3")
STARTED = NOW - 125.0  # two minutes before the app's clock
JOBS = ("doctor-allreduce-1125-0241-a1b2", "doctor-p2p-1125-0242-c3d4", "doctor-disk-1125-0242-e5f6")
MEDIAN = 1180.0  # MB/s, the median link


def _p2p(pair: str, mbps: float, lat_ms: float) -> Finding:
    pct = 100.0 * mbps / MEDIAN
    bad = pct < 50
    return Finding(
        check="p2p", subject=pair, verdict="bad" if bad else "ok",
        summary=f"{mbps:.0f} MB/s, {lat_ms:.2f} ms; {pct:.0f}% of the median {MEDIAN:.0f} MB/s",
        advice=("check this link: its NICs, cables, switch port and any rate limit (tc qdisc)"
                if bad else ""),
        value=mbps, unit="MB/s", baseline=MEDIAN,
        details=(("size_mb", 64), ("latency_ms", lat_ms)),
    )


def report() -> DoctorReport:
    findings = (
        Finding("allreduce", "all", "ok",
                "busbw 1.42 GB/s, algbw 1.07 GB/s at 64 MB over 3 hosts (gloo)",
                value=1.42, unit="GB/s",
                details=(("size_mb", 64), ("algbw_gbps", 1.07), ("busbw_gbps", 1.42))),
        _p2p("h1<->h2", 1180.0, 0.08),
        _p2p("h1<->h3", 143.0, 0.61),
        _p2p("h2<->h3", 139.0, 0.64),
        Finding("disk", "h1", "ok", "write 812 MB/s (fsync), read 2.1 GB/s of /var/lib/rigdeck/data",
                value=812.0, unit="MB/s"),
        Finding("disk", "h2", "ok", "write 798 MB/s (fsync), read 2.0 GB/s of /var/lib/rigdeck/data",
                value=798.0, unit="MB/s"),
        Finding("disk", "h3", "ok", "write 805 MB/s (fsync), read 2.1 GB/s of /var/lib/rigdeck/data",
                value=805.0, unit="MB/s"),
        Finding("versions", "all", "ok", "python 3.11.2 on every host"),
        Finding("versions", "h3", "bad", "torch: missing on h3; 2.5.1 on h1, h2",
                advice="install torch 2.5.1 on h3 (or point its python at the others' venv)",
                details=(("h1", "2.5.1"), ("h2", "2.5.1"), ("h3", None))),
        Finding("clock", "h2", "ok", "offset +0.4 ms from h1", value=0.4, unit="ms"),
        Finding("clock", "h3", "ok", "offset -0.7 ms from h1", value=-0.7, unit="ms"),
    )
    return DoctorReport(
        hosts=HOSTS, started=STARTED, ended=STARTED + 48.0, findings=findings,
        skipped=(("gpu", "no NVML (simulated GPUs)"),), job_ids=JOBS,
    )


class RecordedDoctor:
    """What the stand-in client's ``doctor`` does: return ``result``, raise ``error``, or wait
    on ``gate`` first (a slow or hung controller)."""

    def __init__(self, result: DoctorReport | None = None):
        self.result = result or report()
        self.error: BaseException | None = None
        self.gate: threading.Event | None = None
        self.calls: list[tuple[Any, Any]] = []
        self.started = threading.Event()

    def __call__(self, hosts: Any = None, checks: Any = None) -> DoctorReport:
        self.calls.append((hosts, checks))
        self.started.set()
        if self.gate is not None:
            self.gate.wait(10)
        if self.error is not None:
            raise self.error
        return self.result


def doctor_client(doctor: RecordedDoctor | None = None) -> Any:
    """An InProcessClient over the recorded cluster (tests/ui_fixtures.py) whose ``doctor``
    answers from ``doctor``; with None, the client's own (NotImplementedError today)."""
    from tests.ui_fixtures import (
        FakeController,
        FakeMonitor,
        RecordedJobs,
        RecordedSweeps,
        cluster_state,
        recorded_service,
    )
    from tui.client import InProcessClient

    service = recorded_service(FakeController(), FakeMonitor(cluster_state()), RecordedJobs(),
                               RecordedSweeps())
    client = InProcessClient(service=service)
    if doctor is not None:
        client.doctor = doctor  # type: ignore[method-assign]
    return client


def doctor_app(doctor: RecordedDoctor | None = None, **kw: Any) -> Any:
    from tests.ui_fixtures import recorded_app

    return recorded_app(client=doctor_client(doctor), **kw)
