"""Code sync: a 50 MB tree to 3 test bed hosts, rigdeck's `[code] sync` vs `rsync -a` over ssh.

The baseline is what a user types before each launch: one `rsync -a` over ssh per host, all
started at once and waited for (`for h in ...; do rsync -a -e ssh DIR/ $h:DIR/ & done; wait`).
Both sides send the same tree from a directory the hosts cannot see, into each host's private
state dir, in the same run; each case is repeated and the median reported, after one untimed round
of both first syncs (see ``warm_up``).

- first sync: the hosts have nothing (rigdeck's controller store is empty too, so its side also
  reads and hashes every file); rsync's side starts from empty destinations.
- one file changed: the same tree with one source file edited; rsync compares and sends it,
  rigdeck snapshots the tree again and sends that file's content.

rigdeck is timed twice: with a controller made for the run (its SSH connections, and the
agent's check on each host, inside the time, as rsync's ssh start is inside its time), and with
a connected controller (the app or a server: connections already open). Each does what
``rigdeck launch`` does: the snapshot (read, hash and keep every file in the controller's store),
with the hosts connected to meanwhile (``HostLinks.reach``), then a push to each host at once.
The headline ratio is the first one (connections included): rsync's time includes its own.

The tree (made with a fixed seed): 1,600 source-like text files (~34 MB, compressible) and 16
files of random bytes (~16 MB, not compressible) in nested directories.
Needs root (the network-namespace test bed). Usage: python bench/sync.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402
from tests.testbed import WORKSTATION_ONLY, TestBed, available  # noqa: E402
from tui.control.hostlinks import HostLinks  # noqa: E402
from tui.model.codesync import CodeSpec  # noqa: E402
from tui.remote.codesync import CodeStore, Payloads, push  # noqa: E402
from tui.remote.inventoryfile import load_inventory  # noqa: E402

WORDS = ("loss", "grad", "step", "batch", "model", "layer", "optim", "tensor", "rank", "world",
         "config", "params", "shard", "token", "embed", "attn", "norm", "scale", "warmup", "decay")


def make_tree(root: Path, seed: int = 0) -> dict[str, int]:
    rng = random.Random(seed)
    text_bytes = 0
    for i in range(1600):
        d = root / f"pkg{i % 20}" / f"mod{i % 7}"
        d.mkdir(parents=True, exist_ok=True)
        lines = []
        while sum(len(x) for x in lines) < 21_000:
            a, b, c = rng.choice(WORDS), rng.choice(WORDS), rng.choice(WORDS)
            lines.append(f"    {a}_{b} = {c}({a}, {rng.randint(0, 10**6)}) * {rng.random():.6f}  # {b} {c}\n")
        body = f"def f_{i}():\n" + "".join(lines)
        (d / f"file_{i}.py").write_text(body)
        text_bytes += len(body)
    blob_bytes = 0
    for i in range(16):
        data = rng.randbytes(1 << 20)
        (root / "assets").mkdir(exist_ok=True)
        (root / "assets" / f"blob_{i}.bin").write_bytes(data)
        blob_bytes += len(data)
    return {"text_files": 1600, "text_bytes": text_bytes, "binary_files": 16, "binary_bytes": blob_bytes}


def ssh_opts(bed: TestBed) -> str:
    return (f"ssh -i {bed.user_key} -o UserKnownHostsFile={bed.known_hosts} "
            "-o StrictHostKeyChecking=yes -o BatchMode=yes")


def time_rsync(bed: TestBed, src: Path) -> float:
    start = time.perf_counter()
    procs = [subprocess.Popen(["rsync", "-a", "-e", ssh_opts(bed), f"{src}/",
                               f"root@{h.address}:.rigdeck/rsync-bench/"]) for h in bed.hosts]
    codes = [p.wait() for p in procs]
    elapsed = time.perf_counter() - start
    assert codes == [0] * len(procs), codes
    return elapsed


def time_rigdeck(ctl: HostLinks, store: CodeStore, src: Path) -> tuple[float, list[dict[str, Any]]]:
    start = time.perf_counter()
    ctl.reach(ctl.inventory.names)  # as ControllerService.launch does: connect while reading the files
    code, _ = store.snapshot(CodeSpec(sync=str(src)))
    assert code.tree is not None
    payloads = Payloads(store, store.manifest(code.tree).blobs())  # as JobManager._push_code does

    def one(h: str) -> Any:
        return push(ctl, h, store, code.tree, None, payloads)  # as JobManager._push_code does

    with ThreadPoolExecutor(max_workers=len(ctl.inventory.names)) as pool:
        results = list(pool.map(one, ctl.inventory.names))
    return time.perf_counter() - start, [r.to_json() for r in results]


def clear_hosts(bed: TestBed) -> None:
    for h in bed.hosts:
        shutil.rmtree(h.state_dir / "code", ignore_errors=True)
        shutil.rmtree(h.state_dir / "rsync-bench", ignore_errors=True)


def warm_up(bed: TestBed, ctl: HostLinks, src: Path, work: Path) -> None:
    """One untimed first sync each way, so that every timed case follows the removal of an
    earlier copy on the hosts: ext4 passes over inodes freed in the last minutes when it makes
    files, so without this the first round's rsync alone ran on hosts that had removed nothing
    (measured: that round's rsync was the fastest of every run)."""
    clear_hosts(bed)
    time_rsync(bed, src)
    clear_hosts(bed)
    time_rigdeck(ctl, CodeStore(work / "warm-up" / "code"), src)
    shutil.rmtree(work / "warm-up", ignore_errors=True)


def versus(x: float, base: float) -> str:
    return f"{x / base:.2f}x the baseline's time"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sync.json"))
    args = ap.parse_args()
    meta = run_meta()
    ok, why = available()
    if not ok:
        print(f"bench/sync.py needs the test bed: {why}", file=sys.stderr)
        return 2
    if shutil.which("rsync") is None:
        print("bench/sync.py needs rsync (Debian: apt-get install rsync; make sysdeps does)", file=sys.stderr)
        return 2
    src = Path(WORKSTATION_ONLY) / f"bench-sync-{uuid.uuid4().hex[:8]}"
    work = Path(WORKSTATION_ONLY) / f"bench-sync-home-{uuid.uuid4().hex[:8]}"
    cases: dict[str, list[float]] = {k: [] for k in (
        "rsync_first", "rigdeck_first_new", "rigdeck_first_connected",
        "rsync_change", "rigdeck_change_new", "rigdeck_change_connected")}
    sent: dict[str, Any] = {}
    try:
        tree = make_tree(src)
        total = tree["text_bytes"] + tree["binary_bytes"]
        edit = src / "pkg3" / "mod3" / "file_3.py"
        original = edit.read_text()
        with TestBed(3) as bed:
            inv = load_inventory(bed.inventory_path)
            with HostLinks(inv) as warm:
                for h in inv.names:
                    warm.agent(h).ping()  # deploy once, outside any timing
                warm_up(bed, warm, src, work)
                for r in range(args.rounds):
                    edit.write_text(original)
                    # first sync
                    clear_hosts(bed)
                    cases["rsync_first"].append(time_rsync(bed, src))
                    for key, ctl_new in (("rigdeck_first_new", True), ("rigdeck_first_connected", False)):
                        clear_hosts(bed)
                        shutil.rmtree(work, ignore_errors=True)
                        store = CodeStore(work / "code")
                        if ctl_new:
                            with HostLinks(inv) as ctl:
                                t, res = time_rigdeck(ctl, store, src)
                        else:
                            t, res = time_rigdeck(warm, store, src)
                        cases[key].append(t)
                        sent[key] = res
                    # one file changed (the hosts and the store have the first version)
                    edit.write_text(original + f"# round {r}: one line more\n")
                    cases["rsync_change"].append(time_rsync(bed, src))
                    edit.write_text(original + f"# round {r}: one line more, again\n")
                    with HostLinks(inv) as ctl:
                        t, res = time_rigdeck(ctl, store, src)
                    cases["rigdeck_change_new"].append(t)
                    sent["rigdeck_change_new"] = res
                    edit.write_text(original + f"# round {r}: one line more, a third time\n")
                    t, res = time_rigdeck(warm, store, src)
                    cases["rigdeck_change_connected"].append(t)
                    sent["rigdeck_change_connected"] = res
    finally:
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in cases.items()}
    first_sent = sent["rigdeck_first_connected"]
    change_sent = sent["rigdeck_change_connected"]
    print(f"tree: {tree['text_files']} text files ({tree['text_bytes'] / 1e6:.1f} MB) + {tree['binary_files']} "
          f"random files ({tree['binary_bytes'] / 1e6:.1f} MB) = {total / 1e6:.1f} MB; 3 hosts; "
          f"{args.rounds} rounds (median)")
    print("first sync (hosts empty)")
    print(f"  3 parallel rsync -a over ssh (baseline)      {med['rsync_first']:.3f} s")
    print(f"  rigdeck, controller made for the run         {med['rigdeck_first_new']:.3f} s   "
          f"{versus(med['rigdeck_first_new'], med['rsync_first'])}")
    print(f"  rigdeck, connected controller                {med['rigdeck_first_connected']:.3f} s   "
          f"{versus(med['rigdeck_first_connected'], med['rsync_first'])}")
    print(f"    rigdeck sent each host {first_sent[0]['files_sent']} files, {first_sent[0]['bytes_sent'] / 1e6:.1f} MB "
          f"({first_sent[0]['wire_bytes'] / 1e6:.1f} MB after compression)")
    print("one file changed")
    print(f"  3 parallel rsync -a over ssh (baseline)      {med['rsync_change']:.3f} s")
    print(f"  rigdeck, controller made for the run         {med['rigdeck_change_new']:.3f} s   "
          f"{versus(med['rigdeck_change_new'], med['rsync_change'])}")
    print(f"  rigdeck, connected controller                {med['rigdeck_change_connected']:.3f} s   "
          f"{versus(med['rigdeck_change_connected'], med['rsync_change'])}")
    print(f"    rigdeck sent each host {change_sent[0]['files_sent']} file, {change_sent[0]['bytes_sent']} bytes")
    result = {
        "tree": tree, "hosts": 3, "rounds": args.rounds, "warm_up": "one untimed round of both first syncs first",
        "baseline": "3 rsync -a -e ssh processes (one per host) started at once, then waited for",
        "seconds": cases, "median": med, "sent": sent,
        "ratio_first_new_vs_rsync": med["rigdeck_first_new"] / med["rsync_first"],
        "ratio_first_connected_vs_rsync": med["rigdeck_first_connected"] / med["rsync_first"],
        "ratio_change_new_vs_rsync": med["rigdeck_change_new"] / med["rsync_change"],
        "ratio_change_connected_vs_rsync": med["rigdeck_change_connected"] / med["rsync_change"],
    }
    write_result(args.out, result, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
