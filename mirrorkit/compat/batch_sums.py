"""The ``batch-sum-losses`` fix: an ``add_loss`` sum over the batch trains as on one device.

Keras divides every ``add_loss`` value by the replica count N, so that the
replicas' gradients, summed, are one device's. That is right for a value
that averages over its batch (a weight regularizer, a mean) and wrong for
one that sums over it: keras.io's ``ActivityRegularizationLayer`` ("Training
& evaluation with the built-in methods") adds ``ops.sum(inputs) * 0.1``, and
each replica sums only its own slice, so under N replicas the term weighs
1/N of plain Python's and the logged loss is not plain Python's (measured, 2
replicas, one epoch: 6.25 logged vs 10.19). So does a value with one entry
per example, which Keras sums: keras.io's OCR example's ``CTCLayer`` adds
its ``(batch, 1)`` CTC losses (2 replicas: 293.2 logged vs plain Python's 586.3;
written with Keras 3's ``ops.ctc_loss``, 165.49 vs 330.98 and, with SGD, weights
that drift).

The fix reads the value's graph when a layer adds it inside a replica's
step: how it scales with the batch rows, from the reductions over the batch
dimension (a sum scales with the rows, a mean or a division by the batch
size does not), through the linear arithmetic after them (products,
quotients, sums of like terms, casts). A value that scales with the rows
(a sum) is multiplied by the global batch's rows over this replica's rows;
Keras's division (by N, or by the rows' share under ``uneven-batch-losses``)
then leaves each replica its own sum, and the replicas' gradients and
logged loss add up to one device's. Values that do not scale with the rows
are left as they are; a value that depends on the batch in a way no
per-replica weighting can make exact (a maximum over the batch, the square
of a sum) is left too, and one line names its layer. A static per-replica
batch size appearing as a number (``x.shape[0]``) counts as the batch size.
Rows are assumed independent until the reduction, as in the rest of
tf.distribute (BatchNormalization aside). Keras's ``ctc_loss`` runs a While
loop the reader cannot follow; its result is marked per-example where it is
made (``make_ctc_loss``).

Example:
    >>> from keras.src.layers.layer import Layer                     # doctest: +SKIP
    >>> patched = make(Layer.add_loss)                                # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from mirrorkit.compat import batch_graph, step_rows

logger = logging.getLogger(__name__)

# The layers already named for a loss the replicas cannot split (one line each).
_WARNED: set[str] = set()

# The reductions of a Keras Loss whose value is a mean over the batch.
_MEANS = ("sum_over_batch_size", "mean", "mean_with_sample_weight")


def _factor(context: Any) -> Any:
    """Global batch rows over this replica's rows (N where the rows are not recorded)."""
    import tensorflow as tf

    rows = step_rows.current()
    if rows is None or not step_rows.inside(rows.graph):
        return float(context.num_replicas_in_sync)
    _offset, total = step_rows.share(rows, context)
    return tf.cast(total, tf.float32) / tf.cast(tf.maximum(rows.count, 1), tf.float32)


def _rescaled(layer: Any, value: Any, context: Any) -> Any:
    import tensorflow as tf

    if not isinstance(value, tf.Tensor) or not value.dtype.is_floating:
        return value
    rows = step_rows.current()
    reader = batch_graph.Reader(rows.static if rows is not None else None)
    state = reader.state(value)
    if state == batch_graph.ROWS and value.shape.rank != 0:
        # Per-example values (keras.io's OCR example adds CTC losses shaped
        # (batch, 1)): Keras sums every element of an add_loss value, so
        # over the rows too.
        state = 1
    if state == 1:
        return value * tf.cast(_factor(context), value.dtype)
    if state not in (batch_graph.INDEP, 0):
        name = getattr(layer, "name", type(layer).__name__)
        if name not in _WARNED:
            _WARNED.add(name)
            logger.warning(
                "mirrorkit: layer %r adds a loss that depends on its whole batch in a way the "
                "replicas cannot split (not a sum or mean over the batch): under %d replicas "
                "its value differs from one device's", name, context.num_replicas_in_sync)
    return value


def make_reduce_values(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``keras.src.losses.loss.reduce_values`` (``original``): mark a mean's value."""

    def reduce_values(values: Any, sample_weight: Any = None,
                      reduction: str = "sum_over_batch_size") -> Any:
        loss = original(values, sample_weight=sample_weight, reduction=reduction)
        # hasattr: an eager tensor (or a KerasTensor) has no graph to mark in.
        if reduction in _MEANS and loss is not values and hasattr(loss, "graph"):
            batch_graph.mark_mean(loss)
        return loss

    return reduce_values


def make_ctc_loss(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap Keras's TensorFlow ``ctc_loss`` (``original``): mark its result per-example.

    ``keras.ops.ctc_loss`` runs a While loop the graph reader cannot see
    through; its value has one entry per example, each from that example alone.

    Example:
        >>> from keras.src.backend.tensorflow import nn                 # doctest: +SKIP
        >>> patched = make_ctc_loss(nn.ctc_loss)                        # doctest: +SKIP
    """

    def ctc_loss(*args: Any, **kwargs: Any) -> Any:
        loss = original(*args, **kwargs)
        if hasattr(loss, "graph") and getattr(loss.shape, "rank", None) == 1:
            batch_graph.mark_rows(loss)
        return loss

    return ctc_loss


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``Layer.add_loss`` (``original``): a value that sums over the batch is one device's."""

    def add_loss(self: Any, loss: Any) -> Any:
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync <= 1 or tf.executing_eagerly():
            return original(self, loss)
        return original(self, tf.nest.map_structure(lambda v: _rescaled(self, v, context), loss))

    return add_loss
