"""The ``scalar-logs`` fix (keras#20585, part 2; tensorflow#72388).

``reduce_per_replica``'s multi-worker branch reduces the step logs with
``strategy.reduce("MEAN", v, axis=0)``. Logs are scalars (loss, metric
results), so TensorFlow raises ``Invalid reduction dimension 0 for input with
0 dimensions``. The fix reduces rank-0 values with ``axis=None`` (the mean
over replicas, which is what the single-worker branch computes), all scalars
of a dtype in one collective instead of one each, and leaves every other
tensor and reduction to Keras. Logs may mix per-replica values, plain tensors
and variables (a metric whose ``result()`` returns its variable): a variable
is read as its cross-replica value (a metric variable's sum over all
replicas, as Keras shows it on one worker) and Python numbers pass through,
as in Keras's single-worker branch.

Example:
    >>> from keras.src.backend.tensorflow import trainer       # doctest: +SKIP
    >>> patched = make(trainer.reduce_per_replica)             # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

from mirrorkit.strategy_facts import in_multi_worker_mode, local_first, rank


def _is_variable(value: Any) -> bool:
    import keras
    import tensorflow as tf

    return isinstance(value, (keras.Variable, tf.Variable))


def _is_tensor_like(value: Any) -> bool:
    import tensorflow as tf

    return isinstance(value, (tf.Tensor, tf.distribute.DistributedValues)) or _is_variable(value)


def _cross_replica_value(value: Any) -> Any:
    """A variable's value as read outside the replicas: aggregated already.

    A metric whose ``result()`` returns its variable (keras.io's
    ``CategoricalTruePositives``) hands ``strategy.run`` the variable itself.
    Its metric variables are sync-on-read with ``aggregation="sum"``, so read
    here, in cross-replica context, they hold the sum over every replica of
    every worker -- what one device computes, and what Keras shows with a
    local MirroredStrategy (it returns such values unreduced and reads them
    later). Reading inside the step keeps that read's collective on every
    worker at the same point; averaging it again would divide it by the
    replica count.
    """
    import tensorflow as tf

    return tf.convert_to_tensor(getattr(value, "value", value))


def _mean_of_scalars(strategy: Any, scalars: list[Any]) -> list[Any]:
    """Mean over replicas of each scalar, in one collective per dtype.

    Upstream reduces every log (loss, each metric) with its own all-reduce;
    across workers each costs a network round trip (~2 ms on loopback), so
    the scalars of one dtype travel stacked in one vector. ``scalars`` may mix
    per-replica values with plain tensors (what ``strategy.run`` returns for
    one local replica, or for a value every local replica shares):
    ``strategy.run`` stacks them per replica either way, so no plain tensor
    reaches ``strategy.reduce`` without a device ("Cannot convert
    `input_tensor` to a `PerReplica` object because it doesn't have device
    set").
    """
    import tensorflow as tf

    if all(not isinstance(v, tf.distribute.DistributedValues) for v in scalars):
        # One local replica per worker: plain tensors, reduced across workers.
        stacked = tf.stack(scalars)
    else:
        stacked = strategy.run(lambda *values: tf.stack(values), args=tuple(scalars))
    return tf.unstack(strategy.reduce("MEAN", stacked, axis=None))


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap Keras's ``reduce_per_replica`` (``original``) with the fix."""

    def reduce_per_replica(values, strategy, reduction):
        if reduction not in ("auto", "mean") or not in_multi_worker_mode(strategy):
            return original(values, strategy, reduction)
        import tensorflow as tf
        from keras.src import tree

        flat = tree.flatten(values)
        out = list(flat)
        by_dtype: dict[Any, list[int]] = {}
        for i, v in enumerate(flat):
            if _is_variable(v):
                out[i] = _cross_replica_value(v)
            elif not _is_tensor_like(v):
                # Python numbers and arrays are the same on every worker;
                # Keras returns them as they are under one worker too.
                continue
            elif rank(strategy, v) == 0:
                # The mean over replicas of a scalar: axis=None, not axis=0.
                dtype = tf.as_dtype(local_first(strategy, v).dtype)
                by_dtype.setdefault(dtype, []).append(i)
            else:
                out[i] = original(v, strategy, "mean")
        for indices in by_dtype.values():
            means = _mean_of_scalars(strategy, [flat[i] for i in indices])
            for i, mean in zip(indices, means):
                out[i] = mean
        return tree.pack_sequence_as(values, out)

    return reduce_per_replica
