"""Targets: parsed strictly, checked against a run's metrics, misses reported one line each."""

from __future__ import annotations

import pytest

from mirrorkit.training.targets import MISSED_PREFIX, evaluate, missed_lines, parse_target


@pytest.mark.parametrize("text, expected", [
    ("val_accuracy>=0.95", ("val_accuracy", ">=", 0.95)),
    (" images_per_second > 2e3 ", ("images_per_second", ">", 2000.0)),
    ("wall_time_seconds<=600", ("wall_time_seconds", "<=", 600.0)),
    ("val_loss<0.2", ("val_loss", "<", 0.2)),
])
def test_each_operator_parses(text, expected):
    target = parse_target(text)
    assert (target.metric, target.op, target.threshold) == expected


@pytest.mark.parametrize("text, message", [
    ("val_accuracy==0.9", "A target must read METRIC>=NUMBER"),
    ("val_accuracy>=", "A target must read METRIC>=NUMBER"),
    ("accuracy>=0.9", "Unknown metric 'accuracy'"),
    ("val_loss<inf", "must be a finite number"),
    ("val_loss<abc", "must be a finite number"),
])
def test_bad_targets_are_refused_naming_the_input(text, message):
    with pytest.raises(ValueError, match=message):
        parse_target(text)


def test_evaluate_compares_strictly_and_a_missing_value_is_a_miss():
    targets = [parse_target(t) for t in ("val_accuracy>0.9", "val_accuracy>=0.9",
                                         "images_per_second>=1")]
    results = evaluate(targets, {"val_accuracy": 0.9, "images_per_second": None})
    assert [r["met"] for r in results] == [False, True, False]
    assert missed_lines(results) == [f"{MISSED_PREFIX}val_accuracy>0.9 (measured 0.9)",
                                     f"{MISSED_PREFIX}images_per_second>=1 (measured nothing)"]
