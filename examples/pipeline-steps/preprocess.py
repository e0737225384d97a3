"""Write this host's shard of a two-class dataset into the job's output/data.

Two Gaussian blobs in the plane; host ``NODE_RANK`` writes ``shard-<rank>.csv`` (``--rows`` rows)
and the first host also ``test.csv``. Deterministic for a seed, so a rerun makes the same files
(and a pipeline cache entry stays valid)."""

from __future__ import annotations

import argparse
import os
import random


def rows(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        label = rng.random() < 0.5
        cx, cy = (1.2, 1.0) if label else (-1.0, -1.1)
        out.append(f"{rng.gauss(cx, 0.9):.5f},{rng.gauss(cy, 0.9):.5f},{int(label)}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    node = int(os.environ.get("NODE_RANK", "0"))
    out = os.environ.get("SM_OUTPUT_DATA_DIR", "output")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(args.seed * 1000 + node)
    with open(os.path.join(out, f"shard-{node}.csv"), "w") as f:
        f.write("x,y,label\n" + "\n".join(rows(rng, args.rows)) + "\n")
    if node == 0:
        test = random.Random(args.seed * 1000 + 999)
        with open(os.path.join(out, "test.csv"), "w") as f:
            f.write("x,y,label\n" + "\n".join(rows(test, 1000)) + "\n")
    print(f"node {node} on {os.environ.get('SM_CURRENT_HOST')}: wrote shard-{node}.csv to {out}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
