"""``replica-random``: every replica draws its own rows of one device's random numbers.

Upstream, every replica draws the same Dropout mask, noise and augmentation
for its slice of the batch (one seed state, the slice's shape), so training
is less random than on one device and its numbers are not plain Python's.
The in-process test compares each replica's draws inside ``strategy.run``
with one device's draw for the whole batch, for every patched function, at
batches that split evenly, unevenly (2/2/1) and leave a replica empty,
traced and eager; with the fix reverted, replicas repeat replica 0's numbers.
The script test trains a model with flip, noise and two Dropouts plain, under
``mirrorkit run`` and on two launched workers: same losses and weights (its
last batch splits unevenly, which ``uneven-batch-losses`` makes exact;
tests/compat/test_uneven_batches.py turns that one off).
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import REPO, clean_env, result_line

DRAWS = """
import json
import numpy as np, tensorflow as tf, keras
import mirrorkit
from mirrorkit import compat

strategy = mirrorkit.get_strategy("mirrored", simulate_cpus=3)
status = compat.apply()["replica-random"]

def draws(seed, x):
    n = tf.shape(x)[0]
    logits = tf.math.log(tf.reshape(tf.range(1.0, 5.0), [1, 4]) + 0 * x[:, :1])
    return {
        "uniform": keras.random.uniform((n, 3), seed=seed),
        "normal": keras.random.normal((n, 2, 2), seed=seed),
        "truncated_normal": keras.random.truncated_normal((n, 5), seed=seed),
        "randint": keras.random.randint((n, 4), 0, 100, seed=seed),
        "dropout": keras.random.dropout(tf.ones((n, 6)), 0.5, seed=seed),
        "spatial": keras.random.dropout(tf.ones((n, 2, 3)), 0.5, noise_shape=(None, 1, 3),
                                        seed=seed),
        "categorical": keras.random.categorical(logits, 7, seed=seed),
        # Not batch-shaped: one draw on one device, shared by the replicas.
        "shared": keras.random.uniform((3,), seed=seed),
    }

def one_device(n):
    x = tf.reshape(tf.range(n * 2, dtype=tf.float32), (n, 2))
    return {k: v.numpy() for k, v in draws(keras.random.SeedGenerator(7), x).items()}

def replicas(n, mode):
    data = tf.data.Dataset.from_tensor_slices(
        tf.reshape(tf.range(n * 2, dtype=tf.float32), (n, 2)))
    batch = next(iter(strategy.experimental_distribute_dataset(
        data.batch(n, drop_remainder=(mode == "static")))))
    with strategy.scope():
        seed = keras.random.SeedGenerator(7)
    step = lambda x: strategy.run(lambda x: draws(seed, x), args=(x,))
    out = (step if mode == "eager" else tf.function(step))(batch)
    rows = [int(t.shape[0]) for t in strategy.experimental_local_results(batch)]
    local = {k: [t.numpy() for t in strategy.experimental_local_results(v)]
             for k, v in out.items()}
    return rows, local

def compare(n, mode):
    want = one_device(n)
    rows, got = replicas(n, mode)
    same = {}
    for key, parts in got.items():
        if key == "shared":
            same[key] = all(np.array_equal(p, want[key]) for p in parts)
        else:
            same[key] = bool(np.array_equal(np.concatenate(parts), want[key]))
    # Upstream's symptom: a replica with rows repeats replica 0's first rows.
    repeats = all(np.array_equal(got["uniform"][i], got["uniform"][0][:r])
                  for i, r in enumerate(rows))
    return {"rows": rows, "same": same, "repeats": repeats}

cases = [(6, "static"), (6, "traced"), (5, "traced"), (1, "traced"), (6, "eager")]
result = {"status": status, "fixed": [compare(n, mode) for n, mode in cases]}
compat.FIXES["replica-random"].revert()
result["upstream"] = compare(6, "traced")
print("RESULT " + json.dumps(result))
"""


def test_each_replica_draws_its_rows_of_one_devices_draw(run_python):
    result = result_line(run_python(DRAWS).stdout)
    assert result["status"] == "applied"
    rows = [case["rows"] for case in result["fixed"]]
    assert rows == [[2, 2, 2], [2, 2, 2], [2, 2, 1], [1, 0, 0], [2, 2, 2]]
    for case in result["fixed"]:
        assert all(case["same"].values()), case
    # The even split, without the fix: every replica repeats replica 0's draw.
    upstream = result["upstream"]
    assert upstream["repeats"] and not upstream["same"]["uniform"]
    assert not upstream["same"]["dropout"] and upstream["same"]["shared"]


SCRIPT = REPO / "tests" / "fixtures" / "scripts" / "random_layers.py"


def train(command: list[str], cwd, **env: str) -> list[dict]:
    """Run ``command`` in a new folder ``cwd``; the JSON of each process's run."""
    cwd.mkdir()
    proc = subprocess.run(command, cwd=str(cwd), env=clean_env(**env), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return [json.loads(p.read_text()) for p in sorted(cwd.glob("random_layers-*.json"))]


def largest_difference(a: dict, b: dict) -> float:
    """The largest difference of two runs' losses and final weights."""
    return max(max(abs(x - y) for x, y in zip(a["loss"], b["loss"])),
               *(float(np.max(np.abs(np.subtract(u, v))))
                 for u, v in zip(a["weights"], b["weights"])))


@pytest.mark.slow
def test_random_layers_train_as_in_plain_python_under_run_and_launch(tmp_path):
    (plain,) = train([sys.executable, str(SCRIPT)], tmp_path / "plain")
    run = [sys.executable, "-m", "mirrorkit", "run", "--simulate-cpus", "2", str(SCRIPT)]
    (local,) = train(run, tmp_path / "run")
    workers = train([sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--", "mirrorkit",
                      "run", str(SCRIPT)], tmp_path / "launch")
    assert len(workers) == 2
    for got in (local, *workers):
        assert largest_difference(got, plain) < 1e-6
        # Augmentation in a tf.data map: drawn once for the global batch.
        assert largest_difference(got["pipeline"], plain["pipeline"]) < 1e-6
        # A custom step's augmenter built inside the step (its symbolic call draws nothing).
        assert largest_difference(got["step"], plain["step"]) < 1e-6
    # The control: upstream's draws train another model.
    (upstream,) = train(run, tmp_path / "upstream", MIRRORKIT_COMPAT_DISABLE="replica-random")
    assert largest_difference(upstream, plain) > 1e-2
