"""The ``sparse-gradient-sums`` fix: an embedding's sparse gradient reaches Adam as on one device.

A variable read through a lookup (``keras.layers.Embedding``, ``ops.take``)
gets a sparse gradient (``tf.IndexedSlices``: rows and their indices). Under
N replicas ``tf.distribute`` all-reduces it by *concatenating* the replicas'
slices, so a row every replica looks up arrives N times, each with its
replica's part. Keras's optimizers then square the slices one by one
(``ops.square`` keeps an IndexedSlices' rows apart): Adam, AdamW, RMSprop,
Adagrad and the others build their second moment from ``a^2 + b^2`` where
one device has ``(a + b)^2``. The update differs silently. Measured with
keras.io's "Image classification with Vision Transformer" (a position
embedding looked up with ``ops.arange``, as in keras.io's text Transformer
too): the position embeddings 1.1 % off plain Python's after one epoch
under 2 replicas, every other weight within 5e-7 with SGD.

When the all-reduced slices are N blocks of the same indices in the same
order (every replica made the same lookup, one that does not depend on the
batch, such as positions), the fix adds the blocks up row by row: exactly
one device's slices. Slices that differ between the replicas (token ids
from the data) stay concatenated, as they are on one device, where each
example's lookup is a slice of its own. The check runs in the step, on the
gathered indices (no extra communication).

Known limit: a batch-dependent lookup whose indices happen to be equal in
every replica's slice (every example looks up the same ids) is summed too;
one device keeps those rows apart.

Example:
    >>> from keras.src.backend.tensorflow.optimizer import TFOptimizer   # doctest: +SKIP
    >>> patched = make(TFOptimizer._all_reduce_sum_gradients)            # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable


def _one_devices(reduced: Any, replicas: int) -> Any:
    """``reduced`` (the replicas' slices, concatenated) with equal-index blocks summed."""
    import tensorflow as tf

    # Decided from the all-reduced slices alone, which every replica holds the
    # same: each replica's update stays the same, whatever its own rows.
    total = tf.shape(reduced.indices)[0]
    rows = total // replicas

    def same_indices() -> Any:
        blocks = tf.reshape(reduced.indices, [replicas, rows])
        return tf.reduce_all(tf.equal(blocks, blocks[:1]))

    summable = tf.cond(tf.equal(total % replicas, 0), same_indices, lambda: tf.constant(False))

    def summed() -> tuple[Any, Any]:
        values = tf.reshape(reduced.values,
                            tf.concat([[replicas, rows], tf.shape(reduced.values)[1:]], 0))
        return tf.reduce_sum(values, axis=0), reduced.indices[:rows]

    values, indices = tf.cond(summable, summed, lambda: (reduced.values, reduced.indices))
    return tf.IndexedSlices(values, indices, reduced.dense_shape)


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``TFOptimizer._all_reduce_sum_gradients`` (``original``) with the fix."""

    def _all_reduce_sum_gradients(self: Any, grads_and_vars: Any) -> Any:
        import tensorflow as tf

        grads_and_vars = list(grads_and_vars)
        reduced = original(self, grads_and_vars)
        context = tf.distribute.get_replica_context()
        replicas = getattr(context, "num_replicas_in_sync", 1) if context else 1
        if replicas == 1 or not any(isinstance(g, tf.IndexedSlices) for g, _ in grads_and_vars):
            return reduced
        return [(_one_devices(grad, replicas), var)
                if isinstance(local, tf.IndexedSlices) and isinstance(grad, tf.IndexedSlices)
                else (grad, var)
                for (local, _), (grad, var) in zip(grads_and_vars, reduced)]

    return _all_reduce_sum_gradients
