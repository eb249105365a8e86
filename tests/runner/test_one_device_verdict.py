"""The one-device check's verdict and flag, in process (no TensorFlow).

The comparison is pure arithmetic on the two steps' numbers
(:mod:`mirrorkit.runner.one_device_verdict`); the flag reaches the library
through the CLI option or ``MIRRORKIT_COMPARE_ONE_DEVICE``.
"""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from mirrorkit import _env
from mirrorkit.cli import cli
from mirrorkit.runner import RunConfig
from mirrorkit.runner.one_device_verdict import Context, Step, compare

OLD = [np.ones((2, 2)), np.zeros(2)]
NAMES = ["dense/kernel", "dense/bias"]
ONE = Step(logs={"loss": 13.40, "mae": 2.0},
           updates=[np.full((2, 2), 0.3), np.array([0.1, -0.2])])


def _scaled(loss: float, update: float, mae: float = 2.0) -> Step:
    return Step(logs={"loss": 13.40 * loss, "mae": mae},
                updates=[u * update for u in ONE.updates])


@pytest.mark.fast
def test_float_noise_is_the_same():
    noisy = Step(logs={"loss": 13.40 * (1 + 3e-7), "mae": 2.0},
                 updates=[u + 1e-8 for u in ONE.updates])
    verdict = compare(noisy, ONE, old=OLD, names=NAMES, replicas=2)
    assert verdict.kind == "same"
    assert verdict.line.startswith("mirrorkit: one-device check: same (largest relative "
                                   "difference ")
    assert verdict.line.endswith("over loss, 1 metric and 2 variables)")


@pytest.mark.fast
def test_a_loss_scaled_by_the_replica_count_names_the_loss_and_the_ratio():
    verdict = compare(_scaled(2.0, 2.0), ONE, old=OLD, names=NAMES, replicas=2)
    assert verdict.kind == "different"
    assert verdict.line.startswith(
        "mirrorkit: one-device check: DIFFERENT: loss 26.8 vs 13.4 one device (x2.00); "
        "variable dense/kernel update x2.00 (and 1 more variable) -- likely cause: the loss "
        "is scaled wrongly for the replicas (x2 = the replica count)")


@pytest.mark.fast
def test_a_logged_loss_divided_by_the_replicas_is_told_apart_from_training():
    verdict = compare(_scaled(1 / 3, 1.0), ONE, old=OLD, names=NAMES, replicas=3)
    assert verdict.kind == "different"
    assert "loss 4.467 vs 13.4 one device (x0.33)" in verdict.line
    assert "variable" not in verdict.line.split(" -- ")[0]
    assert "the logged loss is divided by the replicas (x1/3)" in verdict.line


@pytest.mark.fast
def test_batch_norm_explains_a_small_difference_but_not_a_replica_factor():
    context = Context(batch_norm=("batch_normalization",), global_batch=32)
    small = compare(_scaled(1.01, 1.2), ONE, old=OLD, names=NAMES, replicas=2,
                    context=context)
    assert small.kind == "explained"
    assert small.line.startswith("mirrorkit: one-device check: differs as expected: "
                                 "BatchNormalization (batch_normalization) normalises with "
                                 "per-replica batch statistics (16 examples each instead of 32)")
    doubled = compare(_scaled(2.0, 2.0), ONE, old=OLD, names=NAMES, replicas=2,
                      context=context)
    assert doubled.kind == "different"


@pytest.mark.fast
def test_an_unexplained_difference_lists_the_usual_causes():
    verdict = compare(_scaled(1.0, 1.0, mae=2.5), ONE, old=OLD, names=NAMES, replicas=2)
    assert verdict.kind == "different"
    assert "DIFFERENT: mae 2.5 vs 2 one device (x1.25) -- likely cause: randomness" \
        in verdict.line


@pytest.mark.fast
def test_a_tiny_update_is_compared_beyond_float32_rounding_of_the_weight():
    old = [np.full((2, 2), 1000.0), np.zeros(2)]
    rounding = Step(logs=ONE.logs, updates=[np.full((2, 2), 6e-5), np.array([0.1, -0.2])])
    exact = Step(logs=ONE.logs, updates=[np.zeros((2, 2)), np.array([0.1, -0.2])])
    assert compare(rounding, exact, old=old, names=NAMES, replicas=2).kind == "same"


@pytest.mark.fast
def test_the_flag_and_its_environment_twin():
    assert RunConfig("t.py").compares_one_device() is False
    with _env.patch({"MIRRORKIT_COMPARE_ONE_DEVICE": "1"}):
        assert RunConfig("t.py").compares_one_device() is True
        assert RunConfig("t.py", compare_one_device=False).compares_one_device() is False
    help_text = CliRunner().invoke(cli, ["run", "--help"]).output
    assert "--compare-one-device" in help_text and "MIRRORKIT_COMPARE_ONE_DEVICE" in help_text
