"""``malloc-thresholds``: after TensorFlow's first distributed iterator, big tensors are not re-mapped every step.

TensorFlow 2.21 freezes glibc's mmap threshold at 128 KiB the first time a
``GeneratorDataset`` kernel runs (every distributed iterator), so each
tensor over 128 KiB is mmapped and faulted in afresh on every step: CPU
training ran 2x slower (``benchmarks/floor.py``). Page faults are the
observable: a step that reuses memory faults little. Asserted upstream too:
with the fix off the churn is there, so the day TensorFlow stops it this
test says the fix can go (its probe then answers ``not-needed``).
"""

from __future__ import annotations

import pytest
from conftest import run_snippet

from mirrorkit.compat import allocator

SNIPPET = """
import json, resource
import mirrorkit
strategy = mirrorkit.get_strategy("mirrored", simulate_cpus=2)
import keras, numpy as np, tensorflow as tf
from mirrorkit.compat import allocator

x = np.random.default_rng(0).uniform(size=(256, 32, 32, 8)).astype("float32")
y = np.arange(256) % 4
with strategy.scope():
    model = keras.Sequential([keras.Input((32, 32, 8)), keras.layers.Conv2D(32, 3, padding="same"),
                              keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, y, batch_size=64, epochs=1, verbose=0)          # warm-up: traces the step
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
model.fit(x, y, batch_size=64, epochs=6, verbose=0)          # 24 steps, activations of 1 MiB
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
libc = allocator._libc()
print("RESULT " + json.dumps({"state": allocator.state(), "fit_faults": faults,
                              "probe_faults": allocator.churn_faults(libc)}))
"""


@pytest.mark.skipif(allocator._libc() is None, reason="glibc only")
def test_steps_stop_faulting_their_tensors_in_again(tmp_path):
    fixed, proc = run_snippet(SNIPPET, tmp_path)
    # Making TensorFlow apply its own setting first prints nothing (the CLI's
    # one-line errors depend on a quiet stderr).
    assert "WARNING:tensorflow" not in proc.stderr, proc.stderr[-2000:]
    upstream, _ = run_snippet(SNIPPET, tmp_path,
                              env={"MIRRORKIT_COMPAT_DISABLE": allocator.NAME})
    pages = (1 << 20) // __import__("resource").getpagesize()
    assert upstream["state"] == "not-applied"
    # Upstream: the 1 MiB probe buffer is faulted in again each of 50 rounds.
    assert upstream["probe_faults"] >= 10 * pages, upstream
    assert fixed["state"] == "applied", fixed
    assert fixed["probe_faults"] < 2 * pages, fixed
    # The training steps themselves: far fewer faults with the fix, where
    # upstream's steps churn at all. On some CPUs (oneDNN's kernel choice)
    # TensorFlow keeps the step's big buffers and upstream faults less than
    # one 1 MiB tensor a step: then nothing is left to remove, and the fix must
    # not add churn of its own, i.e. not one more 1 MiB tensor faulted in per
    # step (measured there: 1157 vs 1664, and 2733 vs 2688 on a loaded
    # machine; elsewhere 3x fewer).
    # Between the two (upstream at one to three tensors a step) the counts
    # vary from run to run on one machine (upstream 1664-2810, fixed
    # 1108-2733 under the parallel suite), so the ratio is asserted only
    # where the churn is unmistakable; the probe above is the exact evidence.
    # 24 steps: the faults that do not come from the steps (threads, first
    # allocations) weigh on the per-step comparison three times less than over 8
    # (a loaded CI run once saw the fixed side 2,168 faults above upstream over 8).
    steps = 24
    if upstream["fit_faults"] >= 3 * steps * pages:
        assert fixed["fit_faults"] * 3 < upstream["fit_faults"], (fixed, upstream)
    else:
        assert fixed["fit_faults"] < upstream["fit_faults"] + steps * pages, (fixed, upstream)


@pytest.mark.fast
def test_disabled_names_are_accepted_and_checked():
    from mirrorkit import compat
    from mirrorkit._env import patch

    with patch({"MIRRORKIT_COMPAT_DISABLE": "malloc-thresholds"}):
        assert "malloc-thresholds" in compat.registry.disabled_by_environment()
    with patch({"MIRRORKIT_COMPAT_DISABLE": "malloc-threshold"}), \
            pytest.raises(ValueError, match="malloc-thresholds"):
        compat.registry.disabled_by_environment()


# What a program under `mirrorkit launch` sees: the fixes come with `import keras`
# (sitecustomize's import hook), before the program creates its own strategy.
DEFERRED = """
import json, os
from mirrorkit.compat import allocator
from mirrorkit.launcher import autofix
autofix.install()
import keras, numpy as np, tensorflow as tf
waiting = allocator.state()
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
after_strategy = allocator.state()
x = np.random.default_rng(0).uniform(size=(64, 8)).astype("float32")
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
model.fit(x, np.arange(64) % 2, batch_size=16, epochs=1, verbose=0)
libc = allocator._libc()
print("RESULT " + json.dumps({"waiting": waiting, "after_strategy": after_strategy,
                              "state": allocator.state(), "probe_faults": allocator.churn_faults(libc),
                              "unwrapped": not getattr(allocator, "_deferred", {})}))
"""


@pytest.mark.skipif(allocator._libc() is None, reason="glibc only")
def test_a_program_that_makes_its_own_strategy_is_fixed_at_its_first_distributed_dataset(
        tmp_path):
    got, _ = run_snippet(DEFERRED, tmp_path)
    pages = (1 << 20) // __import__("resource").getpagesize()
    # Nothing decided at `import keras` (no runtime yet) nor by the strategy alone.
    assert got["waiting"] == got["after_strategy"] == "not-applied", got
    assert got["state"] == "applied", got
    assert got["probe_faults"] < 2 * pages, got
    assert got["unwrapped"], got
