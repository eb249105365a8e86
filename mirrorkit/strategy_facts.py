"""Small facts about strategies and distributed values, shared by the fixes and the chief logic.

Example:
    >>> from mirrorkit.strategy_facts import local_first, replicas
    >>> local_first(None, 3), replicas(None)
    (3, 1)
"""

from __future__ import annotations

from typing import Any


def replicas(strategy: Any) -> int:
    """Replicas in sync of ``strategy`` (1 for None or the default strategy)."""
    return int(getattr(strategy, "num_replicas_in_sync", 1) or 1)


def model_replicas(model: Any) -> int:
    """Replicas in sync of the strategy ``model`` was built under (1 when it has none)."""
    try:
        return replicas(model.distribute_strategy)
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return 1


def per_replica_batch_norm(model: Any) -> tuple[str, ...]:
    """Names of ``model``'s BatchNormalization layers that train on each replica's slice alone.

    Not synchronised and trainable (a frozen one runs in inference mode, the
    same on any slice). Example: ``per_replica_batch_norm(resnet)`` ->
    ``("bn_conv1", ...)`` for a ResNet built without ``synchronized=True``.
    """
    return tuple(layer.name for layer in model._flatten_layers()
                 if "BatchNormalization" in type(layer).__name__
                 and getattr(layer, "trainable", True)
                 and not getattr(layer, "synchronized", False))


def in_multi_worker_mode(strategy: Any) -> bool:
    """True when ``strategy`` is a MultiWorkerMirroredStrategy spanning several workers."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and bool(
        strategy.extended._in_multi_worker_mode())


def splits_batches(strategy: Any) -> bool:
    """True when a data batch reaches the step split into per-replica values."""
    # Multi-worker mode, or several local replicas: in both the data batch
    # arrives as PerReplica values that upstream reduces element-wise, which
    # fails across workers and whenever the replicas' slices differ in size
    # (a global batch of 32 on 3 replicas is split 11/11/10).
    return in_multi_worker_mode(strategy) or replicas(strategy) > 1


def local_first(strategy: Any, value: Any) -> Any:
    """This worker's first local replica's part of ``value`` (``value`` if not distributed)."""
    import tensorflow as tf

    if isinstance(value, tf.distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


def rank(strategy: Any, value: Any) -> int | None:
    """Rank of (the local part of) ``value``, or None when it has no shape."""
    local = local_first(strategy, value)
    shape = getattr(local, "shape", None)
    return None if shape is None else shape.rank
