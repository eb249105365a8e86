"""``mirrorkit run --speed-up-fit``: an unmodified script runs several steps per call, same result.

Each case runs ``tests/fixtures/speed_fit_script.py`` (plain Keras, no
mirrorkit) through the real CLI on 2 simulated replicas, with and without the
flag: the trained weights must agree (several steps per call change when
Python runs, not the arithmetic), and a script whose callback acts per batch
keeps one step per call.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, clean_env, result_line

SCRIPT = REPO / "tests" / "fixtures" / "speed_fit_script.py"
RUN = [sys.executable, "-m", "mirrorkit", "run", "--simulate-cpus", "2"]


def _run(*flags: str, args: tuple[str, ...] = ()) -> tuple[dict, str]:
    proc = subprocess.run([*RUN, *flags, str(SCRIPT), *args], env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return result_line(proc.stdout), proc.stderr


@pytest.mark.parametrize("data", [(), ("--dataset",)], ids=["arrays", "dataset"])
def test_fit_runs_several_steps_per_call_to_the_same_weights(data):
    plain, _ = _run(args=data)
    fast, err = _run("--speed-up-fit", args=data)
    assert plain["steps_per_execution"] == 1
    assert fast["steps_per_execution"] == 10  # 320 / 32 = 10 steps per epoch
    assert "--speed-up-fit: 10 training steps per tf.function call (10 steps per epoch)" in err
    np.testing.assert_allclose(fast["weights"], plain["weights"], rtol=1e-5, atol=1e-5)
    assert fast["loss"] == pytest.approx(plain["loss"], rel=1e-5)


@pytest.mark.parametrize("data", [(), ("--dataset",)], ids=["arrays", "dataset"])
def test_an_epoch_that_no_call_size_divides_ends_with_a_shorter_call(data):
    # 730 examples at batch 32: 23 steps (the last one 26 examples), a prime
    # count. 16 steps per call: the epoch's second call stops after 7 steps,
    # when the data runs out, so every epoch trains on exactly its 23 batches.
    args = (*data, "--examples", "730")
    plain, _ = _run(args=args)
    fast, err = _run("--speed-up-fit", args=args)
    assert fast["steps_per_execution"] == 16
    assert "16 training steps per tf.function call (23 steps per epoch)" in err
    np.testing.assert_allclose(fast["weights"], plain["weights"], rtol=1e-5, atol=1e-5)
    assert fast["loss"] == pytest.approx(plain["loss"], rel=1e-5)


def test_a_callback_that_acts_per_batch_keeps_one_step_per_call():
    fast, err = _run("--speed-up-fit", args=("--batch-callback",))
    assert fast["steps_per_execution"] == 1 and fast["batch_calls"] == 20  # every step
    assert ("--speed-up-fit keeps 1 step per tf.function call: "
            "CountBatches.on_train_batch_end acts per batch") in err
