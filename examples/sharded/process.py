"""Embarrassingly parallel processing: each rank counts the words of its share of the files.

``runtime.shard()`` splits the sorted file list the same way on every host, with no
communication (SageMaker's ShardedByS3Key): every file is processed by exactly one rank. Each rank
writes ``<output>/rank-<R>.json`` (atomically) with its files' word counts, and reports progress.
No torch, no process group.

    python examples/sharded/process.py --input /tmp/words --output /tmp/counts    # one rank
    RANK=1 WORLD_SIZE=2 python examples/sharded/process.py ...                       # rank 1 of 2
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import time

import runtime

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
         "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


def write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def generate(directory: str, count: int, seed: int) -> None:
    """Make sure ``part-0000.txt``... ``count`` files of random words exist. Every rank calls this
    and writes what is missing: the content is the same everywhere and each write is atomic, so
    ranks racing each other (or sharing a directory across hosts) agree on the result."""
    os.makedirs(directory, exist_ok=True)
    for i in range(count):
        path = os.path.join(directory, f"part-{i:04d}.txt")
        if os.path.exists(path):
            continue
        rng = random.Random(seed * 100_003 + i)
        lines = (" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 15)))
                 for _ in range(rng.randint(20, 60)))
        write_atomic(path, "\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--input", default=os.environ.get("SM_CHANNEL_TRAIN") or "sharded-input",
                   help="directory of input files (default: $SM_CHANNEL_TRAIN or sharded-input)")
    p.add_argument("--output", default=None,
                   help="directory for per-rank results (default: $SM_OUTPUT_DATA_DIR or "
                        "sharded-output)")
    p.add_argument("--generate", type=int, default=24,
                   help="first make sure this many generated files are in the input directory "
                        "(0: process the directory as it is)")
    p.add_argument("--by", choices=("rank", "node"), default="rank")
    p.add_argument("--seed", type=int, default=None, help="shuffle before dealing out files")
    args = p.parse_args()
    output = args.output or os.environ.get("SM_OUTPUT_DATA_DIR") or "sharded-output"

    info = runtime.cluster_info()
    if args.by == "node" and info.local_rank != 0:
        print(f"rank {info.rank}: --by node, only local rank 0 of each host works")
        return
    if args.generate > 0:
        generate(args.input, args.generate, seed=0)
    files = sorted(f for f in os.listdir(args.input)
                   if not f.startswith(".") and ".tmp-" not in f)
    mine = runtime.shard(files, by=args.by, seed=args.seed)
    t0 = time.perf_counter()
    results = {}
    total: collections.Counter = collections.Counter()
    for i, name in enumerate(mine):
        with open(os.path.join(args.input, name), encoding="utf-8") as f:
            counts = collections.Counter(f.read().split())
        results[name] = {"words": sum(counts.values()), "distinct": len(counts)}
        total.update(counts)
        runtime.report(step=i, files_done=i + 1, files_total=len(mine))
    os.makedirs(output, exist_ok=True)
    shard_id = info.rank if args.by == "rank" else info.node_rank
    write_atomic(os.path.join(output, f"rank-{shard_id}.json"), json.dumps({
        "rank": info.rank, "world_size": info.world_size, "by": args.by, "host": info.current_host,
        "files": results, "counts": dict(sorted(total.items())),
    }, indent=1) + "\n")
    print(f"rank {info.rank}/{info.world_size}: {len(mine)} of {len(files)} files, "
          f"{sum(total.values())} words in {time.perf_counter() - t0:.2f}s -> {output}")


if __name__ == "__main__":
    sys.exit(main())
