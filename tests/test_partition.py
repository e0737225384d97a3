"""The partitioner (runtime/partition.py): its cuts against a brute-force search over every
contiguous split, on models whose blocks have known, unequal costs; its plan's shape; its errors."""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import pytest

from runtime.partition import PartitionError, check_plan, equal_cuts, partition

BW = 1e9


def block(fwd: float, bwd: float, params: int, acts: int, out: int) -> dict[str, Any]:
    return {"forward_s": fwd, "backward_s": bwd, "param_bytes": params, "grad_bytes": params,
            "activation_bytes": acts, "output_bytes": out}


def profile(blocks: list[dict[str, Any]], input_bytes: int = 1000) -> dict[str, Any]:
    return {"input_bytes": input_bytes, "blocks": blocks}


# The costs the module documents, written out again here (independently of its prefix sums).
def stage_time(prof: dict[str, Any], i: int, j: int) -> float:
    blocks = prof["blocks"]
    compute = sum(b["forward_s"] + b["backward_s"] for b in blocks[i:j])
    sent = blocks[j - 1]["output_bytes"] if j < len(blocks) else 0
    got_grad_back = blocks[i - 1]["output_bytes"] if i > 0 else 0
    return compute + (sent + got_grad_back) / BW


def stage_memory(prof: dict[str, Any], s: int, i: int, j: int, p: int, m: int, schedule: str) -> float:
    flight = m if schedule == "simple" else min(m, p - s)
    blocks = prof["blocks"][i:j]
    return sum(b["param_bytes"] + b["grad_bytes"] + b["activation_bytes"] * flight for b in blocks)


def brute_force(prof: dict[str, Any], p: int, m: int, schedule: str, optimize: str) -> tuple[float, list[int]]:
    n = len(prof["blocks"])
    best: tuple[float, list[int]] = (float("inf"), [])
    for cuts in itertools.combinations(range(1, n), p - 1):
        bounds = [0, *cuts, n]
        if optimize == "speed":
            worst = max(stage_time(prof, bounds[s], bounds[s + 1]) for s in range(p))
        else:
            worst = max(stage_memory(prof, s, bounds[s], bounds[s + 1], p, m, schedule) for s in range(p))
        if worst < best[0]:
            best = (worst, list(cuts))
    return best


def worst_of(plan: dict[str, Any], optimize: str) -> float:
    return max(s["time_s"] if optimize == "speed" else s["memory_bytes"] for s in plan["stages"])


def random_profile(rng: random.Random, n: int) -> dict[str, Any]:
    return profile([block(rng.uniform(0.001, 0.05), rng.uniform(0.001, 0.1),
                          rng.randrange(1, 10) * 10**rng.randrange(3, 7),
                          rng.randrange(1, 10) * 10**rng.randrange(3, 6),
                          rng.randrange(1, 10) * 10**rng.randrange(3, 7)) for _ in range(n)],
                   input_bytes=rng.randrange(1000, 100000))


# One heavy block in the middle (a much wider layer): 10x the time, 20x the parameters.
HEAVY = profile([block(0.01, 0.02, 10**5, 10**4, 10**4)] * 3
                + [block(0.1, 0.2, 2 * 10**6, 2 * 10**5, 10**4)]
                + [block(0.01, 0.02, 10**5, 10**4, 10**4)] * 4)
# Costs growing along the model (like widening layers).
RAMP = profile([block(0.005 * k, 0.01 * k, 10**5 * k, 10**4 * k * k, 10**4) for k in range(1, 10)])
# Heavy at both ends, light in the middle.
ENDS = profile([block(0.2, 0.3, 10**6, 10**5, 10**4)] + [block(0.01, 0.01, 10**4, 10**3, 10**4)] * 6
               + [block(0.15, 0.3, 3 * 10**6, 10**5, 10**4)])
HAND = {"heavy": HEAVY, "ramp": RAMP, "ends": ENDS}


@pytest.mark.parametrize("name", sorted(HAND))
@pytest.mark.parametrize("schedule", ["simple", "interleaved"])
@pytest.mark.parametrize("optimize", ["speed", "memory"])
def test_hand_made_profiles_match_brute_force_and_beat_equal_layers(name: str, schedule: str,
                                                                     optimize: str) -> None:
    prof, p, m = HAND[name], 3, 4
    plan = partition(prof, p, optimize, m, schedule, bandwidth=BW)
    best, best_cuts = brute_force(prof, p, m, schedule, optimize)
    assert worst_of(plan, optimize) == pytest.approx(best, rel=1e-9), (plan["cuts"], best_cuts)
    # The equal-layer-count split, figured by the test itself: strictly worse on these models.
    n = len(prof["blocks"])
    equal = equal_cuts(n, p)
    bounds = [0, *equal, n]
    if optimize == "speed":
        equal_worst = max(stage_time(prof, bounds[s], bounds[s + 1]) for s in range(p))
        assert plan["equal_split"]["max_time_s"] == pytest.approx(equal_worst, rel=1e-9)
    else:
        equal_worst = max(stage_memory(prof, s, bounds[s], bounds[s + 1], p, m, schedule)
                          for s in range(p))
        assert plan["equal_split"]["max_memory_bytes"] == pytest.approx(equal_worst, abs=1)
    assert worst_of(plan, optimize) < equal_worst, (name, plan["cuts"], equal)


@pytest.mark.parametrize("seed", range(12))
def test_random_profiles_match_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randrange(2, 11)
    p = rng.randrange(1, min(n, 5) + 1)
    m = rng.randrange(1, 9)
    prof = random_profile(rng, n)
    for schedule in ("simple", "interleaved"):
        for optimize in ("speed", "memory"):
            plan = partition(prof, p, optimize, m, schedule, bandwidth=BW)
            best, cuts = brute_force(prof, p, m, schedule, optimize)
            got = worst_of(plan, optimize)
            # exact for time; memory figures are rounded to whole bytes in the plan
            assert got == pytest.approx(best, rel=1e-9, abs=1), (seed, schedule, optimize, plan["cuts"], cuts)
            assert len(plan["cuts"]) == p - 1 and plan["cuts"] == sorted(set(plan["cuts"]))


def test_memory_counts_in_flight_microbatches_by_schedule() -> None:
    # Uniform blocks: 1F1B keeps fewer microbatches on later stages, so the memory plan gives
    # them more blocks; GPipe keeps all m on every stage, so it splits evenly.
    prof = profile([block(0.01, 0.01, 1000, 10**5, 100)] * 12)
    gpipe = partition(prof, 3, "memory", 8, "simple")
    onefb = partition(prof, 3, "memory", 8, "interleaved")
    assert gpipe["cuts"] == [4, 8]
    sizes = [s["blocks"][1] - s["blocks"][0] for s in onefb["stages"]]
    assert sizes[0] < sizes[1] < sizes[2], sizes
    assert worst_of(onefb, "memory") < worst_of(gpipe, "memory")


def test_checkpointing_keeps_only_block_inputs() -> None:
    prof = profile([block(0.01, 0.01, 1000, 10**6, 10**3)] * 6, input_bytes=10**3)
    plain = partition(prof, 2, "memory", 4, "simple")
    ckpt = partition(prof, 2, "memory", 4, "simple", activation_checkpointing=True)
    # 3 blocks, 4 microbatches: 2000 params+grads each, then 3 x 4 x 1e6 kept vs 3 x 4 x 1e3
    # kept inputs plus one block recomputed (1e6).
    assert plain["stages"][0]["memory_bytes"] == 6000 + 12 * 10**6
    assert ckpt["stages"][0]["memory_bytes"] == 6000 + 12 * 10**3 + 10**6


def test_plan_has_the_contract_shape() -> None:
    plan = partition(HEAVY, 3, "speed", 4, "interleaved", bandwidth=BW)
    assert set(plan) == {"version", "optimize", "schedule", "microbatches", "partitions", "blocks",
                         "cuts", "source", "stages", "bubble", "equal_split"}
    assert plan["version"] == 1 and plan["source"] == "profiled" and plan["blocks"] == 8
    assert (plan["optimize"], plan["schedule"], plan["microbatches"], plan["partitions"]) == (
        "speed", "interleaved", 4, 3)
    assert plan["bubble"] == pytest.approx(2 / 6)
    bounds = [0, *plan["cuts"], 8]
    for s, stage in enumerate(plan["stages"]):
        assert set(stage) == {"stage", "blocks", "time_s", "memory_bytes", "send_bytes"}
        assert stage["stage"] == s and stage["blocks"] == [bounds[s], bounds[s + 1]]
        assert isinstance(stage["memory_bytes"], int) and isinstance(stage["send_bytes"], int)
    assert plan["stages"][-1]["send_bytes"] == 0 and plan["stages"][0]["send_bytes"] == 10**4
    assert plan["equal_split"]["cuts"] == [3, 6]
    assert check_plan(json.loads(json.dumps(plan)), 3, 8) == plan  # survives JSON


def test_equal_cuts() -> None:
    assert equal_cuts(8, 3) == [3, 6]
    assert equal_cuts(6, 3) == [2, 4]
    assert equal_cuts(3, 3) == [1, 2]
    assert equal_cuts(5, 1) == []


def test_forced_cuts_get_figures_too() -> None:
    plan = partition(HEAVY, 3, "speed", 4, "simple", bandwidth=BW, cuts=[3, 6])
    assert plan["cuts"] == [3, 6]
    assert max(s["time_s"] for s in plan["stages"]) == plan["equal_split"]["max_time_s"]
    with pytest.raises(PartitionError, match="increasing block indices"):
        partition(HEAVY, 3, "speed", 4, "simple", cuts=[6, 3])


def test_bad_requests_are_named() -> None:
    prof = profile([block(0.1, 0.1, 1, 1, 1)] * 3)
    with pytest.raises(PartitionError, match=r"model_parallel.partitions = 4 but the model has only 3 blocks"):
        partition(prof, 4, "speed", 4, "simple")
    with pytest.raises(PartitionError, match=r"model_parallel.partitions must be an int >= 1, got 0"):
        partition(prof, 0, "speed", 4, "simple")
    with pytest.raises(PartitionError, match=r"'blocks' must be a non-empty list"):
        partition({"blocks": []}, 2, "speed", 4, "simple")
    with pytest.raises(PartitionError, match=r"'blocks' must be a non-empty list"):
        partition({}, 2, "speed", 4, "simple")
    with pytest.raises(PartitionError, match=r"model_parallel.optimize must be 'speed' or 'memory'"):
        partition(prof, 2, "fast", 4, "simple")
    with pytest.raises(PartitionError, match=r"model_parallel.pipeline"):
        partition(prof, 2, "speed", 4, "zigzag")
    with pytest.raises(PartitionError, match=r"blocks\[1\] lacks output_bytes"):
        partition({"blocks": [block(1, 1, 1, 1, 1), {"forward_s": 1, "backward_s": 1, "param_bytes": 1,
                                                      "grad_bytes": 1, "activation_bytes": 1}]},
                  2, "speed", 4, "simple")
    with pytest.raises(PartitionError, match=r"blocks\[0\].forward_s must be a number >= 0"):
        partition({"blocks": [block(-1, 1, 1, 1, 1)]}, 1, "speed", 4, "simple")


def test_check_plan_names_what_does_not_fit() -> None:
    plan = partition(HEAVY, 3, "speed", 4, "simple")
    with pytest.raises(PartitionError, match=r"has 3 stages, model_parallel.partitions is 2"):
        check_plan(plan, 2, 8)
    with pytest.raises(PartitionError, match=r"'blocks' is 8 but the model has 9 blocks"):
        check_plan(plan, 3, 9)
    with pytest.raises(PartitionError, match=r"'cuts' must be 2 increasing"):
        check_plan({**plan, "cuts": [5, 2]}, 3, 8)
