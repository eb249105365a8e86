"""``static-batch-shapes``: which datasets keep their static batch size across workers.

The fix turns TensorFlow's partial-batch handling off only where every worker
is sure to get the same full batches: a dataset sharded by data. A dataset
that reads files may be sharded by file under ``AUTO`` (workers with
different numbers of batches), so it must keep the handling, or a worker that
runs out first would leave the others waiting in a collective. The launched
end-to-end checks (the supervised contrastive loss on two workers, and its
failure with the fix off) are in ``test_scalar_losses.py``.
"""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from mirrorkit.compat.static_batches import _shards_by_data, reads_files  # noqa: E402

pytestmark = pytest.mark.fast


def _with_policy(ds, policy):
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return ds.with_options(options)


def test_in_memory_datasets_read_no_files():
    arrays = tf.data.Dataset.from_tensor_slices((tf.zeros([8, 2]), tf.zeros([8])))
    assert not reads_files(arrays.shuffle(8, seed=0).map(lambda x, y: (x * 2, y)).batch(4))
    assert not reads_files(tf.data.Dataset.range(8).batch(2, drop_remainder=True))


def test_readers_are_found_directly_and_inside_functions(tmp_path):
    path = str(tmp_path / "a.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(b"x")
    assert reads_files(tf.data.TFRecordDataset([path]).batch(1))
    names = tf.data.Dataset.from_tensor_slices([path])
    assert reads_files(names.interleave(tf.data.TFRecordDataset).batch(1))
    assert reads_files(names.flat_map(tf.data.TextLineDataset))
    assert reads_files(tf.data.FixedLengthRecordDataset([path], 1))
    # tf.io.read_file in a map is no reader dataset: AUTO shards it by data.
    assert not reads_files(names.map(tf.io.read_file))


def test_only_data_sharding_counts_as_equal_batches(tmp_path):
    policy = tf.data.experimental.AutoShardPolicy
    arrays = tf.data.Dataset.range(8).batch(2, drop_remainder=True)
    assert _shards_by_data(arrays)                                   # AUTO, in memory
    assert _shards_by_data(_with_policy(arrays, policy.DATA))
    assert _shards_by_data(_with_policy(arrays, policy.OFF))
    assert not _shards_by_data(_with_policy(arrays, policy.FILE))
    path = str(tmp_path / "a.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(b"x")
    records = tf.data.TFRecordDataset([path]).batch(1, drop_remainder=True)
    assert not _shards_by_data(records)                              # AUTO may shard by file
    assert _shards_by_data(_with_policy(records, policy.DATA))
