"""``sparse-gradient-sums``: an embedding trained with Adam updates as on one device.

``tests/fixtures/sparse_sums.py`` trains a token embedding (ids from the data)
and a position embedding (``ops.arange``: the same ids in every batch, as in
keras.io's Vision Transformer) with Adam. Under ``mirrorkit run`` (2 replicas)
and ``mirrorkit launch`` (2 workers) the losses and both embeddings equal plain
Python's; with the fix off by name, the position embedding's sparse gradient
reaches Adam once per replica, squared apart, and its rows end 30 % off.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, clean_env, compare_jobs, result_line, run_jobs

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "fixtures" / "sparse_sums.py"
JOBS = compare_jobs(SCRIPT, off={"MIRRORKIT_COMPAT_DISABLE": "sparse-gradient-sums"})


def _off_by(result: dict, plain: dict, key: str) -> float:
    return max(abs(a - b) for a, b in zip(result[key], plain[key])) / max(map(abs, plain[key]))


def test_embeddings_trained_with_adam_match_plain_python_under_run_and_launch(tmp_path):
    found = run_jobs(JOBS, tmp_path)
    plain = found["plain"][0]
    assert len(found["launch"]) == 2
    for result in (found["run"][0], *found["launch"]):
        for key in ("loss", "positions", "tokens"):
            assert _off_by(result, plain, key) < 2e-6, (key, _off_by(result, plain, key))
    # The control: upstream squares each replica's part of the position rows apart.
    assert _off_by(found["off"][0], plain, "positions") > 0.05


def test_only_slices_with_the_same_indices_on_every_replica_are_summed():
    result = result_line(subprocess.run(
        [sys.executable, "-c", PROBE], env=clean_env(), capture_output=True, text=True,
        timeout=300).stdout)
    # Positions: both replicas' blocks [0, 1, 1] add up row by row; tokens stay apart.
    assert result["same"] == {"indices": [0, 1, 1], "values": [3.0, 3.0, 3.0]}
    assert result["differ"] == {"indices": [0, 1, 2, 0, 1, 3], "values": [1.0] * 3 + [2.0] * 3}
    assert result["uneven"]["indices"] == [0, 1, 0, 1, 2]


PROBE = """
import json
import tensorflow as tf
from mirrorkit.compat import sparse_sums

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
reduce = sparse_sums.make(lambda self, pairs: [
    (tf.distribute.get_replica_context().all_reduce("sum", [g])[0], v) for g, v in pairs])


def case(ids_of):
    @tf.function
    def step():
        def fn():
            r = tf.distribute.get_replica_context().replica_id_in_sync_group
            ids = ids_of(r)
            rows = tf.ones([tf.shape(ids)[0], 1]) * tf.cast(r + 1, tf.float32)
            grad = reduce(None, [(tf.IndexedSlices(rows, ids, tf.constant([4, 1])), None)])[0][0]
            return grad.values[:, 0], grad.indices
        return strategy.run(fn)
    values, indices = step()
    return {"values": values.values[0].numpy().tolist(),
            "indices": indices.values[0].numpy().tolist()}


print("RESULT " + json.dumps({
    "same": case(lambda r: tf.constant([0, 1, 1])),
    "differ": case(lambda r: tf.stack([0, 1, 2 + r])),
    "uneven": case(lambda r: tf.range(2 + r)),
}))
"""
