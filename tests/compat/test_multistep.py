"""The ``multi-step`` fix across replica and worker counts (keras#19246).

Several steps per ``tf.function`` call must train exactly like one device:
the same global batch on 1, 2 and 4 local replicas, and on 2 workers, at
``steps_per_execution=4``, ends with the same weights (1e-5). One replica is
Keras's own code path (the fix hands back to it), so it is the reference.
The 1- and 2-replica runs share a process: ``get_strategy`` splits its CPU in
2, and the reference mirrors over the first of those devices (the fixes act
on each model's own strategy). Strategies over 2 and 4 of one process's
devices would share collective group keys, so 4 replicas have a process of
their own.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import run_snippet
from workers import run_workers

TRAIN = """
import json, os, numpy as np, keras, tensorflow as tf
import mirrorkit
from mirrorkit import compat
strategy = mirrorkit.get_strategy({kind})
# The one-replica reference first, when asked: the first of this process's devices.
strategies = ([tf.distribute.MirroredStrategy(["/cpu:0"])] if {one} else []) + [strategy]
x = np.random.RandomState(0).rand(192, 8).astype("float32")
y = np.random.RandomState(1).randint(0, 4, 192)


def train(strategy):
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(4)])
        model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=4)
    # 12 steps an epoch of a global batch of 16: three full calls of 4 steps.
    hist = model.fit(x, y, batch_size=16, epochs=3, verbose=0, shuffle=False)
    return {{"replicas": model.distribute_strategy.num_replicas_in_sync,
            "status": compat.status()["multi-step"],
            "iterations": int(model.optimizer.iterations.numpy()), "loss": hist.history["loss"],
            "weights": [w.tolist() for w in model.get_weights()]}}


print("RESULT " + json.dumps([train(s) for s in strategies]), flush=True)
"""


@pytest.fixture(scope="module")
def by_replicas(tmp_path_factory):
    """{replicas: result} for 1, 2 and 4 local replicas, from two processes at once."""
    jobs = [(TRAIN.format(kind="simulate_cpus=2", one=True), tmp_path_factory.mktemp("spe2")),
            (TRAIN.format(kind="simulate_cpus=4", one=False), tmp_path_factory.mktemp("spe4"))]
    with ThreadPoolExecutor(max_workers=2) as pool:
        outs = list(pool.map(lambda job: run_snippet(*job)[0], jobs))
    runs = [run for out in outs for run in out]
    assert [run["replicas"] for run in runs] == [1, 2, 4]
    return {run["replicas"]: run for run in runs}


def _max_diff(a, b):
    return max(float(np.abs(np.array(u) - np.array(v)).max()) for u, v in zip(a, b))


@pytest.mark.parametrize("replicas", [2, 4])
def test_several_steps_per_call_match_one_replica(by_replicas, replicas):
    one, many = by_replicas[1], by_replicas[replicas]
    assert many["replicas"] == replicas and many["status"] == "applied"
    assert one["iterations"] == many["iterations"] == 36
    assert _max_diff(one["weights"], many["weights"]) < 1e-5
    assert many["loss"] == pytest.approx(one["loss"], rel=1e-5)


@pytest.mark.slow
def test_several_steps_per_call_on_two_workers_match_one_replica(by_replicas, tmp_path):
    script = tmp_path / "spe_worker.py"
    script.write_text(TRAIN.format(kind="", one=False))
    results, report = run_workers(script, 2, timeout=180, cwd=tmp_path)
    assert all(r.returncode == 0 for r in results), report
    outs = [out for r in results for out in json.loads(r.stdout.split("RESULT ", 1)[1])]
    assert len(outs) == 2, report
    one = by_replicas[1]
    for out in outs:
        assert out["replicas"] == 2 and out["status"] == "applied"
        assert out["iterations"] == 36
        assert _max_diff(one["weights"], out["weights"]) < 1e-5, report
