"""Network measurements for ``rigdeck doctor``, run as an ordinary job with one rank per host.

Stdlib and torch only (torch imported when run), so it runs on any host the agent is deployed to:
the runtime ships inside the agent's zipapp and ranks import it from there, so the hosts need no
copy of rigdeck and the script is always the version of the agent that runs it.

    python -m runtime.netcheck allreduce [--sizes-mb 1,4,16,64,256] [--iters 5] [--warmup 2]
    python -m runtime.netcheck p2p [--size-mb 8] [--min-s 0.3] [--max-iters 50] [--rounds 3]

``allreduce``: torch.distributed all-reduce (NCCL on GPUs, gloo on CPU) of float32 tensors of each
size; per size, after the warm-up, ``iters`` timed all-reduces; the time is the average over them
of the slowest rank. ``algbw = bytes / time`` and ``busbw = algbw * 2 (n - 1) / n`` as nccl-tests
defines them. Rank 0 writes one metrics event per size: ``{"event": "doctor", "kind":
"allreduce", "size_bytes", "time_s", "algbw_gbps", "busbw_gbps", "world", "backend", "iters"}``
(GB/s = 1e9 bytes per second).

``p2p``: ``rounds`` times over every pair of ranks (i < j), one pair after another while the
others wait: latency by a ping-pong of one float32 (half the median round trip), then bandwidth
each way: the sender sends ``size_mb`` once to gauge the link, then enough messages to last
``min_s`` (2..``max_iters``), and times them until the receiver's acknowledgement. Each way's
figure is its best round (the lowest latency likewise). The sender writes ``{"event": "doctor",
"kind": "p2p", "src", "dst", "bytes", "time_s", "gbps", "latency_ms", "iters", "rounds_gbps"}``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

GB = 1e9


def _event(**fields: Any) -> None:
    from runtime.metrics import reporter

    reporter().event("doctor", **fields)


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allreduce(sizes_mb: List[float], iters: int, warmup: int) -> None:
    import torch
    import torch.distributed as dist

    from runtime.distributed import init_distributed

    info = init_distributed()
    device = torch.device(info.device if info.device.startswith("cuda") else "cpu")
    n = dist.get_world_size()
    backend = str(dist.get_backend())
    for size_mb in sizes_mb:
        numel = max(1, int(size_mb * (1 << 20)) // 4)
        size = numel * 4
        buf = torch.ones(numel, dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(buf)
        _sync(torch, device)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        _sync(torch, device)
        elapsed = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the collective ends when its slowest rank does
        t = float(elapsed.item())
        algbw = size / t / GB
        busbw = algbw * 2 * (n - 1) / n
        if dist.get_rank() == 0:
            _event(kind="allreduce", size_bytes=size, time_s=t, algbw_gbps=algbw, busbw_gbps=busbw,
                   world=n, backend=backend, iters=iters)
            print(f"allreduce {size} B: {t * 1e3:.2f} ms algbw {algbw:.3f} GB/s busbw {busbw:.3f} GB/s",
                  flush=True)
        del buf


def p2p(size_mb: float, min_s: float, max_iters: int, rounds: int = 3, pings: int = 20) -> None:
    import torch
    import torch.distributed as dist

    from runtime.distributed import init_distributed

    info = init_distributed()
    device = torch.device(info.device if info.device.startswith("cuda") else "cpu")
    n = dist.get_world_size()
    me = dist.get_rank()
    numel = max(1, int(size_mb * (1 << 20)) // 4)
    big = torch.ones(numel, dtype=torch.float32, device=device)
    one = torch.zeros(1, dtype=torch.float32, device=device)
    count = torch.zeros(1, dtype=torch.int64, device=device)
    # (src, dst) -> every round's (bytes, seconds, iterations), measured by src; pair -> latencies
    runs: Dict[Tuple[int, int], List[Tuple[int, float, int]]] = {}
    latency: Dict[Tuple[int, int], List[float]] = {}
    for _round in range(rounds):
        for i in range(n):
            for j in range(i + 1, n):
                if me in (i, j):
                    peer = j if me == i else i
                    rtts = []
                    for k in range(pings + 3):  # latency: i pings, j answers
                        t0 = time.perf_counter()
                        if me == i:
                            dist.send(one, peer)
                            dist.recv(one, peer)
                        else:
                            dist.recv(one, peer)
                            dist.send(one, peer)
                        if k >= 3:
                            rtts.append(time.perf_counter() - t0)
                    latency.setdefault((i, j), []).append(statistics.median(rtts) / 2 * 1e3)
                    for src, dst in ((i, j), (j, i)):
                        if me == src:
                            t0 = time.perf_counter()
                            dist.send(big, dst)
                            dist.recv(one, dst)
                            probe = time.perf_counter() - t0
                            reps = max(2, min(max_iters, math.ceil(min_s / max(probe, 1e-6))))
                            count.fill_(reps)
                            dist.send(count, dst)
                            t0 = time.perf_counter()
                            for _ in range(reps):
                                dist.send(big, dst)
                            dist.recv(one, dst)
                            runs.setdefault((src, dst), []).append((reps * numel * 4, time.perf_counter() - t0, reps))
                        elif me == dst:
                            dist.recv(big, src)
                            dist.send(one, src)
                            dist.recv(count, src)
                            for _ in range(int(count.item())):
                                dist.recv(big, src)
                            dist.send(one, src)
                dist.barrier()  # one pair at a time: the others wait here
    # Each way's figure is its best round: load elsewhere on a host only ever slows a round down.
    for (src, dst), measured in sorted(runs.items()):
        nbytes, t, reps = max(measured, key=lambda m: m[0] / m[1])
        lat = min(latency[(min(src, dst), max(src, dst))])
        _event(kind="p2p", src=src, dst=dst, bytes=nbytes, time_s=t, gbps=nbytes / t / GB, latency_ms=lat,
               iters=reps, rounds_gbps=[round(b / s / GB, 6) for b, s, _ in measured])
        print(f"p2p {src}->{dst}: {nbytes / t / GB:.3f} GB/s (best of {len(measured)}), latency {lat:.3f} ms",
              flush=True)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime.netcheck", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("allreduce")
    a.add_argument("--sizes-mb", default="1,4,16,64,256")
    a.add_argument("--iters", type=int, default=5)
    a.add_argument("--warmup", type=int, default=2)
    p = sub.add_parser("p2p")
    p.add_argument("--size-mb", type=float, default=8.0)
    p.add_argument("--min-s", type=float, default=0.3)
    p.add_argument("--max-iters", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    from runtime.distributed import exit_process, shutdown_distributed

    if args.mode == "allreduce":
        sizes = [float(s) for s in args.sizes_mb.split(",") if s.strip()]
        if not sizes or any(s <= 0 for s in sizes) or args.iters < 1 or args.warmup < 0:
            ap.error("--sizes-mb: positive sizes; --iters >= 1; --warmup >= 0")
        allreduce(sizes, args.iters, args.warmup)
    else:
        if args.size_mb <= 0 or args.max_iters < 2 or args.rounds < 1:
            ap.error("--size-mb must be positive, --max-iters at least 2, --rounds at least 1")
        p2p(args.size_mb, args.min_s, args.max_iters, args.rounds)
    shutdown_distributed()
    exit_process(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
