"""Small facts about distributed values and strategies that several fixes need.

Example:
    >>> from mirrorkit.compat._values import local_first
    >>> local_first(None, 3)
    3
"""

from __future__ import annotations

from typing import Any


def in_multi_worker_mode(strategy: Any) -> bool:
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and bool(
        strategy.extended._in_multi_worker_mode())


def splits_batches(strategy: Any) -> bool:
    # Multi-worker mode, or several local replicas: in both the data batch
    # arrives as PerReplica values that upstream reduces element-wise, which
    # fails across workers and whenever the replicas' slices differ in size
    # (a global batch of 32 on 3 replicas is split 11/11/10).
    if in_multi_worker_mode(strategy):
        return True
    return int(getattr(strategy, "num_replicas_in_sync", 1)) > 1


def local_first(strategy: Any, value: Any) -> Any:
    import tensorflow as tf

    if isinstance(value, tf.distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


def rank(strategy: Any, value: Any) -> int | None:
    local = local_first(strategy, value)
    shape = getattr(local, "shape", None)
    return None if shape is None else shape.rank
