"""mirrorkit.scope / build / sync_batch_norm on 2 logical CPUs (one fresh interpreter)."""

from __future__ import annotations

import pytest
from conftest import run_snippet

SCOPE = r"""
import json, sys
import numpy as np
import mirrorkit

out = {"tf_free_import": "tensorflow" not in sys.modules}
with mirrorkit.scope() as strategy:
    import keras
    import tensorflow as tf
    out["replicas"] = strategy.num_replicas_in_sync
    out["has_strategy"] = tf.distribute.has_strategy()
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
out["outside"] = tf.distribute.has_strategy()
out["model_replicas"] = model.distribute_strategy.num_replicas_in_sync
out["mirrored"] = all(type(v.value).__name__ == "MirroredVariable" for v in model.weights)
out["same_strategy"] = mirrorkit.get_strategy() is strategy

def make(units, *, activation=None):
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units, activation=activation)])
    m.compile("sgd", "mse")
    return m
built = mirrorkit.build(make, 3, activation="relu")
out["build_units"] = built.layers[-1].units
out["build_replicas"] = built.distribute_strategy.num_replicas_in_sync
out["build_mirrored"] = type(built.weights[0].value).__name__
try:
    mirrorkit.build("not a function")
except ValueError as err:
    out["build_error"] = str(err)

# sync_batch_norm on a Functional model holding a nested Sequential with BN.
with mirrorkit.scope():
    inner = keras.Sequential([keras.Input((6,)), keras.layers.Dense(6),
                              keras.layers.BatchNormalization()], name="inner")
    inputs = keras.Input((4,))
    h = keras.layers.Dense(6)(inputs)
    h = keras.layers.BatchNormalization(momentum=0.9)(h)
    outputs = keras.layers.Dense(2)(inner(h))
    original = keras.Model(inputs, outputs)
    # Non-default weights, so "keeps the weights" is a real check.
    rng = np.random.default_rng(0)
    original.set_weights([rng.uniform(0.5, 1.5, w.shape).astype("float32")
                          for w in original.get_weights()])

def bn_layers(m):
    found = []
    for layer in m.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            found.append(layer)
        if hasattr(layer, "layers"):
            found.extend(bn_layers(layer))
    return found

synced = mirrorkit.sync_batch_norm(original)
out["synced_flags"] = [l.synchronized for l in bn_layers(synced)]
out["original_flags"] = [l.synchronized for l in bn_layers(original)]
out["momentum_kept"] = bn_layers(synced)[0].momentum
out["weights_kept"] = all(np.array_equal(a, b) for a, b in zip(original.get_weights(), synced.get_weights()))
out["weights_count"] = [len(original.weights), len(synced.weights)]
out["clone_mirrored"] = all(type(v.value).__name__ == "MirroredVariable" for v in synced.weights)
x = rng.normal(size=(8, 4)).astype("float32")
out["same_inference"] = float(np.max(np.abs(original.predict(x, verbose=0) - synced.predict(x, verbose=0))))
out["again_is_same"] = mirrorkit.sync_batch_norm(synced) is synced
out["no_bn_is_same"] = mirrorkit.sync_batch_norm(model) is model

class Sub(keras.Model):
    def __init__(self):
        super().__init__()
        self.bn = keras.layers.BatchNormalization()
    def call(self, x):
        return self.bn(x)
try:
    mirrorkit.sync_batch_norm(Sub())
except ValueError as err:
    out["subclassed_error"] = str(err)
try:
    mirrorkit.sync_batch_norm("model")
except ValueError as err:
    out["type_error"] = str(err)
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    result, proc = run_snippet(SCOPE, tmp_path_factory.mktemp("scope"), env={"MIRRORKIT_SIMULATE_CPUS": "2"})
    return result


def test_scope_builds_mirrored_models_from_the_environment(found):
    assert found["tf_free_import"]
    assert found["replicas"] == 2 and found["has_strategy"] and not found["outside"]
    assert found["model_replicas"] == 2 and found["mirrored"] and found["same_strategy"]


def test_build_calls_the_function_inside_the_scope(found):
    assert found["build_units"] == 3 and found["build_replicas"] == 2
    assert found["build_mirrored"] == "MirroredVariable"
    assert "Received: fn='not a function'" in found["build_error"]


def test_sync_batch_norm_synchronises_every_bn_layer_and_keeps_weights(found):
    assert found["synced_flags"] == [True, True]          # nested model included
    assert found["original_flags"] == [False, False]      # the original is untouched
    assert found["momentum_kept"] == pytest.approx(0.9)
    assert found["weights_kept"] and found["weights_count"][0] == found["weights_count"][1]
    assert found["clone_mirrored"]
    assert found["same_inference"] < 1e-6                 # inference uses moving stats: equal


def test_sync_batch_norm_returns_models_that_need_nothing_unchanged(found):
    assert found["again_is_same"] and found["no_bn_is_same"]


def test_sync_batch_norm_errors_are_clear(found):
    assert "Received: model of type Sub" in found["subclassed_error"]
    assert "synchronized=True" in found["subclassed_error"]
    assert "Received: model='model'" in found["type_error"]
