"""Deploy the agent to 8 test bed hosts vs. copying the same file with 8 parallel `scp` calls.

The baseline is what a user would type: one `scp` per host, all started at once and waited for
(`for h in ...; do scp agent.pyz $h: & done; wait`). Both sides run in one process against the
same hosts in the same run; each is repeated and the median is reported. rigdeck's side does more
than copy: it probes each host, uploads, has the host verify the SHA-256, moves the file into
place and runs `agent.pyz version`. Two more lines show what that extra costs by ordinary
means: `scp`, then `ssh HOST python3 agent.pyz version` (the same work), and `ssh HOST python3 -c
pass` alone (one Python start on each host through its login shell, which scp never pays).
Needs root (the network-namespace test bed). Usage: python bench/deploy.py [--hosts 8] [--rounds 5]
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402
from tests.testbed import TestBed, available  # noqa: E402
from tui.control.controller import Controller  # noqa: E402
from tui.remote.bundle import build_agent  # noqa: E402
from tui.remote.sshconfig import load_inventory  # noqa: E402


def time_rigdeck(bed: TestBed, fresh: bool) -> float:
    if fresh:
        for h in bed.hosts:
            shutil.rmtree(h.state_dir / "agent", ignore_errors=True)
    inv = load_inventory(bed.inventory_path)
    start = time.perf_counter()
    with Controller(inv) as ctl:
        reports = ctl.deploy()
    elapsed = time.perf_counter() - start
    bad = [r.error for r in reports if r.error]
    assert not bad, bad
    assert all(r.copied is fresh for r in reports), [r.copied for r in reports]
    return elapsed


def time_scp_parallel(bed: TestBed, path: Path) -> float:
    """One `scp` per host, all started at once, then wait for every one (`& ... wait`)."""
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            ["scp", "-q", "-i", str(bed.user_key), "-o", f"UserKnownHostsFile={bed.known_hosts}",
             "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
             str(path), f"root@{h.address}:.rigdeck/scp-bench.pyz"],
        )
        for h in bed.hosts
    ]
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - start
    assert codes == [0] * len(procs), codes
    return elapsed


def _ssh(bed: TestBed) -> list[str]:
    return ["-i", str(bed.user_key), "-o", f"UserKnownHostsFile={bed.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]


def time_scp_then_version(bed: TestBed, path: Path) -> float:
    """The same work by ordinary means: `scp` the archive, then `ssh HOST python3 agent.pyz
    version` (the host runs it, so it checks its hash and prints the facts), each host at once."""
    start = time.perf_counter()
    procs = []
    for h in bed.hosts:
        dest = ".rigdeck/scp-bench.pyz"
        scp = shlex.join(["scp", "-q", *_ssh(bed), str(path), f"root@{h.address}:{dest}"])
        ssh = shlex.join(["ssh", *_ssh(bed), f"root@{h.address}", f"python3 {dest} version"])
        procs.append(subprocess.Popen(["sh", "-c", f"{scp} && {ssh}"], stdout=subprocess.DEVNULL))
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - start
    assert codes == [0] * len(procs), codes
    return elapsed


def time_ssh_python(bed: TestBed) -> float:
    """The least any check on the hosts costs: one `ssh HOST python3 -c pass` each, at once
    (a Python started through the login shell; scp starts no process on the host)."""
    start = time.perf_counter()
    procs = [subprocess.Popen(["ssh", *_ssh(bed), f"root@{h.address}", "python3 -c pass"]) for h in bed.hosts]
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - start
    assert codes == [0] * len(procs), codes
    return elapsed


def versus(t: float, base: float) -> str:
    """The time as a ratio of the baseline's, and which way it goes."""
    side = f"{base / t:.2f}x faster" if t <= base else f"{t / base:.2f}x slower"
    return f"ratio {t / base:.2f}x of the baseline's time ({side})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "deploy.json"))
    args = ap.parse_args()
    meta = run_meta()
    ok, why = available()
    if not ok:
        print(f"bench/deploy.py needs the test bed: {why}", file=sys.stderr)
        return 2
    bundle = build_agent()
    with TestBed(args.hosts) as bed:
        fresh, again, scp, scp_version, python = [], [], [], [], []
        for _ in range(args.rounds):
            fresh.append(time_rigdeck(bed, fresh=True))
            again.append(time_rigdeck(bed, fresh=False))
            scp.append(time_scp_parallel(bed, bundle.path))
            scp_version.append(time_scp_then_version(bed, bundle.path))
            python.append(time_ssh_python(bed))
    med = {k: statistics.median(v) for k, v in (
        ("fresh", fresh), ("again", again), ("scp_parallel", scp), ("scp_then_version", scp_version),
        ("ssh_python", python))}
    print(f"agent {bundle.version}, {bundle.size} bytes, {args.hosts} hosts, {args.rounds} rounds (median)")
    print(f"  {args.hosts} parallel scp calls (baseline)".ljust(41) + f"{med['scp_parallel']:.3f} s")
    print(f"  rigdeck deploy, fresh hosts            {med['fresh']:.3f} s   "
          f"{versus(med['fresh'], med['scp_parallel'])}")
    print(f"  rigdeck deploy, already current        {med['again']:.3f} s   "
          f"{versus(med['again'], med['scp_parallel'])}")
    print(f"  {args.hosts} parallel scp, then ssh python3 agent.pyz version (the same work)".ljust(41)
          + f"  {med['scp_then_version']:.3f} s   rigdeck fresh: "
          f"{versus(med['fresh'], med['scp_then_version'])}")
    print(f"  {args.hosts} parallel ssh python3 -c pass (one Python start on each host)".ljust(41)
          + f"  {med['ssh_python']:.3f} s")
    result = {
        "hosts": args.hosts, "rounds": args.rounds, "agent_bytes": bundle.size,
        "baseline": f"{args.hosts} scp processes started at once, then waited for",
        "scp_parallel_s": scp, "rigdeck_fresh_s": fresh, "rigdeck_current_s": again,
        "scp_then_version_s": scp_version, "ssh_python_s": python,
        "median": med, "ratio_fresh_vs_parallel_scp": med["fresh"] / med["scp_parallel"],
        "ratio_current_vs_parallel_scp": med["again"] / med["scp_parallel"],
        "ratio_fresh_vs_scp_then_version": med["fresh"] / med["scp_then_version"],
    }
    write_result(args.out, result, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
