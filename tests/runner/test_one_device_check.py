"""``mirrorkit run --compare-one-device``: the distributed step checked against one device.

One fixture script (tests/fixtures/one_device_check/models.py) holds nine
models, each fit once, so each first fit is checked in one process. It runs
three times, concurrently: with the flag; with the flag and the
``scalar-losses`` and ``replica-random`` fixes turned off (their upstream
failures: the loss and the update x2 on 2 replicas; Dropout masks drawn per
replica, which the check must then switch off); and without the flag (the
baseline the final weights must equal).

The ``one-device-check`` patch (the check's own trace dropped, Dropout off
during it without replica-random) has no upstream failure to show: turned off by name
(``MIRRORKIT_COMPAT_DISABLE=one-device-check``) the check does not run at
all (its line says "not checked: the one-device-check patch is turned
off"). What it guards, fit training exactly as without the flag, is
``test_the_flag_leaves_training_unchanged``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import REPO, clean_env

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "fixtures" / "one_device_check" / "models.py"
_RUNS = {
    "flag": ({}, ("--compare-one-device",)),
    "scalar_losses_off": ({"MIRRORKIT_COMPAT_DISABLE": "scalar-losses,replica-random",
                           "MIRRORKIT_COMPARE_ONE_DEVICE": "1",
                           "ONE_DEVICE_CHECK_MODELS": "dense_mse,contrastive,dropout_only"}, ()),
    "plain": ({}, ()),
}


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[dict, dict[str, str]]]:
    """Each run's FINAL json and its check lines by model name."""
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", "mirrorkit", "run", *flags, "--simulate-cpus", "2", str(SCRIPT)],
        env=clean_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=str(REPO)) for name, (env, flags) in _RUNS.items()}
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=900)
        assert proc.returncode == 0, stdout + stderr
        final = json.loads([x for x in stdout.splitlines() if x.startswith("FINAL ")][-1][6:])
        lines = {}
        for line in stderr.splitlines():
            found = re.match(r"mirrorkit: one-device check: .* \[model '(\w+)', 2 replicas\]$",
                             line)
            if found:
                assert found.group(1) not in lines, f"two lines for one model:\n{stderr}"
                lines[found.group(1)] = line
        out[name] = (final, lines)
    return out


def test_a_correct_script_is_the_same_as_one_device(runs):
    line = runs["flag"][1]["dense_mse"]
    assert re.search(r"one-device check: same \(largest relative difference \S+ over loss, "
                     r"1 metric and 4 variables\)", line), line


def test_a_loss_that_reduces_itself_is_caught_when_the_fix_is_off(runs):
    assert "one-device check: same (" in runs["flag"][1]["contrastive"]
    line = runs["scalar_losses_off"][1]["contrastive"]
    assert "one-device check: DIFFERENT: loss " in line, line
    assert re.search(r"loss [\d.]+ vs [\d.]+ one device \(x2\.00\)", line), line
    assert re.search(r"variable \S+ update x2\.00", line), line
    assert "scaled wrongly for the replicas (x2 = the replica count)" in line
    assert "scalar-losses" in line
    # The other models do not depend on that fix.
    assert "same (" in runs["scalar_losses_off"][1]["dense_mse"]


def test_two_outputs_with_loss_weights_and_sample_weights_are_the_same(runs):
    line = runs["flag"][1]["two_outputs"]
    assert "one-device check: same (" in line and "over 3 losses, 2 metrics and 6 variables" \
        in line, line


def test_dropout_and_batch_norm_are_explained_not_an_alarm(runs):
    line = runs["flag"][1]["dropout_bn"]
    assert "one-device check: differs as expected: BatchNormalization" in line, line
    assert "per-replica batch statistics (16 examples each instead of 32)" in line, line
    assert "switched off" not in line and "DIFFERENT" not in line, line


def test_dropout_draws_one_devices_masks_and_is_the_same(runs):
    # Dropout stays on: the copy starts from the model's seed states and
    # replica-random gives each replica its rows of one device's masks.
    line = runs["flag"][1]["dropout_only"]
    assert "one-device check: same (" in line and "over loss, 1 metric and 4 variables)" in line
    assert "switched off" not in line, line


def test_without_replica_random_dropout_is_switched_off_for_the_check(runs):
    # Each replica then draws its own mask: no one-device mask to compare with.
    line = runs["scalar_losses_off"][1]["dropout_only"]
    assert "one-device check: same (" in line, line
    assert re.search(r"; dropout\w* switched off for the check: each replica draws its own "
                     r"dropout mask\)", line), line


def test_an_adapted_normalization_and_noise_are_the_same_as_one_device(runs):
    # The copy recomputes Normalization's mean and variance from the weights it is
    # given (it normalised with 0 and 1 before), and draws the model's noise.
    line = runs["flag"][1]["normalized"]
    assert "one-device check: same (" in line and "switched off" not in line, line


def test_a_layer_whose_init_takes_only_its_own_arguments_is_copied(runs):
    # Keras's from_config would pass it name and trainable (a TypeError): the copy
    # builds it from the config keys its __init__ names.
    line = runs["flag"][1]["own_layer"]
    assert "one-device check: same (" in line, line


def test_a_custom_train_step_is_checked(runs):
    line = runs["flag"][1]["custom_step"]
    assert "not checked" not in line and " update " not in line, line  # updates agree
    # Its logged loss is one device's (logged-step-losses; upstream logs 1/N, x0.50).
    assert "one-device check: same (" in line, line


def test_a_model_without_a_copy_is_not_checked_and_trains(runs):
    line = runs["flag"][1]["uncopyable"]
    assert re.search(r"one-device check: not checked: Wrapped cannot be rebuilt from its "
                     r"config \(NotImplementedError", line), line
    assert "uncopyable" in runs["flag"][0]["weights"]


def test_the_flag_leaves_training_unchanged(runs):
    flagged, plain = runs["flag"][0], runs["plain"][0]
    assert runs["plain"][1] == {}, "no check line without the flag"
    assert flagged["batches"] == plain["batches"]      # the generator lost no batch
    assert flagged["data"] == plain["data"]            # the script's arrays untouched
    assert flagged["weights"].keys() == plain["weights"].keys()
    for name, weights in flagged["weights"].items():
        worst = max(abs(a - b) for a, b in zip(weights, plain["weights"][name]))
        assert worst <= 1e-6, (name, worst)



def test_every_launched_worker_checks_the_clusters_step():
    """Under launch each worker runs the (collective) check and prints its own line."""
    script = REPO / "tests" / "fixtures" / "one_device_check" / "two_losses.py"
    proc = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--", sys.executable, "-m",
         "mirrorkit", "run", "--compare-one-device", str(script)],
        env=clean_env(MIRRORKIT_COMPAT_DISABLE="scalar-losses"), capture_output=True,
        text=True, timeout=600, cwd=str(REPO))
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    for rank in (0, 1):
        lines = [x for x in output.splitlines() if x.startswith(f"[{rank}] mirrorkit: one-device")]
        assert len(lines) == 2, output[-3000:]
        assert "check: same (" in lines[0] and "'mse_model'" in lines[0], lines
        assert re.search(r"check: DIFFERENT: loss [\d.]+ vs [\d.]+ one device \(x2\.00\)",
                         lines[1]) and "'reduced_model'" in lines[1], lines
