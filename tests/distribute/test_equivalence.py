"""The data-parallel promise: N replicas on a global batch B == one device on B.

Three fresh interpreters (N = 1, 2, 4 replicas; N = 1 is plain Keras with no
strategy) train the same models from the same initial weights on the same
batches in the same order, with SGD. Their weights after one and after four
steps must agree to float32 round-off -- for a model without BatchNormalization
and for one whose BatchNormalization is synchronised. Two controls show the
comparison has teeth: with Keras's loss scaling by the replica count switched
off, and with per-replica (unsynchronised) BatchNormalization, the weights
differ by orders of magnitude more than the tolerance.

The figures (max abs weight difference vs N=1) are printed; run with ``-s``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import clean_env

# float32 round-off after a few steps; the controls below differ by > 1e-2.
TOLERANCE = 1e-5
REPLICAS = (1, 2, 4)

TRAIN = r"""
import json, sys
import numpy as np
import mirrorkit

n, out_path = int(sys.argv[1]), sys.argv[2]
# N=1 is the single-device baseline: no strategy at all.
strategy = mirrorkit.get_strategy("default" if n == 1 else "mirrored", simulate_cpus=n)
import keras
from keras.src.losses import loss as loss_module
assert strategy.num_replicas_in_sync == n

rng = np.random.default_rng(0)
x = rng.normal(size=(64, 10)).astype("float32")
y = rng.integers(0, 3, size=64).astype("int32")
batch = mirrorkit.resolve_batch(global_batch=16)
data = mirrorkit.train_pipeline((x, y), batch=batch, shuffle=False)

def make(bn):
    layers = [keras.Input((10,)), keras.layers.Dense(16)]
    if bn:
        layers.append(keras.layers.BatchNormalization())
    layers += [keras.layers.Activation("tanh"), keras.layers.Dense(3)]
    with mirrorkit.scope(strategy):
        model = keras.Sequential(layers)
        if bn == "sync":
            model = mirrorkit.sync_batch_norm(model)
        # Same initial weights in every process: kernels/biases from a fixed
        # NumPy stream, BN parameters at their constant initial values.
        wrng = np.random.default_rng(1)
        model.set_weights([wrng.normal(0, 0.5, w.shape).astype("float32")
                           if w.path.endswith(("kernel", "bias")) else np.asarray(w.numpy())
                           for w in model.weights])
        model.compile(keras.optimizers.SGD(0.5, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model

def replicas_identical(model):
    for v in model.variables + model.optimizer.variables:
        parts = [np.asarray(p) for p in strategy.experimental_local_results(getattr(v, "value", v))]
        if not all(np.array_equal(parts[0], p) for p in parts[1:]):
            return False
    return True

weights, identical = {}, {}
variants = {"plain": None, "sync_bn": "sync", "unsync_bn": "unsync", "unscaled": None}
for name, bn in variants.items():
    if name == "unscaled":
        # Control: what if the loss were averaged per replica only, not over the
        # global batch? Keras divides each replica's loss by the replica count.
        loss_module.scale_loss_for_distribution = lambda value: value
    model = make(bn)
    model.fit(data.take(1), epochs=1, verbose=0, shuffle=False)
    step1 = [np.asarray(w) for w in model.get_weights()]
    model.fit(data.skip(1), epochs=1, verbose=0, shuffle=False)
    step4 = [np.asarray(w) for w in model.get_weights()]
    for i, (a, b) in enumerate(zip(step1, step4)):
        weights[f"{name}/step1/{i}"] = a
        weights[f"{name}/step4/{i}"] = b
    identical[name] = replicas_identical(model)
    assert int(model.optimizer.iterations.numpy()) == 4
np.savez(out_path, **weights)
print("RESULT " + json.dumps(identical))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Train in 3 processes at once; return {n: (weights, replicas_identical)}."""
    tmp = tmp_path_factory.mktemp("equivalence")
    script = tmp / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    procs = {n: subprocess.Popen([sys.executable, str(script), str(n), str(tmp / f"w{n}.npz")],
                                 env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, cwd=str(tmp))
             for n in REPLICAS}
    results = {}
    for n, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"N={n}:\n{stdout}\n{stderr}"
        line = next(x for x in stdout.splitlines() if x.startswith("RESULT "))
        with np.load(tmp / f"w{n}.npz") as saved:
            results[n] = ({k: saved[k] for k in saved.files}, json.loads(line[len("RESULT "):]))
    return results


def max_diff(runs, n, variant, step, baseline="plain"):
    """Max abs difference of every weight of ``variant`` at N=n vs ``baseline`` at N=1."""
    ours, ref = runs[n][0], runs[1][0]
    prefix = f"{variant}/{step}/"
    keys = [k for k in ours if k.startswith(prefix)]
    assert keys
    return max(float(np.max(np.abs(ours[k] - ref[k.replace(variant, baseline, 1)])))
               for k in keys)


@pytest.mark.parametrize("variant", ["plain", "sync_bn"])
@pytest.mark.parametrize("step", ["step1", "step4"])
def test_n_replicas_match_one_device_on_the_same_global_batch(runs, variant, step):
    figures = {n: max_diff(runs, n, variant, step, baseline=variant) for n in (2, 4)}
    print(f"\nmax |w_N - w_1| {variant} {step}: N=2 {figures[2]:.3g}  N=4 {figures[4]:.3g}")
    for n, diff in figures.items():
        assert diff < TOLERANCE, f"{variant} {step} N={n}: {diff}"


def test_the_comparison_detects_unscaled_loss(runs):
    # Guard: without dividing by the replica count the gradients are N times
    # too large; this must be far outside the tolerance.
    for n in (2, 4):
        diff = max_diff(runs, n, "unscaled", "step1")
        print(f"\ncontrol, loss not scaled by the global batch, N={n}: {diff:.3g}")
        assert diff > 100 * TOLERANCE


def test_unsynchronised_batch_norm_departs_from_one_device(runs):
    # Per-replica statistics over batch/N examples: not the single-device math.
    for n in (2, 4):
        diff = max_diff(runs, n, "unsync_bn", "step4", baseline="unsync_bn")
        print(f"\ncontrol, per-replica BatchNormalization, N={n}: {diff:.3g}")
        assert diff > 100 * TOLERANCE


def test_replicas_stay_identical_after_training(runs):
    for n in (2, 4):
        identical = runs[n][1]
        assert identical["plain"] and identical["sync_bn"], (n, identical)
        # Unsynchronised BN keeps a moving mean/variance per replica: they drift
        # apart, which is why sync_batch_norm exists.
        assert not identical["unsync_bn"], (n, identical)
