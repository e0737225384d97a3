"""Network measurements for ``rigdeck doctor``, run as an ordinary job with one rank per host.

Stdlib and torch only (torch imported when run), so it runs on any host the agent is deployed to:
the runtime ships inside the agent's zipapp and ranks import it from there, so the hosts need no
copy of rigdeck and the script is always the version of the agent that runs it.

    python -m runtime.netcheck allreduce [--sizes-mb 1,4,16,64,256] [--iters 5] [--warmup 2] [--budget-s 20]
    python -m runtime.netcheck p2p [--size-mb 8] [--min-s 0.3] [--max-iters 50] [--rounds 3]
                                   [--recheck-below 0.8] [--recheck-rounds 6] [--budget-s 20]

Both are sized by time, not bytes, so a slow link costs seconds, not minutes: the figures come
from transfers long enough to measure, and the script stops measuring when its ``budget_s`` is
spent (a link too slow for even the first message is left to the job's own timeout, and the
doctor names what did not report).

``allreduce``: torch.distributed all-reduce (NCCL on GPUs, gloo on CPU) of float32 tensors of each
size, smallest first. Per size, a timed warm-up, then as many timed all-reduces as fit the size's
share of the budget (2..``iters``); the time is the average over them of the slowest rank. A size
whose predicted cost (the last size's time scaled by bytes, for a warm-up and 2 iterations) does
not fit what is left of the budget ends the sizes: rank 0 writes ``{"event": "doctor", "kind":
"allreduce_cut", "sizes_mb", "budget_s"}``. ``algbw = bytes / time`` and ``busbw = algbw * 2 (n -
1) / n`` as nccl-tests defines them. Rank 0 writes one metrics event per size: ``{"event":
"doctor", "kind": "allreduce", "size_bytes", "time_s", "algbw_gbps", "busbw_gbps", "world",
"backend", "iters"}`` (GB/s = 1e9 bytes per second).

``p2p``: ``rounds`` times over every pair of ranks (i < j), one pair after another while the
others wait: latency by a ping-pong of one float32 (half the median round trip), then bandwidth
each way: the sender sends a message of 64 KB, growing 4x up to ``size_mb`` until one takes
``PROBE_S``, then enough of that size to last ``min_s`` (2..``max_iters``), timed until the
receiver's acknowledgement. The sender writes each way's figure as soon as it is measured:
``{"event": "doctor", "kind": "p2p", "src", "dst", "bytes", "time_s", "gbps", "latency_ms",
"iters", "round", "recheck"}``; a way's figure is its best round (load elsewhere only ever slows a
round down). Then the links that look slow are measured again: every rank gathers the figures so
far and, by ``link_figures`` (the doctor's own rule), takes the links below ``recheck_below`` of
the typical one; those pairs alone get another round, up to ``recheck_rounds`` times or until
none is below. A link is flagged only if it stays slow (an idle link that lost a round to a busy
moment comes back up).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

GB = 1e9
PROBE_START_BYTES = 64 << 10  # the first probe message of a p2p way
PROBE_S = 0.05  # a probe this long sizes the timed messages


def link_figures(bw: Dict[Tuple[int, int], float], n: int
                 ) -> Tuple[Dict[Tuple[int, int], float], Dict[int, float], float]:
    """From each way's figure (src, dst) -> GB/s over ranks 0..n-1: each link's (i < j) figure,
    the slower of its two ways; each rank's best link; and the typical link, the median of each
    rank's best (the plain median of the links fails where it is needed most: with one slow host
    among three, two links of three are slow and the median is one of them). Links with a way
    missing are left out. The doctor judges with this, and the p2p check picks what to measure
    again with it: one rule."""
    link = {(i, j): min(bw[(i, j)], bw[(j, i)]) for i in range(n) for j in range(i + 1, n)
            if (i, j) in bw and (j, i) in bw}
    best: Dict[int, float] = {}
    for (i, j), v in link.items():
        best[i] = max(best.get(i, 0.0), v)
        best[j] = max(best.get(j, 0.0), v)
    typical = statistics.median(best.values()) if best else 0.0
    return link, best, typical


def slow_links(bw: Dict[Tuple[int, int], float], n: int, below: float) -> List[Tuple[int, int]]:
    """The links (i < j) under ``below`` times the typical link."""
    link, _best, typical = link_figures(bw, n)
    return sorted(p for p, v in link.items() if typical > 0 and v < below * typical)


def _event(**fields: Any) -> None:
    from runtime.metrics import reporter

    reporter().event("doctor", **fields)


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _agree(torch: Any, dist: Any, device: Any, value: float) -> float:
    """Rank 0's ``value`` on every rank (a decision every rank must take alike)."""
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.broadcast(t, 0)
    return float(t.item())


def _timed_allreduce(torch: Any, dist: Any, device: Any, buf: Any, count: int) -> float:
    """Seconds per all-reduce of ``buf`` over ``count`` of them, the slowest rank's."""
    _sync(torch, device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(count):
        dist.all_reduce(buf)
    _sync(torch, device)
    elapsed = torch.tensor([(time.perf_counter() - t0) / count], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the collective ends when its slowest rank does
    return float(elapsed.item())


def allreduce(sizes_mb: List[float], iters: int, warmup: int, budget_s: float = 20.0) -> None:
    import torch
    import torch.distributed as dist

    from runtime.distributed import init_distributed

    info = init_distributed()
    device = torch.device(info.device if info.device.startswith("cuda") else "cpu")
    n = dist.get_world_size()
    backend = str(dist.get_backend())
    start = time.perf_counter()
    last: Optional[Tuple[int, float]] = None  # (bytes, seconds per all-reduce) of the last size
    for k, size_mb in enumerate(sizes_mb):
        numel = max(1, int(size_mb * (1 << 20)) // 4)
        size = numel * 4
        left = budget_s - (time.perf_counter() - start)
        # Rank 0's clock decides for all: every rank must run the same collectives.
        fits = 1.0
        if last is not None and last[1] * size / last[0] * (1 + 2) > left:
            fits = 0.0
        if _agree(torch, dist, device, fits) == 0.0:
            if dist.get_rank() == 0:
                _event(kind="allreduce_cut", sizes_mb=sizes_mb[k:], budget_s=budget_s)
                print(f"allreduce: {', '.join(f'{s:g}' for s in sizes_mb[k:])} MB not measured: "
                      f"they would not fit the {budget_s:g} s budget", flush=True)
            break
        buf = torch.ones(numel, dtype=torch.float32, device=device)
        t_warm = _timed_allreduce(torch, dist, device, buf, 1)
        if warmup > 1 and t_warm * (warmup - 1) < 0.1 * budget_s:
            _timed_allreduce(torch, dist, device, buf, warmup - 1)
        share = (budget_s - (time.perf_counter() - start)) / (len(sizes_mb) - k)
        count = int(_agree(torch, dist, device, max(2, min(iters, int(share / max(t_warm, 1e-9))))))
        t = _timed_allreduce(torch, dist, device, buf, count)
        last = (size, t)
        algbw = size / t / GB
        busbw = algbw * 2 * (n - 1) / n
        if dist.get_rank() == 0:
            _event(kind="allreduce", size_bytes=size, time_s=t, algbw_gbps=algbw, busbw_gbps=busbw,
                   world=n, backend=backend, iters=count)
            print(f"allreduce {size} B: {t * 1e3:.2f} ms algbw {algbw:.3f} GB/s busbw {busbw:.3f} GB/s "
                  f"({count} iterations)", flush=True)
        del buf


class _Way:
    """One way of a pair: the sender sizes its message by time, then times a run of them."""

    def __init__(self, torch: Any, dist: Any, device: Any, cap_numel: int, min_s: float, max_iters: int):
        self.dist = dist
        self.big = torch.ones(cap_numel, dtype=torch.float32, device=device)
        self.one = torch.zeros(1, dtype=torch.float32, device=device)
        self.ctl = torch.zeros(3, dtype=torch.int64, device=device)  # numel, reps, last
        self.min_s, self.max_iters = min_s, max_iters

    def send(self, dst: int) -> Tuple[int, float, int]:
        """(bytes, seconds, messages) of the timed run to ``dst``."""
        dist, cap = self.dist, self.big.numel()
        numel = min(cap, PROBE_START_BYTES // 4)
        while True:
            self.ctl[0], self.ctl[1], self.ctl[2] = numel, 1, 0
            dist.send(self.ctl, dst)
            t0 = time.perf_counter()
            dist.send(self.big[:numel], dst)
            dist.recv(self.one, dst)
            probe = time.perf_counter() - t0
            if probe >= PROBE_S or numel >= cap:
                break
            numel = min(cap, numel * 4)
        reps = max(2, min(self.max_iters, math.ceil(self.min_s / max(probe, 1e-6))))
        self.ctl[0], self.ctl[1], self.ctl[2] = numel, reps, 1
        dist.send(self.ctl, dst)
        t0 = time.perf_counter()
        for _ in range(reps):
            dist.send(self.big[:numel], dst)
        dist.recv(self.one, dst)
        return reps * numel * 4, time.perf_counter() - t0, reps

    def receive(self, src: int) -> None:
        dist = self.dist
        while True:
            dist.recv(self.ctl, src)
            numel, reps, last = (int(v) for v in self.ctl.tolist())
            for _ in range(reps):
                dist.recv(self.big[:numel], src)
            dist.send(self.one, src)
            if last:
                return


def p2p(size_mb: float, min_s: float, max_iters: int, rounds: int = 3, pings: int = 20,
        recheck_below: float = 0.8, recheck_rounds: int = 6, budget_s: float = 20.0) -> None:
    import torch
    import torch.distributed as dist

    from runtime.distributed import init_distributed

    info = init_distributed()
    device = torch.device(info.device if info.device.startswith("cuda") else "cpu")
    n = dist.get_world_size()
    me = dist.get_rank()
    way = _Way(torch, dist, device, max(1, int(size_mb * (1 << 20)) // 4), min_s, max_iters)
    best: Dict[Tuple[int, int], float] = {}  # (src, dst) -> best GB/s, of the ways this rank sent
    latency: Dict[Tuple[int, int], float] = {}  # (i, j) -> lowest latency (ms), on both of the pair
    start = time.perf_counter()

    def measure(i: int, j: int, round_no: int, recheck: bool) -> None:
        peer = j if me == i else i
        rtts = []
        for k in range(pings + 3):  # latency: i pings, j answers
            t0 = time.perf_counter()
            if me == i:
                dist.send(way.one, peer)
                dist.recv(way.one, peer)
            else:
                dist.recv(way.one, peer)
                dist.send(way.one, peer)
            if k >= 3:
                rtts.append(time.perf_counter() - t0)
        lat = statistics.median(rtts) / 2 * 1e3
        latency[(i, j)] = min(lat, latency.get((i, j), lat))
        for src, dst in ((i, j), (j, i)):
            if me == src:
                nbytes, t, reps = way.send(dst)
                gbps = nbytes / t / GB
                best[(src, dst)] = max(gbps, best.get((src, dst), 0.0))
                _event(kind="p2p", src=src, dst=dst, bytes=nbytes, time_s=t, gbps=gbps,
                       latency_ms=latency[(i, j)], iters=reps, round=round_no, recheck=recheck)
                print(f"p2p {src}->{dst}: {gbps:.3f} GB/s, latency {latency[(i, j)]:.3f} ms"
                      f"{' (again)' if recheck else ''}", flush=True)
            elif me == dst:
                way.receive(src)

    def run(pairs: Sequence[Tuple[int, int]], round_no: int, recheck: bool) -> None:
        for i, j in pairs:
            if me in (i, j):
                measure(i, j, round_no, recheck)
            dist.barrier()  # one pair at a time: the others wait here

    def figures() -> Dict[Tuple[int, int], float]:
        """Every way's best figure so far, on every rank (each rank adds the ways it sent)."""
        m = [0.0] * (n * n)
        for (s, d), v in best.items():
            m[s * n + d] = v
        t = torch.tensor(m, dtype=torch.float64, device=device)
        dist.all_reduce(t)
        got = t.tolist()
        return {(s, d): got[s * n + d] for s in range(n) for d in range(n) if s != d and got[s * n + d] > 0}

    def spent() -> bool:
        return _agree(torch, dist, device, float(time.perf_counter() - start > budget_s)) == 1.0

    every = [(i, j) for i in range(n) for j in range(i + 1, n)]
    for r in range(rounds):
        run(every, r, False)
        if spent():
            break
    for r in range(recheck_rounds):
        again = slow_links(figures(), n, recheck_below)
        if not again or spent():
            break
        run(again, rounds + r, True)


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runtime.netcheck", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("allreduce")
    a.add_argument("--sizes-mb", default="1,4,16,64,256")
    a.add_argument("--iters", type=int, default=5)
    a.add_argument("--warmup", type=int, default=2)
    a.add_argument("--budget-s", type=float, default=20.0)
    p = sub.add_parser("p2p")
    p.add_argument("--size-mb", type=float, default=8.0)
    p.add_argument("--min-s", type=float, default=0.3)
    p.add_argument("--max-iters", type=int, default=50)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--recheck-below", type=float, default=0.8)
    p.add_argument("--recheck-rounds", type=int, default=6)
    p.add_argument("--budget-s", type=float, default=20.0)
    args = ap.parse_args(argv)
    from runtime.distributed import exit_process, shutdown_distributed

    if args.budget_s <= 0:
        ap.error("--budget-s must be positive")
    if args.mode == "allreduce":
        sizes = [float(s) for s in args.sizes_mb.split(",") if s.strip()]
        if not sizes or any(s <= 0 for s in sizes) or args.iters < 2 or args.warmup < 0:
            ap.error("--sizes-mb: positive sizes; --iters >= 2; --warmup >= 0")
        allreduce(sorted(sizes), args.iters, args.warmup, args.budget_s)
    else:
        if args.size_mb <= 0 or args.max_iters < 2 or args.rounds < 1 or args.recheck_rounds < 0:
            ap.error("--size-mb must be positive, --max-iters at least 2, --rounds at least 1, "
                     "--recheck-rounds at least 0")
        p2p(args.size_mb, args.min_s, args.max_iters, args.rounds, recheck_below=args.recheck_below,
            recheck_rounds=args.recheck_rounds, budget_s=args.budget_s)
    shutdown_distributed()
    exit_process(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
