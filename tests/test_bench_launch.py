"""bench/launch.py's reading of its rounds (``training_spread``): each round's own ratio, their
median, and a resampled 95% interval of the ratio of medians that holds the measured ratio and
narrows as the rounds agree."""

from __future__ import annotations

import statistics

from bench.launch import training_spread


def test_the_interval_holds_the_ratio_of_medians_and_the_round_ratios_are_each_rounds() -> None:
    hand = [15.8, 18.2, 17.9, 18.5, 17.2, 17.3, 18.4, 18.2, 16.0, 19.1]
    ours = [17.6, 18.1, 18.9, 17.3, 17.7, 18.1, 16.6, 18.8, 17.6, 17.8]
    got = training_spread(hand, ours)
    assert got["round_ratios"] == [o / h for h, o in zip(hand, ours, strict=True)]
    assert got["median_round_ratio"] == statistics.median(o / h for h, o in zip(hand, ours, strict=True))
    assert got["round_ratios_min"] == min(got["round_ratios"]) and got["round_ratios_max"] == max(got["round_ratios"])
    low, high = got["interval_95"]
    ratio = statistics.median(ours) / statistics.median(hand)
    assert low <= ratio <= high and low < high
    assert training_spread(hand, ours) == got  # seeded: the same rounds read the same


def test_rounds_that_agree_give_a_narrow_interval_and_noisy_ones_a_wide_one() -> None:
    hand = [16.0 + 0.01 * i for i in range(10)]
    steady = training_spread(hand, [h * 1.01 for h in hand])
    assert all(abs(x - 1.01) < 1e-9 for x in steady["interval_95"])  # every round 1.01: nothing else to draw
    noisy = training_spread(hand, [h * (1.01 + (0.08 if i % 2 else -0.08)) for i, h in enumerate(hand)])
    assert noisy["interval_95"][1] - noisy["interval_95"][0] > 0.05
