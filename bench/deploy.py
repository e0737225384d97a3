"""Deploy the agent to 8 test bed hosts vs. copying the same file with 8 parallel `scp` calls.

The baseline is what a user would type: one `scp` per host, all started at once and waited for
(`for h in ...; do scp agent.pyz $h: & done; wait`). Both sides run in one process against the
same hosts in the same run; each is repeated and the median is reported. rigdeck's side does more
than copy, over SFTP on its one connection to each host (no process started there, as scp):
it reads the installed file back and hashes it, and where it is missing or differs, writes the
archive to a temporary name, reads that back from the host's disk and hashes it, and renames it
into place; then it names the version current the same way. One more line shows the same work by
ordinary means: `scp`, then `ssh HOST sha256sum FILE` (the copy checked as the host's disk holds
it; ssh starts the login shell and a process there, which SFTP does not).
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
from tui.control.hostlinks import HostLinks  # noqa: E402
from tui.remote.bundle import build_agent  # noqa: E402
from tui.remote.inventoryfile import load_inventory  # noqa: E402


def time_rigdeck(bed: TestBed, fresh: bool) -> float:
    if fresh:
        for h in bed.hosts:
            shutil.rmtree(h.state_dir / "agent", ignore_errors=True)
    inv = load_inventory(bed.inventory_path)
    start = time.perf_counter()
    with HostLinks(inv) as ctl:
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


def time_scp_then_sha256sum(bed: TestBed, path: Path) -> float:
    """The same work by ordinary means: `scp` the archive, then `ssh HOST sha256sum FILE` (the
    hash of what landed, read from the host's disk), each host at once."""
    start = time.perf_counter()
    procs = []
    for h in bed.hosts:
        dest = ".rigdeck/scp-bench.pyz"
        scp = shlex.join(["scp", "-q", *_ssh(bed), str(path), f"root@{h.address}:{dest}"])
        ssh = shlex.join(["ssh", *_ssh(bed), f"root@{h.address}", f"sha256sum {dest}"])
        procs.append(subprocess.Popen(["sh", "-c", f"{scp} && {ssh}"], stdout=subprocess.DEVNULL))
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
        fresh, again, scp, scp_check = [], [], [], []
        for _ in range(args.rounds):
            fresh.append(time_rigdeck(bed, fresh=True))
            again.append(time_rigdeck(bed, fresh=False))
            scp.append(time_scp_parallel(bed, bundle.path))
            scp_check.append(time_scp_then_sha256sum(bed, bundle.path))
    med = {k: statistics.median(v) for k, v in (
        ("fresh", fresh), ("again", again), ("scp_parallel", scp), ("scp_then_sha256sum", scp_check))}
    print(f"agent {bundle.version}, {bundle.size} bytes, {args.hosts} hosts, {args.rounds} rounds (median)")
    print(f"  {args.hosts} parallel scp calls (baseline)".ljust(41) + f"{med['scp_parallel']:.3f} s")
    print(f"  rigdeck deploy, fresh hosts            {med['fresh']:.3f} s   "
          f"{versus(med['fresh'], med['scp_parallel'])}")
    print(f"  rigdeck deploy, already current        {med['again']:.3f} s   "
          f"{versus(med['again'], med['scp_parallel'])}")
    print(f"  {args.hosts} parallel scp, then ssh sha256sum (the same work)   "
          f"{med['scp_then_sha256sum']:.3f} s   rigdeck fresh: "
          f"{versus(med['fresh'], med['scp_then_sha256sum'])}")
    result = {
        "hosts": args.hosts, "rounds": args.rounds, "agent_bytes": bundle.size,
        "baseline": f"{args.hosts} scp processes started at once, then waited for",
        "scp_parallel_s": scp, "rigdeck_fresh_s": fresh, "rigdeck_current_s": again,
        "scp_then_sha256sum_s": scp_check,
        "median": med, "ratio_fresh_vs_parallel_scp": med["fresh"] / med["scp_parallel"],
        "ratio_current_vs_parallel_scp": med["again"] / med["scp_parallel"],
        "ratio_fresh_vs_scp_then_sha256sum": med["fresh"] / med["scp_then_sha256sum"],
    }
    write_result(args.out, result, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
