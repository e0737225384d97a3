"""Artifacts between hosts: a finished job's 66 MB output on one test bed host moved to the 2
others, rigdeck's pack + stage vs `scp -3 -r` (through the workstation, as rigdeck goes).

The baseline is what a user types to hand a step's outputs to the next step's hosts when the
hosts share no storage and cannot (or may not) reach each other: one `scp -3 -r` per destination
host (the bytes go source -> workstation -> destination), all started at once and waited for.
rigdeck packs the output on the source host (hashing every file: its time is reported apart and
inside the total), then stages the tree onto both hosts: each content fetched once from the
source and passed on to both, checked by SHA-256 where it lands. Both sides move the same
directory in the same run, each case repeated and the median reported; destination dirs are
emptied between rounds. The controller is connected (the app or a server: connections open).

The output (fixed seed): 4 files of 16 MiB of random bytes and 200 small text files.
Needs root (the network-namespace test bed). Usage: python bench/artifacts.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402
from tests.testbed import TestBed, available  # noqa: E402
from tui.control.hostlinks import HostLinks  # noqa: E402
from tui.remote.artifacts import merge, stage  # noqa: E402
from tui.remote.inventoryfile import load_inventory  # noqa: E402


def make_job(bed: TestBed, host: str, job_id: str, seed: int = 0) -> dict[str, int]:
    """An ended job on ``host`` whose output dir holds the files (as its agent keeps a job)."""
    rng = random.Random(seed)
    d = bed.host(host).state_dir / "jobs" / job_id
    out = d / "sagemaker" / "output" / "data"
    (out / "logs").mkdir(parents=True)
    big = 0
    for i in range(4):
        data = rng.randbytes(16 << 20)
        (out / f"shard-{i}.bin").write_bytes(data)
        big += len(data)
    small = 0
    for i in range(200):
        text = "".join(f"step {k} loss {rng.random():.6f}\n" for k in range(rng.randint(10, 200)))
        (out / "logs" / f"log-{i}.txt").write_text(text)
        small += len(text)
    (d / "plan.json").write_text(json.dumps({"job_id": job_id, "nodes": [{"host": host}], "node_index": 0}))
    (d / "state.json").write_text(json.dumps({"job_id": job_id, "state": "succeeded", "host": host}))
    return {"big_files": 4, "big_bytes": big, "small_files": 200, "small_bytes": small}


def ssh_opts(bed: TestBed) -> list[str]:
    return ["-i", str(bed.user_key), "-o", f"UserKnownHostsFile={bed.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]


def time_scp(bed: TestBed, src: str, job_id: str, dests: list[str]) -> float:
    path = f"/root/.rigdeck/jobs/{job_id}/sagemaker/output/data"
    start = time.perf_counter()
    procs = [subprocess.Popen(["scp", "-3", "-r", "-q", *ssh_opts(bed), f"root@{bed.host(src).address}:{path}",
                               f"root@{bed.host(h).address}:/root/.rigdeck/scp-bench"]) for h in dests]
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - start
    assert codes == [0] * len(procs), codes
    return elapsed


def clear(bed: TestBed, dests: list[str]) -> None:
    for h in dests:
        shutil.rmtree(bed.host(h).state_dir / "code", ignore_errors=True)
        shutil.rmtree(bed.host(h).state_dir / "scp-bench", ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "artifacts.json"))
    args = ap.parse_args()
    meta = run_meta()
    ok, why = available()
    if not ok:
        print(f"bench/artifacts.py needs the test bed: {why}", file=sys.stderr)
        return 2
    cases: dict[str, list[float]] = {"scp": [], "rigdeck": [], "rigdeck_pack": [], "rigdeck_stage": []}
    sent: list[dict[str, Any]] = []
    src, dests = "h1", ["h2", "h3"]
    with TestBed(3) as bed:
        inv = load_inventory(bed.inventory_path)
        with HostLinks(inv) as ctl:
            for h in inv.names:
                ctl.agent(h).ping()  # deploy once, outside any timing
            for r in range(args.rounds):
                job_id = f"bench-art-{uuid.uuid4().hex[:8]}"
                out = make_job(bed, src, job_id)
                total = out["big_bytes"] + out["small_bytes"]
                clear(bed, dests)
                cases["scp"].append(time_scp(bed, src, job_id, dests))
                clear(bed, dests)
                start = time.perf_counter()
                pack = ctl.agent(src).artifact_pack(job_id=job_id, kind="output", timeout=600)
                packed = time.perf_counter()
                got = stage(ctl, merge({src: pack}), dests, timeout=300)
                done = time.perf_counter()
                bad = {h: str(v) for h, v in got.items() if isinstance(v, Exception)}
                assert not bad, bad
                cases["rigdeck"].append(done - start)
                cases["rigdeck_pack"].append(packed - start)
                cases["rigdeck_stage"].append(done - packed)
                sent = [v.to_json() for v in got.values() if not isinstance(v, Exception)]
                print(f"round {r + 1}: scp {cases['scp'][-1]:.2f} s, rigdeck {cases['rigdeck'][-1]:.2f} s "
                      f"(pack {cases['rigdeck_pack'][-1]:.2f} s)", flush=True)
    med = {k: statistics.median(v) for k, v in cases.items()}
    print(f"output: {out['big_files']} random files ({out['big_bytes'] / 1e6:.1f} MB) + {out['small_files']} "
          f"text files ({out['small_bytes'] / 1e6:.2f} MB) = {total / 1e6:.1f} MB on {src}, to {', '.join(dests)}; "
          f"{args.rounds} rounds (median)")
    print(f"  2 parallel scp -3 -r (baseline)        {med['scp']:.3f} s")
    print(f"  rigdeck pack + stage                   {med['rigdeck']:.3f} s   {med['rigdeck'] / med['scp']:.2f}x "
          f"the baseline's time")
    print(f"    of which pack (hash on {src})         {med['rigdeck_pack']:.3f} s")
    print(f"    stage (fetch once, put on both)      {med['rigdeck_stage']:.3f} s")
    print(f"    rigdeck sent each host {sent[0]['files_sent']} files, {sent[0]['bytes_sent'] / 1e6:.1f} MB, "
          "each checked by SHA-256 where it landed")
    result = {"output": out, "hosts": 3, "rounds": args.rounds, "source": src, "destinations": dests,
              "baseline": "one scp -3 -r per destination host (through the workstation), started at once, waited for",
              "seconds": cases, "median": med, "sent": sent, "ratio_vs_scp": med["rigdeck"] / med["scp"]}
    write_result(args.out, result, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
