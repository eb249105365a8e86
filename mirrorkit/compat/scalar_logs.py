"""The ``scalar-logs`` fix (keras#20585, part 2; tensorflow#72388).

``reduce_per_replica``'s multi-worker branch reduces the step logs with
``strategy.reduce("MEAN", v, axis=0)``. Logs are scalars (loss, metric
results), so TensorFlow raises ``Invalid reduction dimension 0 for input with
0 dimensions``. The fix reduces rank-0 values with ``axis=None`` (the mean
over replicas, which is what the single-worker branch computes), all scalars
of a dtype in one collective instead of one each, and leaves every other
value and reduction to Keras.

Example:
    >>> from keras.src.backend.tensorflow import trainer       # doctest: +SKIP
    >>> patched = make(trainer.reduce_per_replica)             # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

from mirrorkit.compat._values import in_multi_worker_mode, local_first, rank


def _mean_of_scalars(strategy: Any, scalars: list[Any]) -> list[Any]:
    """Mean over replicas of each per-replica scalar, in one collective per dtype.

    Upstream reduces every log (loss, each metric) with its own all-reduce;
    across workers each costs a network round trip (~2 ms on loopback), so
    the scalars of one dtype travel stacked in one vector.
    """
    import tensorflow as tf

    distributed = [isinstance(v, tf.distribute.DistributedValues) for v in scalars]
    if len(scalars) == 1 or len(set(distributed)) > 1:
        return [strategy.reduce("MEAN", v, axis=None) for v in scalars]
    if distributed[0]:
        stacked = strategy.run(lambda *values: tf.stack(values), args=tuple(scalars))
    else:
        # One local replica per worker: plain tensors, reduced across workers.
        stacked = tf.stack(scalars)
    return tf.unstack(strategy.reduce("MEAN", stacked, axis=None))


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap Keras's ``reduce_per_replica`` (``original``) with the fix."""

    def reduce_per_replica(values, strategy, reduction):
        if reduction not in ("auto", "mean") or not in_multi_worker_mode(strategy):
            return original(values, strategy, reduction)
        from keras.src import tree

        flat = tree.flatten(values)
        out = list(flat)
        by_dtype: dict[Any, list[int]] = {}
        for i, v in enumerate(flat):
            if rank(strategy, v) == 0:
                # The mean over replicas of a scalar: axis=None, not axis=0.
                by_dtype.setdefault(local_first(strategy, v).dtype, []).append(i)
            else:
                out[i] = original(v, strategy, "mean")
        for indices in by_dtype.values():
            means = _mean_of_scalars(strategy, [flat[i] for i in indices])
            for i, mean in zip(indices, means):
                out[i] = mean
        return tree.pack_sequence_as(values, out)

    return reduce_per_replica
