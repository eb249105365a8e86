"""``generator-copies``: tensors from a Python generator never share the user's arrays across workers.

Upstream, ``Dataset.from_generator`` hands TensorFlow the generator's NumPy
arrays without a copy (asserted here, so the day TensorFlow copies, this test
says the fix can go). Under 2+ workers a training step then sometimes writes
into them; the corpus script ``pydataset_dict.py`` under ``mirrorkit launch``
shows that end to end (its sample weights must come out of training intact).
"""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

from mirrorkit import _env, compat
from mirrorkit.compat import generator_copies

TWO_WORKERS = json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"]},
                          "task": {"type": "worker", "index": 0}})
ONE_WORKER = json.dumps({"cluster": {"worker": ["localhost:1"]},
                         "task": {"type": "worker", "index": 0}})
FIX = compat.FIXES["generator-copies"]


def _aligned(n: int) -> np.ndarray:
    """``n`` x 4 float32 values 0, 1, 2 ... at a 64-byte aligned address.

    TensorFlow wraps an array without a copy only when its data is aligned
    (64 bytes), so whether a small array is shared depends on where NumPy put
    it; an aligned one always is.
    """
    raw = np.empty(n * 4 + 16, "float32")
    skip = (-raw.ctypes.data % 64) // 4
    out = raw[skip:skip + n * 4].reshape(n, 4)
    out[:] = np.arange(n * 4, dtype="float32").reshape(n, 4)
    return out


def _first_element(source: np.ndarray):
    import tensorflow as tf

    def generate():
        for i in range(0, len(source), 4):
            yield source[i:i + 4]

    ds = tf.data.Dataset.from_generator(
        generate, output_signature=tf.TensorSpec((None,) + source.shape[1:], tf.float32))
    return next(iter(ds))


@pytest.fixture
def fix_applied():
    was = FIX.is_applied()
    FIX.apply()
    yield
    if not was:
        FIX.revert()


@pytest.fixture
def fix_reverted():
    was = FIX.is_applied()
    FIX.revert()
    yield
    if was:
        FIX.apply()


def test_upstream_from_generator_shares_the_generators_array(fix_reverted):
    source = _aligned(8)
    with _env.patch({"TF_CONFIG": TWO_WORKERS}):
        element = _first_element(source)
    assert np.shares_memory(element._numpy(), source), \
        f"upstream no longer {FIX.error}: the fix may go"


def test_the_fix_copies_in_a_process_that_is_one_of_several_workers(fix_applied):
    source = _aligned(8)
    with _env.patch({"TF_CONFIG": TWO_WORKERS}):
        element = _first_element(source)
    assert not np.shares_memory(element._numpy(), source)
    np.testing.assert_array_equal(element.numpy(), source[:4])


@pytest.mark.parametrize("tf_config", [None, ONE_WORKER])
def test_one_process_keeps_the_zero_copy_path(fix_applied, tf_config):
    source = _aligned(8)
    with _env.patch({"TF_CONFIG": tf_config}):
        element = _first_element(source)
    assert np.shares_memory(element._numpy(), source)


def test_a_keras_pydataset_yields_copies_across_workers(fix_applied):
    import keras
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    x = _aligned(16)
    w = _aligned(4).reshape(16)

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"x": x[i * 8:(i + 1) * 8]}, x[i * 8:(i + 1) * 8, :1], w[i * 8:(i + 1) * 8]

    with _env.patch({"TF_CONFIG": TWO_WORKERS}):
        inputs, _, weights = next(iter(PyDatasetAdapter(Batches()).get_tf_dataset()))
    assert not np.shares_memory(weights._numpy(), w)
    assert not np.shares_memory(inputs["x"]._numpy(), x)
    np.testing.assert_array_equal(weights.numpy(), w[:8])


def test_owned_keeps_the_structure_and_leaves_non_arrays_alone():
    pair = collections.namedtuple("Pair", "image label")
    data = np.zeros((4, 2))
    element = {"a": (data[:2], [data[2:], 7]), "b": pair(data, "cat"), "c": None}
    out = generator_copies.owned(element)
    assert isinstance(out["b"], pair) and out["b"].label == "cat"
    assert isinstance(out["a"], tuple) and isinstance(out["a"][1], list)
    assert out["a"][1][1] == 7 and out["c"] is None
    for got, src in ((out["a"][0], data[:2]), (out["a"][1][0], data[2:]), (out["b"].image, data)):
        assert not np.shares_memory(got, data)
        np.testing.assert_array_equal(got, src)


@pytest.mark.parametrize("text, expected", [
    (TWO_WORKERS, True),
    (ONE_WORKER, False),
    (json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:2"]}}), True),
    ("not json", False),
    (None, False),
])
def test_in_cluster_reads_tf_config(text, expected):
    with _env.patch({"TF_CONFIG": text}):
        assert generator_copies.in_cluster() is expected
