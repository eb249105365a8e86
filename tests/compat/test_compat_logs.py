"""scalar-logs fix: step logs that mix tensors, variables and Python numbers, on 2 real workers.

keras.io's ``CategoricalTruePositives`` metric returns its variable from
``result()``; under ``MultiWorkerMirroredStrategy`` the step logs then mix a
variable with plain tensors, and the fix used to fail with "Cannot convert
`input_tensor` to a `PerReplica` object because it doesn't have device set".
Every per-batch log of ``fit`` and ``evaluate`` on 2 workers must equal the
single-process run's (each worker gets half of every global batch).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from conftest import clean_env, result_line
from workers import run_workers

_SCRIPT = textwrap.dedent('''
    import json, os
    import keras
    import numpy as np
    import tensorflow as tf
    from keras import ops

    import mirrorkit
    if "TF_CONFIG" in os.environ:
        mirrorkit.configure_failure_detection()
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    else:
        strategy = tf.distribute.get_strategy()
    mirrorkit.fix_multi_worker()

    class CategoricalTruePositives(keras.metrics.Metric):
        def __init__(self, name="ctp", **kwargs):
            super().__init__(name=name, **kwargs)
            self.true_positives = self.add_variable(shape=(), name="ctp", initializer="zeros")

        def update_state(self, y_true, y_pred, sample_weight=None):
            hits = ops.equal(ops.cast(ops.reshape(y_true, (-1,)), "int32"),
                             ops.cast(ops.argmax(y_pred, axis=1), "int32"))
            self.true_positives.assign_add(ops.sum(ops.cast(hits, "float32")))

        def result(self):
            return self.true_positives          # the variable itself

    class Model(keras.Sequential):
        def train_step(self, data):
            logs = super().train_step(data)
            logs["constant"] = 0.5               # a Python number among the logs
            logs["int_count"] = ops.cast(ops.shape(data[0])[0], "int32") * 0 + 7
            return logs

    x = np.random.RandomState(0).rand(128, 8).astype("float32")
    y = np.random.RandomState(1).randint(0, 3, (128, 1))
    with strategy.scope():
        model = Model([keras.Input((8,)), keras.layers.Dense(3, activation="softmax")])
        model.layers[0].set_weights([np.random.RandomState(2).rand(8, 3).astype("float32"),
                                     np.zeros(3, "float32")])
        model.compile("sgd", "sparse_categorical_crossentropy",
                      metrics=[CategoricalTruePositives(), "accuracy"])

    logs = {"train": [], "test": []}

    class Record(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            LOGS["train"].append({k: float(v) for k, v in logs.items()})

        def on_test_batch_end(self, batch, logs=None):
            LOGS["test"].append({k: float(v) for k, v in logs.items()})

    LOGS = logs
    history = model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False,
                        callbacks=[Record()])
    evaluated = model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True,
                               callbacks=[Record()])
    print("RESULT " + json.dumps({"logs": logs, "evaluate": evaluated,
                                  "epoch": {k: v[-1] for k, v in history.history.items()}}))
''')


def _close(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            _close(a[key], b[key])
        elif isinstance(a[key], list):
            assert len(a[key]) == len(b[key]), key
            for x, y in zip(a[key], b[key]):
                _close(x, y)
        else:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key


@pytest.mark.slow
def test_mixed_step_logs_match_one_process_on_two_workers(tmp_path):
    script = tmp_path / "logs_worker.py"
    script.write_text(_SCRIPT)
    single = subprocess.run([sys.executable, str(script)], env=clean_env(), cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    expected = result_line(single.stdout)
    results, report = run_workers(script, 2, timeout=240, cwd=tmp_path)
    assert all(r.returncode == 0 for r in results), report
    assert len(expected["logs"]["train"]) == 4 and expected["logs"]["train"][0]["ctp"] > 0
    for r in results:
        got = result_line(r.stdout)
        _close(got, expected)
