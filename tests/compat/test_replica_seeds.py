"""Seedless ``keras.random`` and TensorFlow's own random ops in a step give plain Python's numbers.

``tests/fixtures/scripts/step_draws.py`` is a GAN-style ``train_step``
that draws its fake rows with ``keras.random.normal(shape)`` (no seed: Keras's
global SeedGenerator) and its mixing weights with ``tf.random.normal`` (as
keras.io's WGAN-GP does), two critic steps per batch, with a last batch of 4.
Unmodified, under ``mirrorkit run`` on 2 replicas and ``mirrorkit launch`` on
2 workers, it trains exactly as in plain Python: ``replica-global-seed`` lets
the replica threads share the one global generator, ``replica-random`` gives
each replica its rows of one device's draws, TensorFlow's ops included.

Controls: with ``replica-global-seed`` off the step fails as upstream does
(each replica thread makes its own generator: a variable on the second
trace); with ``replica-random`` off it trains on other numbers.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, clean_env, compare_jobs, run_jobs

from mirrorkit.patching import targets

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "fixtures" / "scripts" / "step_draws.py"


def _close(a: dict, b: dict, rel: float) -> bool:
    pairs = list(zip(a["loss"] + a["weights"], b["loss"] + b["weights"]))
    return len(pairs) == 6 and all(abs(x - y) <= rel * max(1.0, abs(y)) for x, y in pairs)


# Keras 3.16 fetches a step's batch outside its function and retraces for the last batch's
# shape, where a seedless tf.random op starts its stream again; mirrorkit's one-step path
# fetches inside one trace (for empty replicas, compat/multistep.py) and continues it, as
# Keras 3.15 does: the last batch's draws differ (loss -0.371 vs -0.397). Strict: the day it
# matches, this says so.
@pytest.mark.xfail(targets.applies("keras>=3.16.0.dev0"), strict=True,
                   reason="Keras 3.16 restarts a seedless tf.random stream on the last batch's "
                          "retrace; mirrorkit's one-step path continues it as Keras 3.15")
def test_seedless_and_tensorflow_draws_in_a_step_match_plain_python(tmp_path):
    found = run_jobs(compare_jobs(SCRIPT, random_off={"MIRRORKIT_COMPAT_DISABLE":
                                                      "replica-random"}), tmp_path)
    plain = found["plain"][0]
    assert _close(found["run"][0], plain, 1e-6), (found["run"], plain)
    assert len(found["launch"]) == 2
    assert all(_close(worker, plain, 1e-6) for worker in found["launch"]), found["launch"]
    # Each replica drawing for its own rows alone trains on other numbers.
    assert not _close(found["random_off"][0], plain, 1e-3), found["random_off"]


def test_without_the_fix_a_seedless_draw_in_a_step_fails_as_upstream(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mirrorkit", "run", "--simulate-cpus", "2",
                           str(SCRIPT)], cwd=str(tmp_path),
                          env=clean_env(MIRRORKIT_COMPAT_DISABLE="replica-global-seed"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "only supports singleton tf.Variables created on the first call" in proc.stderr
