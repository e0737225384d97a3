"""The metrics rule (tui.model.metrics): newest attempt, then lowest rank, for every reader."""

from __future__ import annotations

from tui.model.metrics import merge_objective_values, metric_value, objective_values


def test_a_later_read_merges_by_the_same_rule_and_a_restart_drops_the_earlier_attempt() -> None:
    first = objective_values([{"step": 1, "rank": 1, "val_loss": 3.0}, {"step": 2, "rank": 0, "val_loss": 2.0}],
                             "val_loss")
    assert first == {1: (0, 1, 3.0), 2: (0, 0, 2.0)}
    # rank 0's value of step 1 comes in the next read: it stands over rank 1's
    second = merge_objective_values(first, objective_values([{"step": 1, "rank": 0, "val_loss": 1.0}], "val_loss"))
    assert second == {1: (0, 0, 1.0), 2: (0, 0, 2.0)}
    # the same step from the same rank and attempt, read again: the later read stands
    again = merge_objective_values(second, {1: (0, 0, 0.5)})
    assert again[1] == (0, 0, 0.5)
    # a restarted gang's first value: the earlier attempt's steps go
    restarted = merge_objective_values(again, objective_values([{"step": 1, "rank": 0, "restart": 1,
                                                                 "val_loss": 4.0}], "val_loss"))
    assert restarted == {1: (1, 0, 4.0)}


def test_a_metric_value_is_a_number_or_text_that_holds_one() -> None:
    assert metric_value(2) == 2.0 and metric_value("0.5") == 0.5
    assert metric_value(True) is None and metric_value("n/a") is None and metric_value(None) is None
