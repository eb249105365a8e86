"""Batch math, shard policy, and the tf.data pipelines (real TF, 2 logical CPUs).

The pure functions run in-process. Everything touching TensorFlow runs in one
fresh interpreter (the CPU split is per process) whose findings, printed as
JSON, the tests below then check one by one.
"""

from __future__ import annotations

import pytest
from conftest import run_snippet

from mirrorkit.data import BatchSize, resolve_batch, shard_policy

# --- batch math (pure) -------------------------------------------------------


@pytest.mark.fast
@pytest.mark.parametrize("kwargs, expected", [
    ({"per_replica_batch": 32, "replicas": 4}, (32, 128, 4)),
    ({"global_batch": 128, "replicas": 4}, (32, 128, 4)),
    ({"global_batch": 7, "replicas": 1}, (7, 7, 1)),
    ({"per_replica_batch": 1, "replicas": 8}, (1, 8, 8)),
])
def test_resolve_batch_converts_both_ways(kwargs, expected):
    batch = resolve_batch(**kwargs)
    assert (batch.per_replica, batch.global_batch, batch.replicas) == expected
    assert batch.per_replica * batch.replicas == batch.global_batch


@pytest.mark.fast
def test_non_divisible_global_batch_is_rejected_with_the_keras_message():
    with pytest.raises(ValueError) as err:
        resolve_batch(global_batch=30, replicas=4)
    assert str(err.value) == ("`global_batch` must be divisible by the number of replicas (4). "
                              "Received: global_batch=30")


@pytest.mark.fast
@pytest.mark.parametrize("kwargs, received", [
    ({"per_replica_batch": 0, "replicas": 2}, "per_replica_batch=0"),
    ({"per_replica_batch": -8, "replicas": 2}, "per_replica_batch=-8"),
    ({"global_batch": 0, "replicas": 2}, "global_batch=0"),
    ({"global_batch": 32.0, "replicas": 2}, "global_batch=32.0"),
    ({"global_batch": "32", "replicas": 2}, "global_batch='32'"),
    ({"per_replica_batch": True, "replicas": 2}, "per_replica_batch=True"),
    ({"per_replica_batch": 8, "replicas": 0}, "replicas=0"),
    ({"per_replica_batch": 8, "replicas": 2, "global_batch": 16},
     "per_replica_batch=8, global_batch=16"),
    ({"replicas": 2}, "per_replica_batch=None, global_batch=None"),
])
def test_bad_batch_arguments_raise_value_error_naming_the_value(kwargs, received):
    with pytest.raises(ValueError) as err:
        resolve_batch(**kwargs)
    assert f"Received: {received}" in str(err.value)


@pytest.mark.fast
def test_batch_size_is_frozen():
    batch = BatchSize(per_replica=2, global_batch=4, replicas=2)
    with pytest.raises(AttributeError):
        batch.replicas = 3  # type: ignore[misc]


@pytest.mark.fast
@pytest.mark.parametrize("from_files, num_files, num_workers, expected", [
    (True, 8, 2, "FILE"),
    (True, 2, 2, "FILE"),
    (True, 1, 2, "DATA"),        # fewer files than workers: a worker would get none
    (True, None, 2, "DATA"),     # unknown file count: cannot promise FILE
    (False, None, 4, "DATA"),    # in-memory arrays
    (False, 100, 4, "DATA"),
    (True, 8, 1, "OFF"),         # one worker: nothing to shard
    (False, None, 1, "OFF"),
])
def test_shard_policy_per_source(from_files, num_files, num_workers, expected):
    assert shard_policy(from_files=from_files, num_files=num_files,
                        num_workers=num_workers) == expected


@pytest.mark.fast
@pytest.mark.parametrize("kwargs, received", [
    ({"num_files": 2, "num_workers": 0}, "num_workers=0"),
    ({"num_files": -1, "num_workers": 2}, "num_files=-1"),
])
def test_shard_policy_rejects_bad_counts(kwargs, received):
    with pytest.raises(ValueError, match=f"Received: {received}"):
        shard_policy(from_files=True, **kwargs)


# --- pipelines on real TensorFlow, 2 replicas --------------------------------

PIPELINES = r"""
import json, os, sys, tempfile
import numpy as np
import mirrorkit
strategy = mirrorkit.get_strategy(simulate_cpus=2)
import keras
import tensorflow as tf
from mirrorkit import data

out = {}
from snippet_helpers import errors

def policy(ds):
    return ds.options().experimental_distribute.auto_shard_policy.name

x = np.arange(50, dtype="float32").reshape(50, 1)
y = np.arange(50, dtype="int32")

# Default replicas come from the strategy mirrorkit created, and from the scope.
out["default_global"] = data.resolve_batch(per_replica_batch=8).global_batch
with strategy.scope():
    out["scoped_per_replica"] = data.resolve_batch(global_batch=16).per_replica
batch = data.resolve_batch(global_batch=16)

train = data.train_pipeline((x, y), batch=batch, seed=3)
epochs = [[b[1].numpy().tolist() for b in train] for _ in range(2)]
out["train_batch_sizes"] = [len(b) for b in epochs[0]]
out["train_examples"] = sum(len(b) for b in epochs[0])
out["train_distinct"] = len({v for b in epochs[0] for v in b})
out["reshuffled"] = epochs[0] != epochs[1]
again = data.train_pipeline((x, y), batch=batch, seed=3)
out["seed_reproducible"] = [b[1].numpy().tolist() for b in again] == epochs[0]
ordered = data.train_pipeline((x, y), batch=batch, shuffle=False,
                              map_fn=lambda a, b: (a * 2, b), cache=True)
first = next(iter(ordered))
out["unshuffled_first"] = first[1].numpy().tolist()
out["mapped_first"] = first[0].numpy()[:3, 0].tolist()
out["train_policy_local"] = policy(train)
out["train_policy_2_workers"] = policy(data.train_pipeline((x, y), batch=batch, num_workers=2))

ev = data.eval_pipeline((x, y), batch=batch)
out["eval_batch_sizes"] = [int(b[1].shape[0]) for b in ev]
out["eval_labels"] = [v for b in ev for v in b[1].numpy().tolist()]
out["eval_policy_2_workers"] = policy(data.eval_pipeline((x, y), batch=batch, num_workers=2))

# A source that reads files: 4 TFRecord files, 2 workers -> FILE sharding.
tmp = tempfile.mkdtemp()
for i in range(4):
    with tf.io.TFRecordWriter(os.path.join(tmp, f"part-{i}.tfrecord")) as writer:
        for j in range(8):
            writer.write(tf.train.Example(features=tf.train.Features(feature={
                "v": tf.train.Feature(int64_list=tf.train.Int64List(value=[i * 8 + j]))
            })).SerializeToString())
files = tf.data.Dataset.list_files(os.path.join(tmp, "*.tfrecord"), shuffle=False)
records = files.interleave(tf.data.TFRecordDataset)
parse = lambda s: tf.io.parse_single_example(s, {"v": tf.io.FixedLenFeature([], tf.int64)})["v"]
from_files = data.train_pipeline(records, batch=batch, map_fn=parse, num_files=4, num_workers=2)
out["files_policy"] = policy(from_files)
out["files_examples"] = sum(int(b.shape[0]) for b in from_files)
out["few_files_policy"] = policy(data.train_pipeline(records, batch=batch, map_fn=parse,
                                                     num_files=1, num_workers=2))

# Keras under 2 replicas: drop_remainder -> 3 full steps of 16 from 50 examples.
class Count(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.batches = 0
    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
with strategy.scope():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(3)])
    model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
count = Count()
model.fit(data.train_pipeline((x, y % 3), batch=batch), epochs=2, verbose=0, callbacks=[count])
out["fit_steps_two_epochs"] = count.batches

# distribute_datasets_from_function: per-replica batch and steps from the global batch.
seen = []
def dataset_fn(ctx):
    per_replica = ctx.get_per_replica_batch_size(batch.global_batch)
    seen.append([ctx.num_input_pipelines, ctx.input_pipeline_id, per_replica])
    ds = tf.data.Dataset.from_tensor_slices((x[:48], y[:48] % 3))
    ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    return ds.shuffle(48, seed=0).batch(per_replica, drop_remainder=True)
dist, steps = data.distribute_from_function(dataset_fn, batch=batch, num_examples=48)
count = Count()
history = model.fit(dist, steps_per_epoch=steps, epochs=3, verbose=0, callbacks=[count])
out["dff_steps"] = steps
out["dff_context"] = seen
out["dff_batches_three_epochs"] = count.batches
out["dff_epochs"] = len(history.history["loss"])

# One host pipeline per replica (CPU devices): step k's replica slices hold
# exactly the examples of the global pipeline's batch k, epoch after epoch.
from mirrorkit.data import replica_input
out["replica_input_applies"] = [replica_input.applies(strategy),
                                replica_input.applies(tf.distribute.get_strategy())]
per_replica = replica_input.per_replica_train_input((x, y), batch=batch, strategy=strategy,
                                                    seed=3)
stream, steps = iter(per_replica), []
for _ in range(6):
    features, labels = next(stream)
    slices = strategy.experimental_local_results(labels)
    paired = all(np.array_equal(f.numpy()[:, 0], l.numpy())
                 for f, l in zip(strategy.experimental_local_results(features), slices))
    steps.append([[int(v) for v in s.numpy()] for s in slices] + [paired])
out["replica_steps"] = steps
out["global_steps"] = [b for epoch in epochs for b in epoch]
out["replica_input_declines"] = [
    replica_input.per_replica_train_input((x, y), batch=batch, strategy=strategy, seed=None),
    replica_input.per_replica_train_input((x, y), batch=batch, strategy=strategy, seed=0,
                                          map_fn=lambda a, b: (a, b)),
    replica_input.per_replica_train_input(
        tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True),
        batch=batch, strategy=strategy, seed=0)]
out["err_replica_small"] = errors(lambda: replica_input.per_replica_train_input(
    (x[:10], y[:10]), batch=batch, strategy=strategy, seed=0))

out["err_small"] = errors(lambda: data.train_pipeline((x[:10], y[:10]), batch=batch))
out["err_batch"] = errors(lambda: data.train_pipeline((x, y), batch=16))
out["err_data"] = errors(lambda: data.train_pipeline("not data", batch=batch))
out["err_map"] = errors(lambda: data.eval_pipeline((x, y), batch=batch, map_fn=3))
out["err_buffer"] = errors(lambda: data.train_pipeline((x, y), batch=batch, shuffle_buffer=0))
out["err_replicas"] = errors(lambda: data.distribute_from_function(
    dataset_fn, batch=data.resolve_batch(global_batch=16, replicas=4), num_examples=48))
out["err_examples"] = errors(lambda: data.distribute_from_function(
    dataset_fn, batch=batch, num_examples=15))
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    result, proc = run_snippet(PIPELINES, tmp_path_factory.mktemp("data"))
    return {"result": result, "stderr": proc.stderr}


def test_replicas_default_to_the_current_strategy(found):
    r = found["result"]
    assert r["default_global"] == 16 and r["scoped_per_replica"] == 8


def test_train_pipeline_drops_the_remainder_and_reshuffles(found):
    r = found["result"]
    assert r["train_batch_sizes"] == [16, 16, 16]        # 50 examples -> 3 full batches
    assert r["train_examples"] == 48 and r["train_distinct"] == 48
    assert r["reshuffled"] and r["seed_reproducible"]
    assert r["unshuffled_first"] == list(range(16))
    assert r["mapped_first"] == [0.0, 2.0, 4.0]


def test_per_replica_input_gives_each_replica_its_slice_of_the_global_batch(found):
    r = found["result"]
    assert r["replica_input_applies"] == [True, False]
    assert r["replica_input_declines"] == [None, None, None]
    assert "fewer examples than one global batch" in r["err_replica_small"]
    # 50 examples, global batch 16: 3 steps per epoch, then the next
    # (reshuffled) epoch, in the global pipeline's order.
    assert len(r["replica_steps"]) == len(r["global_steps"]) == 6
    for (first, second, paired), whole in zip(r["replica_steps"], r["global_steps"]):
        assert len(first) == len(second) == 8 and paired
        assert first + second == whole  # the slices tf.distribute would cut


def test_eval_pipeline_keeps_every_example_in_order(found):
    r = found["result"]
    assert r["eval_batch_sizes"] == [16, 16, 16, 2]
    assert r["eval_labels"] == list(range(50))


def test_shard_policy_is_set_on_the_pipeline(found):
    r = found["result"]
    assert r["train_policy_local"] == "OFF"
    assert r["train_policy_2_workers"] == "DATA"
    assert r["eval_policy_2_workers"] == "DATA"
    assert r["files_policy"] == "FILE" and r["files_examples"] == 32
    assert r["few_files_policy"] == "DATA"
    assert "auto-shard" not in found["stderr"].lower()


def test_keras_fit_takes_full_global_batches(found):
    assert found["result"]["fit_steps_two_epochs"] == 6


def test_distribute_from_function_gives_per_replica_batches_and_true_steps(found):
    r = found["result"]
    assert r["dff_steps"] == 3                      # 48 examples // global 16
    assert r["dff_context"] == [[1, 0, 8]]          # one pipeline, 16 / 2 replicas
    # The pipeline is repeated, so every epoch gets its steps (Keras keeps one
    # iterator across epochs when steps_per_epoch is given).
    assert r["dff_batches_three_epochs"] == 9 and r["dff_epochs"] == 3


@pytest.mark.parametrize("key, fragment", [
    ("err_small", "Received: 10 examples"),
    ("err_batch", "Received: batch=16"),
    ("err_data", "Received: data of type str"),
    ("err_map", "Received: map_fn=3"),
    ("err_buffer", "Received: shuffle_buffer=0"),
    ("err_replicas", "resolved for 4 replicas but the strategy has 2"),
    ("err_examples", "Received: num_examples=15"),
])
def test_pipeline_errors_name_the_received_value(found, key, fragment):
    message = found["result"][key]
    assert message is not None and fragment in message, message
