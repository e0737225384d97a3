"""`rigdeck image push` of the suite's training image to 3 hosts, against `podman save | ssh
HOST podman load` by hand, run for the 3 hosts at once (issue 49, acceptance 3).

The image is tests/containerimage.py's (Debian bookworm's python3 with torch, about 1 GB, built
here from Debian's packages: nothing pulled from a registry). The workstation has it in a Podman
store of its own (a storage.conf under a temporary directory: the bed's hosts share this
machine's store, which the workstation must not be); the hosts are 3 test bed hosts.
- rigdeck:  `rigdeck image push IMAGE` (tui/control/images.py: `podman save --format oci-dir`,
            the layers sent as contents of the agents' code stores, `podman load` on each host),
            then the same command again: every host skipped, nothing sent;
- by hand:  `podman save IMAGE | ssh root@hN podman load`, one pipe per host, all three at once
            (what a user with a shell loop and `&` would run).
Before each side of each round, the image is removed from the hosts' store and the agents' code
stores are emptied, so both sides start with hosts that have nothing of it. Rounds alternate the
sides; medians are reported with the ratio rigdeck / by hand (the issue asks <= 1.2x).
Needs root, podman and the test bed.
Usage: python bench/image_push.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._meta import run_meta, write_result  # noqa: E402
from bench.common import bed_env  # noqa: E402
from tests import containerimage  # noqa: E402
from tests.testbed import TestBed, available  # noqa: E402

NODES = 3


def hosts_clear(bed: TestBed, image: str) -> None:
    """No host has anything of the image: gone from their (shared) store and their agents' code stores."""
    subprocess.run(["podman", "rmi", "--force", "--ignore", image], capture_output=True, check=True)
    for h in bed.hosts:
        shutil.rmtree(h.state_dir / "code", ignore_errors=True)


def hosts_have(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image], capture_output=True).returncode == 0


def by_rigdeck(env: dict[str, str], image: str) -> tuple[float, list[dict]]:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "tui.cli", "image", "push", image, "--json"],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    return time.monotonic() - t0, json.loads(out.stdout)


def by_hand(bed: TestBed, ws: dict[str, str], image: str) -> float:
    t0 = time.monotonic()
    pipes = []
    for i in range(1, NODES + 1):
        save = subprocess.Popen(["podman", "save", image], stdout=subprocess.PIPE, env=ws)
        load = subprocess.Popen(bed.ssh_argv(i, "podman", "load", "--quiet"), stdin=save.stdout,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert save.stdout is not None
        save.stdout.close()  # the load holds the pipe: a load that dies ends the save too
        pipes.append((save, load))
    for save, load in pipes:
        _, err = load.communicate()
        if save.wait() != 0 or load.returncode != 0:
            raise SystemExit(f"podman save | ssh podman load failed: {err.decode(errors='replace')[-500:]}")
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "image_push.json"))
    args = ap.parse_args()
    meta = run_meta()
    ok, why = available()
    if not ok:
        print(f"bench/image_push.py needs the test bed: {why}", file=sys.stderr)
        return 2
    if shutil.which("podman") is None:
        print("bench/image_push.py needs podman (make test installs it)", file=sys.stderr)
        return 2
    image = containerimage.ensure()
    archive = containerimage.archive()
    with TestBed(NODES, sim_gpus=0) as bed, tempfile.TemporaryDirectory() as tmpd:
        tmp = Path(tmpd)
        conf = tmp / "storage.conf"
        conf.write_text(f'[storage]\ndriver = "overlay"\ngraphroot = "{tmp}/ws-storage"\nrunroot = "{tmp}/ws-run"\n')
        ws = {**os.environ, "CONTAINERS_STORAGE_CONF": str(conf)}
        subprocess.run(["podman", "load", "--quiet", "-i", str(archive)], env=ws, check=True,
                       stdout=subprocess.DEVNULL)
        inv = bed.write_inventory(tmp / "hosts.toml", python=sys.executable)
        env = {**bed_env(inv, tmp / "home"), "CONTAINERS_STORAGE_CONF": str(conf)}
        size = archive.stat().st_size
        rig: list[float] = []
        again: list[float] = []
        hand: list[float] = []
        sent: list[int] = []
        try:
            for r in range(args.rounds):
                hosts_clear(bed, image)
                secs, rows = by_rigdeck(env, image)
                if any(x["error"] or x["skipped"] for x in rows) or not hosts_have(image):
                    raise SystemExit(f"rigdeck image push did not put the image on every host: {rows}")
                rig.append(secs)
                sent.append(sum(int(x["bytes_sent"]) for x in rows))
                secs2, rows2 = by_rigdeck(env, image)
                if not all(x["skipped"] and not x["bytes_sent"] for x in rows2):
                    raise SystemExit(f"the second push sent something: {rows2}")
                again.append(secs2)
                hosts_clear(bed, image)
                hand.append(by_hand(bed, ws, image))
                if not hosts_have(image):
                    raise SystemExit("podman load by hand left no image")
                print(f"round {r + 1}: rigdeck {rig[-1]:.1f} s ({sent[-1] / 2**20:.0f} MB sent), again "
                      f"{again[-1]:.1f} s (nothing sent) | by hand {hand[-1]:.1f} s", flush=True)
        finally:
            hosts_clear(bed, image)
            subprocess.run(["podman", "rmi", "--force", "--ignore", image], env=ws, capture_output=True)
    containerimage.ensure()  # the suite's tests find it in this machine's store again
    m_rig, m_again, m_hand = statistics.median(rig), statistics.median(again), statistics.median(hand)
    print(f"\nimage {image} ({size / 2**20:.0f} MB as podman save writes it) to {NODES} hosts, "
          f"median of {args.rounds}")
    print(f"  rigdeck image push:                 {m_rig:.1f} s ({statistics.median(sent) / 2**20:.0f} MB sent)")
    print(f"  podman save | ssh podman load x{NODES}:  {m_hand:.1f} s")
    print(f"  ratio rigdeck / by hand:            {m_rig / m_hand:.2f}x (asked: <= 1.2x)")
    print(f"  the same push again:                {m_again:.1f} s, nothing sent")
    result = {"rounds": args.rounds, "image": image, "image_bytes": size, "rigdeck_s": rig, "again_s": again,
              "by_hand_s": hand, "bytes_sent": sent,
              "median": {"rigdeck_s": m_rig, "again_s": m_again, "by_hand_s": m_hand},
              "ratio": m_rig / m_hand}
    write_result(args.out, result, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
