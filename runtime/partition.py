"""Where to cut a model into pipeline stages, from a profile of its blocks (stdlib only, pure).

``partition(profile, partitions, optimize, microbatches, schedule)`` chooses contiguous cut points
over the model's top-level blocks that minimize the slowest stage's time (``optimize="speed"``)
or the largest stage's memory (``optimize="memory"``), and returns the plan: cut points, the
expected time and memory of every stage, the expected pipeline bubble, and the figures of the
equal-layer-count split for comparison.

The profile (what ``runtime.modelparallel`` measures, or anything of the same shape)::

    {"input_bytes": bytes of one microbatch of input,          # optional, default 0
     "blocks": [{"forward_s": ..., "backward_s": ...,           # per microbatch
                 "param_bytes": ..., "grad_bytes": ...,
                 "activation_bytes": ...,                       # saved for backward, per microbatch
                 "output_bytes": ...}, ...]}                    # sent to the next block

A stage's time per microbatch is the sum of its blocks' forward and backward times plus the time
to send what crosses its boundaries at ``bandwidth`` bytes/s: its output activations forward to
the next stage, and the gradient of its input back to the previous one.

A stage's memory is its parameters and gradients plus the activations it keeps for backward
while microbatches are in flight: GPipe (``simple``) runs every microbatch forward before any
backward, so it keeps all ``m``; 1F1B (``interleaved``) keeps at most ``p - stage`` (stage 0
holds the most). With activation checkpointing a stage keeps only each block's input per
microbatch in flight, plus one block's activations while it is recomputed.

The search is exact: a dynamic programme over (stage, last block) that minimizes the bottleneck
(the maximum over stages), O(p * n^2). Ties on the objective are broken by the other figure
(memory for ``speed``, time for ``memory``), then by the earliest cuts.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

PLAN_VERSION = 1
OPTIMIZE = ("speed", "memory")
SCHEDULES = ("simple", "interleaved")
# 10 Gbit/s: the link between two hosts of a plain Ethernet cluster.
DEFAULT_BANDWIDTH = 1.25e9
_BLOCK_FIELDS = ("forward_s", "backward_s", "param_bytes", "grad_bytes", "activation_bytes",
                 "output_bytes")


class PartitionError(ValueError):
    """A profile or a request the partitioner cannot plan for (the message says which field)."""


def bubble(partitions: int, microbatches: int) -> float:
    """Expected idle fraction of a pipeline step, (p - 1) / (m + p - 1), for GPipe and 1F1B."""
    return (partitions - 1) / (microbatches + partitions - 1)


def in_flight(schedule: str, microbatches: int, partitions: int, stage: int) -> int:
    """Microbatches whose activations ``stage`` holds at once under ``schedule``."""
    if schedule == "simple":
        return microbatches
    return min(microbatches, partitions - stage)


def equal_cuts(blocks: int, partitions: int) -> List[int]:
    """Cut points of the equal-layer-count split (sizes differ by at most one, larger first)."""
    base, extra = divmod(blocks, partitions)
    cuts, start = [], 0
    for i in range(partitions - 1):
        start += base + (1 if i < extra else 0)
        cuts.append(start)
    return cuts


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise PartitionError(f"profile: {where} must be a number >= 0, got {value!r}")
    return float(value)


def _read_blocks(profile: Mapping[str, Any]) -> List[Dict[str, float]]:
    if not isinstance(profile, Mapping):
        raise PartitionError(f"profile must be a dict with a 'blocks' list, got {type(profile).__name__}")
    blocks = profile.get("blocks")
    if not isinstance(blocks, list) or not blocks:
        raise PartitionError("profile: 'blocks' must be a non-empty list (the model's top-level "
                             "blocks, in order); this profile has none")
    out = []
    for i, block in enumerate(blocks):
        if not isinstance(block, Mapping):
            raise PartitionError(f"profile: blocks[{i}] must be a dict, got {type(block).__name__}")
        missing = [f for f in _BLOCK_FIELDS if f not in block]
        if missing:
            raise PartitionError(f"profile: blocks[{i}] lacks {', '.join(missing)}")
        out.append({f: _number(block[f], f"blocks[{i}].{f}") for f in _BLOCK_FIELDS})
    return out


class _Model:
    """Stage time and memory of blocks ``[i, j)`` as stage ``s``, from prefix sums."""

    def __init__(self, blocks: List[Dict[str, float]], input_bytes: float, partitions: int,
                 microbatches: int, schedule: str, bandwidth: float, checkpointing: bool) -> None:
        self.n = len(blocks)
        self.p = partitions
        self.m = microbatches
        self.schedule = schedule
        self.bandwidth = bandwidth
        self.checkpointing = checkpointing
        self.blocks = blocks
        # inputs[k]: bytes entering block k (the sample's microbatch for block 0).
        self.inputs = [input_bytes] + [b["output_bytes"] for b in blocks[:-1]]

        def prefix(values: Sequence[float]) -> List[float]:
            acc = [0.0]
            for v in values:
                acc.append(acc[-1] + v)
            return acc

        self.compute = prefix([b["forward_s"] + b["backward_s"] for b in blocks])
        self.state = prefix([b["param_bytes"] + b["grad_bytes"] for b in blocks])
        self.acts = prefix([b["activation_bytes"] for b in blocks])
        self.kept_inputs = prefix(self.inputs)

    def send_bytes(self, j: int) -> float:
        """Bytes a stage ending before block ``j`` sends forward (none from the last)."""
        return self.blocks[j - 1]["output_bytes"] if j < self.n else 0.0

    def time(self, s: int, i: int, j: int) -> float:
        sent = self.send_bytes(j) + (self.inputs[i] if i > 0 else 0.0)  # + input grads back
        return self.compute[j] - self.compute[i] + sent / self.bandwidth

    def memory(self, s: int, i: int, j: int) -> float:
        flight = in_flight(self.schedule, self.m, self.p, s)
        if self.checkpointing:
            kept = (self.kept_inputs[j] - self.kept_inputs[i]) * flight
            kept += max(self.blocks[k]["activation_bytes"] for k in range(i, j))
        else:
            kept = (self.acts[j] - self.acts[i]) * flight
        return self.state[j] - self.state[i] + kept

    def figures(self, cuts: Sequence[int]) -> List[Tuple[int, int, float, float]]:
        bounds = [0, *cuts, self.n]
        return [(bounds[s], bounds[s + 1], self.time(s, bounds[s], bounds[s + 1]),
                 self.memory(s, bounds[s], bounds[s + 1])) for s in range(self.p)]


def best_cuts(model: _Model, optimize: str) -> List[int]:
    """The contiguous split minimizing the bottleneck of ``optimize`` (exact DP)."""
    n, p = model.n, model.p
    if optimize == "speed":
        def cost(s: int, i: int, j: int) -> Tuple[float, float]:
            return (model.time(s, i, j), model.memory(s, i, j))
    else:
        def cost(s: int, i: int, j: int) -> Tuple[float, float]:
            return (model.memory(s, i, j), model.time(s, i, j))
    inf = (float("inf"), float("inf"))
    # best[s][j]: the best (bottleneck, tie-break) of stages 0..s covering blocks [0, j);
    # back[s][j]: where stage s starts in it.
    best: List[List[Tuple[float, float]]] = [[inf] * (n + 1) for _ in range(p)]
    back = [[0] * (n + 1) for _ in range(p)]
    for j in range(1, n - p + 2):
        best[0][j] = cost(0, 0, j)
    for s in range(1, p):
        for j in range(s + 1, n - (p - 1 - s) + 1):
            for i in range(s, j):
                prev = best[s - 1][i]
                if prev == inf:
                    continue
                c = cost(s, i, j)
                value = (max(prev[0], c[0]), max(prev[1], c[1]))
                if value < best[s][j]:
                    best[s][j], back[s][j] = value, i
    cuts, j = [], n
    for s in range(p - 1, 0, -1):
        j = back[s][j]
        cuts.append(j)
    return cuts[::-1]


def check_request(blocks: int, partitions: Any, optimize: Any, microbatches: Any,
                  schedule: Any) -> None:
    """Raise PartitionError naming the ``model_parallel`` field that cannot be planned."""
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise PartitionError(f"model_parallel.partitions must be an int >= 1, got {partitions!r}")
    if partitions > blocks:
        raise PartitionError(f"model_parallel.partitions = {partitions} but the model has only "
                             f"{blocks} block{'s' if blocks != 1 else ''}: every stage needs at "
                             f"least one block (use at most {blocks} partitions)")
    if optimize not in OPTIMIZE:
        raise PartitionError(f"model_parallel.optimize must be 'speed' or 'memory', got {optimize!r}")
    if schedule not in SCHEDULES:
        raise PartitionError(f"model_parallel.pipeline must be 'simple' or 'interleaved', got "
                             f"{schedule!r}")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise PartitionError(f"model_parallel.microbatches must be an int >= 1, got {microbatches!r}")


def partition(profile: Mapping[str, Any], partitions: int, optimize: str, microbatches: int,
              schedule: str, *, bandwidth: float = DEFAULT_BANDWIDTH,
              activation_checkpointing: bool = False,
              cuts: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """The plan for ``profile`` cut into ``partitions`` stages (see the module docstring).

    ``cuts`` forces the cut points (e.g. the equal split, for comparison); the figures are
    computed for them all the same.
    """
    blocks = _read_blocks(profile)
    check_request(len(blocks), partitions, optimize, microbatches, schedule)
    if not (isinstance(bandwidth, (int, float)) and bandwidth > 0):
        raise PartitionError(f"bandwidth must be a number of bytes/s > 0, got {bandwidth!r}")
    input_bytes = _number(profile.get("input_bytes", 0), "input_bytes")
    model = _Model(blocks, input_bytes, partitions, microbatches, schedule, float(bandwidth),
                   bool(activation_checkpointing))
    if cuts is None:
        chosen = best_cuts(model, optimize)
    else:
        chosen = [int(c) for c in cuts]
        if len(chosen) != partitions - 1 or chosen != sorted(set(chosen)) or (
                chosen and (chosen[0] < 1 or chosen[-1] >= len(blocks))):
            raise PartitionError(f"cuts {list(cuts)} are not {partitions - 1} increasing block "
                                 f"indices in 1..{len(blocks) - 1}")
    stages = [{"stage": s, "blocks": [i, j], "time_s": t, "memory_bytes": int(round(mem)),
               "send_bytes": int(model.send_bytes(j))}
              for s, (i, j, t, mem) in enumerate(model.figures(chosen))]
    equal = equal_cuts(len(blocks), partitions)
    equal_figures = model.figures(equal)
    return {
        "version": PLAN_VERSION,
        "optimize": optimize,
        "schedule": schedule,
        "microbatches": microbatches,
        "partitions": partitions,
        "blocks": len(blocks),
        "cuts": chosen,
        "source": "profiled",
        "stages": stages,
        "bubble": bubble(partitions, microbatches),
        "equal_split": {"cuts": equal,
                        "max_time_s": max(f[2] for f in equal_figures),
                        "max_memory_bytes": int(round(max(f[3] for f in equal_figures)))},
    }


def check_plan(plan: Any, partitions: int, blocks: int, where: str = "plan") -> Dict[str, Any]:
    """Raise PartitionError unless ``plan`` is a plan for ``partitions`` stages over ``blocks``."""
    if not isinstance(plan, dict):
        raise PartitionError(f"{where}: expected a JSON object (a plan), got {type(plan).__name__}")
    stages = plan.get("stages")
    if not isinstance(stages, list) or len(stages) != partitions:
        count = len(stages) if isinstance(stages, list) else "no"
        raise PartitionError(f"{where}: has {count} stages, model_parallel.partitions is "
                             f"{partitions}")
    if plan.get("blocks") != blocks:
        raise PartitionError(f"{where}: 'blocks' is {plan.get('blocks')!r} but the model has "
                             f"{blocks} blocks")
    cuts = plan.get("cuts")
    if (not isinstance(cuts, list) or len(cuts) != partitions - 1
            or not all(isinstance(c, int) and not isinstance(c, bool) for c in cuts)
            or cuts != sorted(set(cuts)) or (cuts and (cuts[0] < 1 or cuts[-1] >= blocks))):
        raise PartitionError(f"{where}: 'cuts' must be {partitions - 1} increasing block indices "
                             f"in 1..{blocks - 1}, got {cuts!r}")
    return plan
