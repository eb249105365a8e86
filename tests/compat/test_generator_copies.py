"""``generator-copies``: tensors from a Python generator never share the user's arrays.

Upstream, ``Dataset.from_generator`` hands TensorFlow the generator's aligned
NumPy arrays without a copy (asserted here, so the day TensorFlow copies, this
test says the fix can go). Under two local replicas a training step then
writes into them: ``tests/fixtures/scripts/aligned_pydataset.py`` under
``mirrorkit run`` must train to plain Python's weights with its data intact,
and with the fix off it does not (the control). Under 2+ workers the corpus
script ``pydataset_dict.py`` under ``mirrorkit launch`` shows it too (its
sample weights must come out of training intact).
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, clean_env

from mirrorkit import _env, compat
from mirrorkit.compat import generator_copies

TWO_WORKERS = json.dumps({"cluster": {"worker": ["localhost:1", "localhost:2"]},
                          "task": {"type": "worker", "index": 0}})
SCRIPT = str(REPO / "tests" / "fixtures" / "scripts" / "aligned_pydataset.py")
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


@pytest.mark.fast
def test_upstream_from_generator_shares_the_generators_array(fix_reverted):
    source = _aligned(8)
    element = _first_element(source)
    assert np.shares_memory(element._numpy(), source), \
        f"upstream no longer {FIX.error}: the fix may go"


@pytest.mark.fast
@pytest.mark.parametrize("tf_config", [None, TWO_WORKERS])
def test_the_fix_copies_in_one_process_and_across_workers(fix_applied, tf_config):
    source = _aligned(8)
    with _env.patch({"TF_CONFIG": tf_config}):
        element = _first_element(source)
    assert not np.shares_memory(element._numpy(), source)
    np.testing.assert_array_equal(element.numpy(), source[:4])


@pytest.mark.fast
def test_a_keras_pydataset_yields_copies(fix_applied):
    import keras
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    x = _aligned(16)
    w = _aligned(4).reshape(16)

    class Batches(keras.utils.PyDataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return {"x": x[i * 8:(i + 1) * 8]}, x[i * 8:(i + 1) * 8, :1], w[i * 8:(i + 1) * 8]

    inputs, _, weights = next(iter(PyDatasetAdapter(Batches()).get_tf_dataset()))
    assert not np.shares_memory(weights._numpy(), w)
    assert not np.shares_memory(inputs["x"]._numpy(), x)
    np.testing.assert_array_equal(weights.numpy(), w[:8])


@pytest.mark.fast
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


def _aligned_run(command: list[str], **env: str) -> dict:
    proc = subprocess.run(command, env=clean_env(**env), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("ALIGNED "))
    return json.loads(line.split(" ", 1)[1])


@pytest.mark.slow
def test_two_local_replicas_train_like_plain_python_and_leave_the_data_alone():
    run = [sys.executable, "-m", "mirrorkit", "run", "--simulate-cpus", "2", SCRIPT]
    plain = _aligned_run([sys.executable, SCRIPT])
    fixed = _aligned_run(run)
    upstream = _aligned_run(run, MIRRORKIT_COMPAT_DISABLE="generator-copies")
    for source, expected in plain.items():
        assert expected["data_intact"], source
        assert fixed[source]["data_intact"], source
        np.testing.assert_allclose(np.concatenate([np.ravel(w) for w in fixed[source]["weights"]]),
                                   np.concatenate([np.ravel(w) for w in expected["weights"]]),
                                   rtol=1e-5, err_msg=source)
        np.testing.assert_allclose(fixed[source]["loss"], expected["loss"], rtol=1e-5,
                                   err_msg=source)
        # The control: upstream writes into the user's array and trains on what it wrote.
        assert not upstream[source]["data_intact"], source
        assert not np.allclose(upstream[source]["weights"][0], expected["weights"][0],
                               rtol=1e-3), source
