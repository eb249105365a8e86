"""predict_on_batch / test_on_batch / train_on_batch on 2 replicas equal one device's.

Upstream (Keras 3.15, TensorFlow trainer) hands these methods' batch whole to
every replica: ``predict_on_batch`` of 32 images on 2 replicas returns 64
rows, and a metric that sums (true positives) counts every example twice.
The fixes (:mod:`mirrorkit.compat.on_batch`) are checked against one device in fresh
processes (one process gives both: no strategy, then 2 replicas on its CPU split
in two), and disabled to show the upstream bug is still there.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import clean_env, result_line

_ON_BATCH = '''
    import json, os
    import numpy as np, tensorflow as tf, keras
    from keras import ops
    from mirrorkit import compat

    # RUNS: "one" (no strategy: one device) and/or "two" (2 replicas).
    runs = os.environ["RUNS"].split(",")
    strategies = {"one": tf.distribute.get_strategy()}
    if "two" in runs:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        strategies["two"] = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    off = [f for f in os.environ.get("OFF", "").split(",") if f]
    compat.apply(disable=off)

    class TruePositives(keras.metrics.Metric):
        def __init__(self, name="tp", **kw):
            super().__init__(name=name, **kw)
            self.tp = self.add_variable(shape=(), name="tp", initializer="zeros")
        def update_state(self, y_true, y_pred, sample_weight=None):
            hit = ops.cast(ops.reshape(y_true, (-1,)), "int32") == ops.cast(
                ops.argmax(y_pred, 1), "int32")
            self.tp.assign_add(ops.sum(ops.cast(hit, "float32")))
        def result(self):
            return self.tp

    rs = np.random.RandomState(0)
    x = rs.rand(33, 8, 8, 1).astype("float32")
    y = rs.randint(0, 3, (33,))
    w = rs.rand(33).astype("float32")

    def run(strategy):
        out = {}
        for bn in (False, True):
            with strategy.scope():
                layers = [keras.Input((8, 8, 1)), keras.layers.Conv2D(4, 3)]
                layers += [keras.layers.BatchNormalization()] if bn else []
                layers += [keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax")]
                model = keras.Sequential(layers)
                model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy",
                              metrics=[TruePositives(), "accuracy"])
            model.set_weights([np.random.RandomState(i).rand(*v.shape).astype("float32") * 0.3
                               for i, v in enumerate(model.get_weights())])
            r = out["bn" if bn else "plain"] = {}
            r["replicas"] = model.distribute_strategy.num_replicas_in_sync
            r["predict"] = model.predict_on_batch(x[:32]).tolist()
            r["predict_odd"] = model.predict_on_batch(x[:31]).tolist()
            r["predict_one"] = model.predict_on_batch(x[:1]).tolist()
            r["test"] = model.test_on_batch(x[:32], y[:32], return_dict=True)
            r["test_odd"] = model.test_on_batch(x, y, sample_weight=w, return_dict=True)
            r["train"] = model.train_on_batch(x[:32], y[:32], return_dict=True)
            r["train_class_weight"] = model.train_on_batch(
                x[:32], y[:32], class_weight={0: 1.0, 1: 2.0, 2: 0.5}, return_dict=True)
            r["weights"] = {str(i): v.tolist() for i, v in enumerate(model.get_weights())}
        return out

    print("RESULT " + json.dumps({name: run(strategies[name]) for name in runs}))
'''
_FIXES = "predict-on-batch,test-on-batch,train-on-batch"


def _close(a, b, path=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}")
    else:
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6,
                                   err_msg=path)


@pytest.fixture(scope="module")
def fixed(tmp_path_factory):
    """One device and 2 replicas with the fixes, both from one process (its CPU split in 2)."""
    script = tmp_path_factory.mktemp("fixed") / "on_batch.py"
    script.write_text(textwrap.dedent(_ON_BATCH))
    proc = subprocess.run([sys.executable, str(script)], env=clean_env(RUNS="one,two"),
                          capture_output=True, text=True, timeout=300, cwd=str(script.parent))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = result_line(proc.stdout)
    assert [out[name][model]["replicas"] for name in ("one", "two") for model in ("plain", "bn")
            ] == [1, 1, 2, 2]
    return out


@pytest.mark.slow
def test_on_batch_methods_on_two_replicas_equal_one_device(fixed):
    # A copy: the pops below must not reach the other test.
    one, two = copy.deepcopy(fixed["one"]), copy.deepcopy(fixed["two"])
    assert np.shape(one["plain"]["predict"]) == (32, 3)
    # Where splitting would not be exact, Keras's whole batch per replica stays:
    # exact loss, ratios and weights, but a summing metric reads N times (documented).
    for model, call in [("plain", "test_odd"), ("bn", "test_odd"), ("bn", "train"),
                        ("bn", "train_class_weight")]:
        assert two[model][call].pop("tp") == 2 * one[model][call].pop("tp")
    for model in ("plain", "bn"):
        del one[model]["replicas"], two[model]["replicas"]
    # Every row, every other log (true positives included), every weight.
    _close(one, two)


@pytest.mark.slow
def test_without_the_fixes_upstream_doubles_rows_and_counts(run_python, fixed):
    one = fixed["one"]["plain"]
    two = result_line(run_python(_ON_BATCH, env={"RUNS": "two", "OFF": _FIXES}).stdout)
    two = two["two"]["plain"]
    assert two["replicas"] == 2
    assert np.shape(two["predict"]) == (64, 3)
    assert np.shape(two["predict_one"]) == (2, 3)
    assert two["test"]["tp"] == 2 * one["test"]["tp"]
    assert two["train"]["tp"] == 2 * one["train"]["tp"]
