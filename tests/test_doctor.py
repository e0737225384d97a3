"""``rigdeck doctor``'s network checks: the verdict rules on figures, and on the test bed: a host
whose link is rate-limited (tc tbf, both directions) is named with its figures and the command
exits 1; without the limit nothing is flagged; the all-reduce bus bandwidth agrees with a plain
torch.distributed timing loop run by hand."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.kit.bedcli import Cli
from tests.testbed import TestBed
from tui.control.doctor import allreduce_findings, choose, p2p_findings
from tui.model import wire
from tui.model.doctor import DoctorReport

ROOT = Path(__file__).resolve().parent.parent
LOOP = ROOT / "tests" / "jobscripts" / "allreduce_loop.py"
HOSTS = ("h1", "h2", "h3")
RATE = "40mbit"  # the limited host's link: 5 MB/s each way


def _p2p(bw: dict[tuple[int, int], float], lat: float = 0.2) -> list[dict[str, Any]]:
    return [{"event": "doctor", "kind": "p2p", "src": s, "dst": d, "gbps": v, "latency_ms": lat}
            for (s, d), v in bw.items()]


def test_p2p_verdicts_name_the_host_whose_links_are_slow() -> None:
    fast, slow = 1.2, 0.025
    bw = {(0, 1): fast, (1, 0): fast * 0.97, (0, 2): slow, (2, 0): slow * 1.1, (1, 2): slow, (2, 1): slow}
    found = {f.subject: f for f in p2p_findings(_p2p(bw), list(HOSTS))}
    assert found["h1<->h2"].verdict == "ok"
    assert found["h1<->h3"].verdict == found["h2<->h3"].verdict == "bad"
    assert found["h3"].verdict == "bad" and found["h1"].verdict == found["h2"].verdict == "ok"
    assert "every link of h3 is slow" in found["h1<->h3"].advice
    # The typical link is the median of each host's fastest: the fast one, not a slow one.
    assert found["all"].baseline == pytest.approx(fast * 0.97)
    assert "h1<->h3" in found["all"].summary or "h2<->h3" in found["all"].summary
    assert found["all"].verdict == "bad"


def test_p2p_verdicts_warn_between_half_and_most_of_typical_and_blame_the_path() -> None:
    bw = {(0, 1): 1.0, (1, 0): 1.0, (0, 2): 1.0, (2, 0): 1.0, (1, 2): 0.7, (2, 1): 0.9,
          (0, 3): 1.0, (3, 0): 1.0, (1, 3): 1.0, (3, 1): 1.0, (2, 3): 1.0, (3, 2): 1.0}
    found = {f.subject: f for f in p2p_findings(_p2p(bw), ["a", "b", "c", "d"])}
    assert found["b<->c"].verdict == "warn"  # its slower way counts
    assert "path between them" in found["b<->c"].advice
    assert {found[h].verdict for h in "abcd"} == {"ok"}
    assert sum(f.verdict != "ok" for f in found.values()) == 2  # the link and the set's summary


def test_allreduce_is_judged_against_the_links_with_nccl_only() -> None:
    def rec(backend: str, busbw: float) -> list[dict[str, Any]]:
        return [{"event": "doctor", "kind": "allreduce", "size_bytes": 64 << 20, "time_s": 0.1,
                 "algbw_gbps": busbw * 0.75, "busbw_gbps": busbw, "world": 3, "backend": backend}]

    (slow,) = allreduce_findings(rec("nccl", 4.0), HOSTS, slowest_link_gbps=12.5)
    assert slow.verdict == "warn" and "under half the slowest link" in slow.summary and slow.advice
    (fine,) = allreduce_findings(rec("nccl", 9.0), HOSTS, slowest_link_gbps=12.5)
    assert fine.verdict == "ok" and fine.value == 9.0
    # gloo reduces on the CPUs: a low figure there says nothing about the links
    (cpu,) = allreduce_findings(rec("gloo", 0.4), HOSTS, slowest_link_gbps=0.9)
    assert cpu.verdict == "ok" and "not judged against the links" in cpu.summary
    assert [f.verdict for f in allreduce_findings([], HOSTS)] == ["bad"]


def test_p2p_without_every_pair_is_bad_not_a_guess() -> None:
    out = p2p_findings(_p2p({(0, 1): 1.0, (1, 0): 1.0}), list(HOSTS))
    assert [f.verdict for f in out] == ["bad"] and "h1<->h3" in out[0].summary


def test_a_link_that_comes_back_up_when_measured_again_is_not_flagged() -> None:
    """Each way keeps its best figure over the rounds and the re-measures: an idle link that lost
    its first rounds to a busy moment is judged by its re-measure; one that stays slow is flagged,
    saying how many measures it is the best of."""
    fast = {(0, 1): 1.9, (1, 0): 1.9, (0, 2): 1.9, (2, 0): 1.9}
    busy = _p2p({**fast, (1, 2): 1.45, (2, 1): 1.5})
    again = _p2p({(1, 2): 1.8, (2, 1): 1.85})
    found = {f.subject: f for f in p2p_findings(busy + again, list(HOSTS))}
    assert {f.verdict for f in found.values()} == {"ok"}, [(f.subject, f.summary) for f in found.values()]
    assert found["h2<->h3"].value == 1.8
    still = {f.subject: f for f in p2p_findings(busy + _p2p({(1, 2): 1.4, (2, 1): 1.5}), list(HOSTS))}
    assert still["h2<->h3"].verdict == "warn" and "best of 2 measures" in still["h2<->h3"].summary


def test_the_recheck_picks_the_links_below_the_doctors_own_rule() -> None:
    """The p2p job measures again exactly the links the doctor would flag (one rule:
    runtime.netcheck.link_figures), by rank."""
    from runtime.netcheck import link_figures, slow_links

    bw = {(0, 1): 2.0, (1, 0): 2.1, (0, 2): 0.04, (2, 0): 0.05, (1, 2): 1.5, (2, 1): 1.9}
    link, best, typical = link_figures(bw, 3)
    assert link == {(0, 1): 2.0, (0, 2): 0.04, (1, 2): 1.5}
    assert best == {0: 2.0, 1: 2.0, 2: 1.5} and typical == 2.0
    assert slow_links(bw, 3, 0.8) == [(0, 2), (1, 2)]
    assert slow_links(bw, 3, 0.5) == [(0, 2)]
    assert slow_links({(0, 1): 1.0}, 3, 0.8) == []  # a link with one way measured is not judged


def test_a_pair_that_did_not_finish_in_time_is_named_too_slow_with_its_host() -> None:
    """The job stopped at its time limit: the pairs that reported are judged, those that did not
    are bad and named too slow to finish, and the host none of whose links finished is named."""
    bw = {(0, 1): 1.2, (1, 0): 1.1}
    why = "the job j1 stopped: did not end within 65 s"
    found = {f.subject: f for f in p2p_findings(_p2p(bw), list(HOSTS), unfinished=why)}
    assert found["h1<->h2"].verdict == "ok"
    assert found["h1<->h3"].verdict == found["h2<->h3"].verdict == "bad"
    assert "too slow to finish" in found["h1<->h3"].summary and why in found["h1<->h3"].summary
    assert "every link of h3 is slow" in found["h2<->h3"].advice
    assert found["h3"].verdict == "bad" and found["h1"].verdict == found["h2"].verdict == "ok"
    assert found["all"].verdict == "bad" and "2 of 3 links did not finish" in found["all"].summary
    # Nothing reported at all: one finding that says so.
    assert [f.verdict for f in p2p_findings([], list(HOSTS), unfinished=why)] == ["bad"]


def test_an_allreduce_cut_short_by_its_budget_warns_naming_the_sizes_left_out() -> None:
    rows = [{"event": "doctor", "kind": "allreduce", "size_bytes": mb << 20, "time_s": 0.27 * mb,
             "algbw_gbps": 0.004, "busbw_gbps": 0.005, "world": 3, "backend": "gloo"} for mb in (1, 4)]
    cut = {"event": "doctor", "kind": "allreduce_cut", "sizes_mb": [16, 64], "budget_s": 20}
    (f,) = allreduce_findings([*rows, cut], HOSTS)
    assert f.verdict == "warn" and "16, 64 MB not measured" in f.summary and "20 s budget" in f.summary
    assert "at 4 MB" in f.summary
    (whole,) = allreduce_findings(rows, HOSTS)
    assert whole.verdict == "ok"


def test_the_stages_run_the_host_checks_first_and_combine_into_one_report() -> None:
    from tui.model.doctor import CHECKS, Finding, combine, stages

    assert stages(list(CHECKS)) == [["disk", "versions", "network", "clock", "gpu"], ["p2p"], ["allreduce"]]
    assert stages(["allreduce"]) == [["allreduce"]]
    parts = [DoctorReport(("a", "b"), 10.0, 12.0, (Finding("disk", "a", "ok", "s"),), (("gpu", "none"),)),
             DoctorReport(("a", "b"), 12.0, 30.0, (Finding("p2p", "all", "bad", "s"),), (), ("j1",)),
             DoctorReport(("a", "b"), 30.0, 45.0, (Finding("allreduce", "all", "ok", "s"),), (), ("j2",))]
    whole = combine(parts)
    assert [f.check for f in whole.findings] == ["allreduce", "p2p", "disk"]
    assert (whole.started, whole.ended, whole.job_ids, whole.skipped) == (10.0, 45.0, ("j1", "j2"), (("gpu", "none"),))
    assert whole.worst == "bad"


def test_unknown_hosts_and_checks_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown host 'h9'.*h1, h2"):
        choose(["h1", "h2"], ["h9"], None)
    with pytest.raises(ValueError, match="unknown check 'speed'"):
        choose(["h1", "h2"], None, ["speed"])
    assert choose(["h1", "h2"], None, ["p2p", "allreduce"]) == (["h1", "h2"], ["allreduce", "p2p"])


def test_cli_refuses_an_unknown_check_before_anything_starts(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "tui.cli", "doctor", "--checks", "p2p,speed"],
                          capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "RIGDECK_HOME": str(tmp_path),
                               "RIGDECK_INVENTORY": str(tmp_path / "none.toml")})
    assert proc.returncode == 2 and "--checks: expected some of allreduce,p2p" in proc.stderr


# -- on the test bed ---------------------------------------------------------------------------


def _limit(bed: TestBed, host: str, on: bool) -> None:
    """tbf on both ends of the host's veth: its egress (to the bridge) inside its namespace, and
    the bridge side's egress (to the host) here: the one link, slow both ways."""
    h = bed.host(host)
    for prefix, dev in ((["ip", "netns", "exec", h.netns], "eth0"), ([], h.veth)):
        if on:
            subprocess.run([*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", RATE,
                            "burst", "64kb", "latency", "200ms"], check=True, capture_output=True)
        else:
            subprocess.run([*prefix, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True)


def _doctor(cli: Cli) -> tuple[int, DoctorReport, dict[str, Any]]:
    proc = cli.run("doctor", "--checks", "allreduce,p2p", "--json", check=False)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    return proc.returncode, wire.decode(DoctorReport, data), data


def _show(report: DoctorReport) -> str:
    return "\n".join(f"  {f.check:<9} {f.subject:<8} {f.verdict:<4} {f.summary}" for f in report.findings)


def _busbw(report: DoctorReport, size_mb: int) -> float:
    (ar,) = report.by_check("allreduce")
    return float(dict(ar.details)[f"{size_mb}MB"]["busbw_gbps"])  # type: ignore[index]


@pytest.mark.testbed
@pytest.mark.quiet  # it judges link speeds: another test loading the CPUs would move them
def test_doctor_on_the_bed_agrees_with_a_plain_loop_and_names_the_rate_limited_host(
        testbed: TestBed, tmp_path: Path) -> None:
    """Acceptance 1 and 2 in one pass over the bed (each measurement is a job of 3 ranks that
    import torch: the cost is in the jobs, so they are shared).

    The all-reduce's bus bandwidth against a plain torch.distributed timing loop launched by hand
    (``tests/jobscripts/allreduce_loop.py``, no rigdeck import, the same sizes), the two taking
    turns three times. The machine is shared (2 cores for the 3 hosts and everything else), and
    load only ever slows a run down: each side's figure is its best of three. Then h3's link is limited with tbf both
    ways to 40 Mbit/s and the doctor, as people run it (the table), names h3's links and exits 1
    within 2 minutes."""
    cli = Cli(testbed, tmp_path, timeout=600)  # a doctor's run on the loaded bed may take minutes
    size_mb = 64
    spec = tmp_path / "loop.toml"
    # The doctor's sizes on CPU, in its order, each with its warm-up and iterations: the same
    # work by hand, compared at the largest.
    spec.write_text(f'name = "plain-allreduce"\ncommand = ["{{python}}", "{LOOP}", "1,4,16,{size_mb}", "10", "2"]\n'
                    f'workdir = "{ROOT}"\nhosts = ["h1", "h2", "h3"]\nprocesses_per_node = 1\n')

    def by_hand() -> float:
        view = json.loads(cli.run("launch", str(spec), "--wait", "--json", check=False).stdout)
        assert view["state"] == "succeeded", view
        logs = cli.run("logs", view["job_id"], check=False).stdout
        found = {int(m.group(1)): float(m.group(3)) for m in re.finditer(
            r"plain-allreduce size_bytes=(\d+) time_s=([\d.]+) busbw_gbps=([\d.]+)", logs)}
        assert size_mb << 20 in found, logs[-2000:]
        return found[size_mb << 20]

    # Without a limit: every check ok, exit 0; the first of the doctor's all-reduce figures.
    code, clean, data = _doctor(cli)
    print(f"\nwithout a limit: exit {code}\n{_show(clean)}")
    assert code == 0 and clean.worst == "ok", _show(clean)
    assert len(clean.job_ids) == 2 and {f.subject for f in clean.by_check("p2p")} >= {"h1<->h2", "h1<->h3", "h2<->h3"}
    assert set(data) == {"hosts", "started", "ended", "findings", "skipped", "job_ids"}
    assert set(data["findings"][0]) == {"check", "subject", "verdict", "summary", "advice", "value", "unit",
                                        "baseline", "details"}
    doctor, hand = [_busbw(clean, size_mb)], [by_hand()]
    for _ in range(2):
        proc = cli.run("doctor", "--checks", "allreduce", "--json", check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        doctor.append(_busbw(wire.decode(DoctorReport, json.loads(proc.stdout)), size_mb))
        hand.append(by_hand())
    d, plain = max(doctor), max(hand)
    print(f"busbw at {size_mb} MB over 3 hosts (gloo), 3 runs each taking turns: doctor best {d:.4f} GB/s "
          f"({', '.join(f'{v:.4f}' for v in doctor)}); plain loop best {plain:.4f} GB/s "
          f"({', '.join(f'{v:.4f}' for v in hand)}); doctor/plain {d / plain:.3f}")
    # The same measure, not a close timing: with 3 hosts on 2 shared cores single runs vary by
    # +-20% (more under other load), so the 10% agreement is bench/doctor_busbw.py's (7 rounds
    # each, a quiet machine). Here: the same quantity in the same unit (bits for bytes, a size
    # off by 2x, a per-rank time for the slowest rank's fall outside).
    assert 0.7 <= d / plain <= 1.4, (doctor, hand)

    # h3's link limited both ways to 40 Mbit/s: the doctor, as people run it (the table, every
    # stage shown as it ends), names h3's links and h3 only, exits 1, and ends within 2 minutes
    # however slow the link (its measurements are sized by time).
    try:
        _limit(testbed, "h3", True)
        proc = subprocess.Popen([sys.executable, "-m", "tui.cli", "doctor", "--checks", "allreduce,p2p"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli.env, cwd=ROOT)
        assert proc.stdout is not None
        lines, running_at_p2p = [], None
        for line in proc.stdout:
            lines.append(line)
            if running_at_p2p is None and line.startswith("p2p "):
                running_at_p2p = proc.poll() is None  # the links shown while the all-reduce runs
        code, err = proc.wait(timeout=300), proc.stderr.read() if proc.stderr else ""
    finally:
        _limit(testbed, "h3", False)
    out = "".join(lines)
    print(f"h3 limited to {RATE} both ways: exit {code}\n{out}")
    assert code == 1, err[-3000:]
    assert running_at_p2p is True and out.index("\np2p ") < out.index("\nallreduce ")
    took = re.search(r"^doctor: bad over h1, h2, h3 in (\d+) s$", out, re.M)
    assert took and int(took.group(1)) <= 120, out[-500:]
    rows = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(
        r"^p2p\s+(\S+)\s+(ok|WARN|BAD)\s+(.*)$", out, re.M)}
    assert rows["h3"][0] == rows["h1<->h3"][0] == rows["h2<->h3"][0] == "BAD", rows
    assert rows["h1"][0] == rows["h2"][0] == rows["h1<->h2"][0] == "ok", rows
    assert re.search(r"slowest link h[12]<->h3 [\d.]+ MB/s, \d+% below typical", rows["all"][1]), rows["all"]
    assert "every link of h3 is slow" in rows["h1<->h3"][1]
    # Figures that fit the limit: 40 Mbit/s is 5 MB/s; the fast link is many times that.
    for pair in ("h1<->h3", "h2<->h3"):
        ways = [float(v) for v in re.findall(r"h\d->h\d ([\d.]+) MB/s", rows[pair][1])]
        assert len(ways) == 2 and all(1 < v < 6.5 for v in ways), rows[pair]
    fast = re.search(r"h1->h2 ([\d.]+) (MB|GB)/s", rows["h1<->h2"][1])
    assert fast and float(fast.group(1)) * (1000 if fast.group(2) == "GB" else 1) > 20 * 5, rows["h1<->h2"]
