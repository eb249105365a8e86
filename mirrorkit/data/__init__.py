"""Data into a distributed ``tf.data`` pipeline: batch math, sharding, prefetching.

:mod:`.batching` keeps per-replica and global batch straight and picks the
multi-worker sharding policy (no TensorFlow); :mod:`.pipelines` builds the
training and evaluation pipelines; :mod:`.replica_input` gives each replica
its own host pipeline on CPU devices (what ``mirrorkit train`` uses there).
Dataset *sources* (digits, TFDS, image folders, TFRecord shards) are in
:mod:`mirrorkit.datasets`.

Example:
    >>> from mirrorkit.data import resolve_batch
    >>> resolve_batch(per_replica_batch=32, replicas=4).global_batch
    128
"""

from mirrorkit.data.batching import BatchSize, resolve_batch, shard_policy
from mirrorkit.data.pipelines import (
    distribute_from_function,
    eval_pipeline,
    train_pipeline,
)

__all__ = [
    "BatchSize",
    "distribute_from_function",
    "eval_pipeline",
    "resolve_batch",
    "shard_policy",
    "train_pipeline",
]
