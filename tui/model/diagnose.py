"""Live bottleneck signals of a job, from its metrics records: plain rules, no I/O.

Ranks that use ``runtime`` write, on each ``report(step=...)``, ``step_time`` (seconds since
their previous step report) and, when measured, ``data_time`` (waiting in ``runtime.timed``)
and ``comm_time`` (an all-reduce in flight, ``runtime.comm_timer``). ``StepTimes`` keeps each
rank's last ``WINDOW`` of them; ``signals`` turns them into findings:

- **straggler**: a rank whose median busy time (step time less all-reduce time: in synchronous
  training the fast ranks wait for the slow one inside the all-reduce, so their step times match
  and only the busy part tells them apart) is ``STRAGGLER_MARGIN`` times the median of the other
  ranks' medians or more;
- **input_bound**: a host whose ranks spend ``INPUT_SHARE`` of their step time or more waiting
  for data, unless its GPUs are busy (utilization ``GPU_BUSY`` % or more);
- **comm_bound**: ``COMM_SHARE`` of step time or more in all-reduce on every rank (the least
  share of any rank, so time spent waiting for a straggler does not count);
- **lr_scaling**: the job runs at another world size than ``[scaling] reference_world_size``:
  the linearly scaled learning rate and its warm-up, compared with an ``lr`` the job reports.

Each finding has a verdict (ok / warn / bad), a one-line summary and one line of advice.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

WINDOW = 20  # step records per rank the signals look at (the most recent)
MIN_SAMPLES = 3  # a rank needs this many before it is judged
STRAGGLER_MARGIN = 1.3  # x the other ranks' median busy time
STRAGGLER_BAD = 2.0
STRAGGLER_MIN_GAP_S = 0.005  # below this a difference is jitter, whatever the ratio
INPUT_SHARE = 0.3  # of step time waiting for data
INPUT_BAD = 0.6
GPU_BUSY = 60.0  # % utilization at which a host is not input-bound, whatever it waits
COMM_SHARE = 0.3  # of step time in all-reduce
COMM_BAD = 0.5
LR_TOLERANCE = 0.05  # relative: a reported lr this close to the scaled one agrees

KINDS = ("straggler", "input_bound", "comm_bound", "lr_scaling")
VERDICTS = ("ok", "warn", "bad")


@dataclass(frozen=True)
class Signal:
    kind: str  # one of KINDS
    verdict: str  # ok | warn | bad
    summary: str
    advice: str
    host: str | None = None
    rank: int | None = None
    value: float | None = None  # the ratio or share the verdict came from
    read_bps: float | None = None  # input_bound: what the host's disks read now (B/s), when known

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "verdict": self.verdict, "host": self.host, "rank": self.rank,
                "summary": self.summary, "advice": self.advice}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Signal:
        return cls(kind=str(d["kind"]), verdict=str(d["verdict"]), summary=str(d["summary"]),
                   advice=str(d["advice"]), host=d.get("host"), rank=d.get("rank"))


@dataclass(frozen=True)
class _Sample:
    step: int
    step_time: float
    data_time: float | None
    comm_time: float | None


def _num(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and v >= 0:
        return float(v)
    return None


class StepTimes:
    """Each rank's recent step timing, from metrics records as they arrive (``add``)."""

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self.ranks: dict[int, deque[_Sample]] = {}
        self.hosts: dict[int, str] = {}  # rank -> the host its newest record came from
        self.lr: tuple[int, float] | None = None  # (step, lr) of the newest step reporting one

    def add(self, records: Iterable[Mapping[str, Any]]) -> None:
        for r in records:
            if r.get("event") is not None:
                continue
            rank, step = r.get("rank"), r.get("step")
            if not isinstance(rank, int) or isinstance(rank, bool):
                continue
            if not isinstance(step, int) or isinstance(step, bool):
                continue
            lr = _num(r.get("lr"))
            if lr is not None and (self.lr is None or step >= self.lr[0]):
                self.lr = (step, lr)
            st = _num(r.get("step_time"))
            if st is None or st <= 0:
                continue
            if isinstance(r.get("host"), str):
                self.hosts[rank] = r["host"]
            q = self.ranks.setdefault(rank, deque(maxlen=self.window))
            q.append(_Sample(step, st, _num(r.get("data_time")), _num(r.get("comm_time"))))

    def judged(self) -> dict[int, list[_Sample]]:
        return {r: list(q) for r, q in self.ranks.items() if len(q) >= MIN_SAMPLES}


def _busy(s: _Sample, less_comm: bool) -> float:
    return max(0.0, s.step_time - (s.comm_time or 0.0)) if less_comm else s.step_time


def _share(samples: list[_Sample], part: str) -> float | None:
    """The share of step time spent in ``part`` (data_time or comm_time); None when the
    samples do not measure it."""
    have = [s for s in samples if getattr(s, part) is not None]
    if len(have) < MIN_SAMPLES:
        return None
    total = sum(s.step_time for s in have)
    if total <= 0:
        return None
    return min(1.0, sum(getattr(s, part) for s in have) / total)


def _pct(x: float) -> str:
    return f"{x * 100:.0f}%"


def _secs(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def _rate(bps: float) -> str:
    return f"{bps / 1e6:.0f} MB/s"


def _median_without(ordered: list[float], value: float) -> float:
    """The median of ``ordered`` (sorted) less one occurrence of ``value``: O(log n), so a job of
    hundreds of ranks is judged in one pass."""
    i = bisect.bisect_left(ordered, value)
    n = len(ordered) - 1

    def at(j: int) -> float:  # index into the list without position i
        return ordered[j] if j < i else ordered[j + 1]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


def stragglers(times: StepTimes, margin: float = STRAGGLER_MARGIN) -> list[Signal]:
    judged = times.judged()
    if len(judged) < 2:
        return []
    # All-reduce time comes off only when every rank measures it: else the times do not compare.
    less_comm = all(_share(samples, "comm_time") is not None for samples in judged.values())
    medians = {r: statistics.median(_busy(s, less_comm) for s in samples) for r, samples in judged.items()}
    ordered = sorted(medians.values())
    out = []
    for rank, med in sorted(medians.items()):
        others = _median_without(ordered, med)
        if med < margin * others or med - others < STRAGGLER_MIN_GAP_S:
            continue
        ratio = med / others if others > 0 else float("inf")
        host = times.hosts.get(rank)
        where = f"rank {rank} on {host}" if host else f"rank {rank}"
        ratio_s = f"{ratio:.1f}x" if ratio != float("inf") else "far above"
        out.append(Signal(
            kind="straggler", verdict="bad" if ratio >= STRAGGLER_BAD else "warn",
            summary=f"straggler: {where} takes {_secs(med)} a step, {ratio_s} the other ranks' "
                    f"median {_secs(others)}",
            advice=f"look at {host or 'its host'}: other load, throttling, its data loader, its link "
                   "(rigdeck doctor); the other ranks wait for it at every all-reduce",
            host=host, rank=rank, value=ratio))
    return out


def input_bound(times: StepTimes, gpu_util: Mapping[str, float | None] | None = None,
                read_bps: Mapping[str, float | None] | None = None) -> list[Signal]:
    judged = times.judged()
    by_host: dict[str, list[float]] = {}
    for rank, samples in judged.items():
        share = _share(samples, "data_time")
        if share is not None:
            by_host.setdefault(times.hosts.get(rank, "?"), []).append(share)
    out = []
    for host, shares in sorted(by_host.items()):
        share = statistics.median(shares)
        util = (gpu_util or {}).get(host)
        if share < INPUT_SHARE or (util is not None and util >= GPU_BUSY):
            continue
        bps = (read_bps or {}).get(host)
        util_s = f"GPU utilization {util:.0f}%" if util is not None else "GPU utilization unknown"
        read_s = (f"its disks reading {_rate(bps)} now" if bps is not None
                  else "its disks' read rate unknown (no telemetry)")
        out.append(Signal(
            kind="input_bound", verdict="bad" if share >= INPUT_BAD else "warn",
            summary=f"input-bound on {host}: {_pct(share)} of step time waiting for data "
                    f"({util_s}; {read_s})",
            advice="load ahead: more DataLoader workers (num_workers), pin_memory and prefetching; "
                   "keep the data on a local disk; measure the disk with rigdeck doctor",
            host=host if host != "?" else None, value=share, read_bps=bps))
    return out


def comm_bound(times: StepTimes, bucket_cap_mb: int | None = None) -> list[Signal]:
    judged = times.judged()
    shares = [s for samples in judged.values() if (s := _share(samples, "comm_time")) is not None]
    if not shares or len(shares) < len(judged):
        return []
    share = min(shares)  # the least-waiting rank: time spent waiting for a straggler is not comm
    if share < COMM_SHARE:
        return []
    now = f" (now {bucket_cap_mb} MB)" if bucket_cap_mb else " (runtime.ddp uses 64 MB)"
    return [Signal(
        kind="comm_bound", verdict="bad" if share >= COMM_BAD else "warn",
        summary=f"communication-bound: {_pct(share)} of step time in all-reduce on every rank",
        advice=f"fewer, larger gradient buckets: raise bucket_cap_mb{now}; compress gradients "
               "(DDP's fp16/bf16 compress hook); check the links with rigdeck doctor",
        value=share)]


def scaled_lr(base_lr: float, base_world: int, world: int, step: int, warmup_steps: int) -> float:
    """``runtime.scaled_lr``'s rule with the world size for the batch (the per-rank batch is the
    same at both sizes): ``base_lr * world / base_world``, reached linearly over
    ``warmup_steps`` from ``base_lr``."""
    target = base_lr * world / base_world
    if warmup_steps <= 0 or step >= warmup_steps:
        return target
    return base_lr + (target - base_lr) * max(step, 0) / warmup_steps


def lr_scaling(scaling: Mapping[str, Any] | None, world: int, lr: tuple[int, float] | None) -> list[Signal]:
    if not scaling or world <= 0:
        return []
    ref = int(scaling["reference_world_size"])
    if world == ref:
        return []
    base = float(scaling["base_lr"])
    warmup = int(scaling.get("warmup_steps") or 0)
    target = scaled_lr(base, ref, world, warmup, warmup)
    rule = f"{base:g} x {world}/{ref}"
    warm = f", warm-up over {warmup} steps from {base:g}" if warmup else ""
    summary = f"world size {world}, tuned at {ref}: learning rate {target:.6g} ({rule}){warm}"
    advice = (f"runtime.scaled_lr({base:g}, {ref}, {world}, step, {warmup}) gives it step by step "
              "(batch sizes in the ratio of the world sizes)")
    verdict = "ok"
    if lr is not None:
        step, got = lr
        want = scaled_lr(base, ref, world, step, warmup)
        if want > 0 and abs(got - want) / want > LR_TOLERANCE:
            verdict = "warn"
            summary += f"; the job reports lr {got:.6g} at step {step}, expected {want:.6g}"
        else:
            summary += f"; the job's lr {got:.6g} at step {step} agrees"
    return [Signal(kind="lr_scaling", verdict=verdict, summary=summary, advice=advice, value=target)]


def signals(times: StepTimes, *, spec: Mapping[str, Any] | None = None, world: int = 0,
            gpu_util: Mapping[str, float | None] | None = None,
            read_bps: Mapping[str, float | None] | None = None) -> tuple[Signal, ...]:
    """Every finding for one job, worst first. ``spec``: the job's spec as history keeps it
    (``[scaling]`` is read from it); ``world``: its world size; ``gpu_util``: host -> mean
    utilization (%) of the job's GPUs there; ``read_bps``: host -> what its disks read now (B/s)."""
    found = stragglers(times)
    found += input_bound(times, gpu_util, read_bps)
    if not found or all(s.kind != "straggler" for s in found):
        # With a straggler the other ranks' all-reduce time is mostly waiting for it.
        found += comm_bound(times)
    found += lr_scaling((spec or {}).get("scaling"), world, times.lr)
    order = {v: i for i, v in enumerate(reversed(VERDICTS))}
    return tuple(sorted(found, key=lambda s: order[s.verdict]))


def signals_from_records(records: Iterable[Mapping[str, Any]], **kw: Any) -> tuple[Signal, ...]:
    """``signals`` of a job from all its records at once (``rigdeck status``)."""
    times = StepTimes()
    times.add(records)
    return signals(times, **kw)
