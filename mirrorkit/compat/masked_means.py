"""The ``masked-loss-means`` fix: a masked loss averages over the global batch's valid entries.

A sequence model whose output carries a Keras mask (``Embedding(mask_zero=True)``
followed by an LSTM or a Transformer, keras.io's translation and tagging
examples) or a loss with ``ignore_class`` averages its loss over the valid
entries: Keras weighs each valid entry ``total / valid`` (``apply_mask``)
before it takes the mean. Under N replicas ``valid`` is the replica's own
count, so each replica's mean counts 1/N whatever its number of valid
entries, where one device divides the batch's sum by the batch's valid
count: a replica holding short sequences weighs its entries more, and the
gradient, the update and the logged loss differ from plain Python's, silently.
Measured: an Embedding(mask_zero) + LSTM tagger, 256 padded sequences, batch
64 split into short and long halves, Adam, 2 replicas: the embeddings 4.7 %
off plain Python's after 2 epochs, the accuracy 10 % off, the ``evaluate``
loss 1.3 %. ``reduction="mean_with_sample_weight"`` divides by the
replica's own sum of weights, the same mistake.

The fix computes the replica's share of the global mean, its weighted sum
over the *global* batch's valid count (or sum of weights), with one sum of
the replicas' counts per loss call (no gradient flows through it), and
hands Keras that share as a mean over the replica's rows (times the global
rows over its own), so that Keras's scaling and its logs -- the replicas'
values weighed by their rows, also on an uneven split -- give one device's
numbers. Losses without a mask or weights, one value for the batch, a loss
inside a layer's call and a single replica keep Keras's own reduction.

Example:
    >>> from keras.src.losses import loss                      # doctest: +SKIP
    >>> patched = make(loss.reduce_weighted_values)            # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

from mirrorkit.compat import replica_loss
from mirrorkit.compat.layer_losses import inside_layer_call

_AVERAGING = ("sum_over_batch_size", "mean")
_WEIGHT_MEAN = "mean_with_sample_weight"


def _left_to_keras() -> bool:
    """In a layer's call (``add_loss``: layer-losses' case) or Keras's output inference?"""
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope

    return inside_layer_call() or in_symbolic_scope()


def _handled(kind: str, sample_weight: Any, mask: Any) -> bool:
    """Does Keras divide by a count that is the replica's own? (a mask, or a weight sum)"""
    if kind in _AVERAGING:
        return mask is not None
    return kind == _WEIGHT_MEAN and (mask is not None or sample_weight is not None)


def _share(context: Any, values: Any, sample_weight: Any, mask: Any, kind: str,
           dtype: Any) -> Any:
    """This replica's share of one device's reduced loss, as Keras expects it before scaling."""
    import tensorflow as tf
    from keras import ops
    from keras.src.losses.loss import (apply_mask, scale_loss_for_distribution,
                                       squeeze_or_expand_to_same_rank)

    if sample_weight is not None:
        sample_weight = ops.convert_to_tensor(sample_weight, dtype=dtype)
    if mask is not None:
        mask = ops.convert_to_tensor(mask, dtype=dtype)
    # Mask and weights merged as for a sum: 0/1 times the weights, without
    # Keras's local total/valid factor (the global one comes below).
    weights = apply_mask(sample_weight, mask, dtype=values.dtype, reduction="sum")
    weighted = values
    if weights is not None:
        weights = ops.cast(weights, values.dtype)
        values, weights = squeeze_or_expand_to_same_rank(values, weights)
        weighted = values * weights
    rows = ops.cast(tf.shape(weighted)[0], values.dtype)
    if kind == _WEIGHT_MEAN:
        # One device: sum(values * w) / sum(w) over the batch.
        local = ops.stack([ops.sum(weights), rows])
    else:
        # One device: sum(values * m * total / valid) / size(values), where
        # total and valid are the mask's entries and its true ones.
        local = ops.stack([ops.cast(ops.size(mask), values.dtype),
                           ops.sum(ops.cast(mask, values.dtype)),
                           ops.cast(ops.size(weighted), values.dtype), rows])
    every = replica_loss.global_sum(context, local)
    if kind == _WEIGHT_MEAN:
        share = ops.divide_no_nan(ops.sum(weighted), every[0])
    else:
        share = ops.divide_no_nan(ops.sum(weighted) * ops.divide_no_nan(every[0], every[1]),
                                  every[2])
    # Keras scales a replica's mean by its rows' part of the batch (1/N on an
    # even split): handed as a mean over the rows, the share comes out whole.
    return scale_loss_for_distribution(share * ops.divide_no_nan(every[-1], rows))


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``keras.src.losses.loss.reduce_weighted_values`` (``original``) with the fix.

    Example:
        >>> from keras.src.losses import loss                      # doctest: +SKIP
        >>> loss.reduce_weighted_values = make(loss.reduce_weighted_values)  # doctest: +SKIP
    """

    def reduce_weighted_values(values, sample_weight=None, mask=None,
                               reduction="sum_over_batch_size", dtype=None):
        import tensorflow as tf
        from keras import ops
        from keras.src.losses.loss import standardize_reduction

        kind = standardize_reduction(reduction)
        context = tf.distribute.get_replica_context()
        if _handled(kind, sample_weight, mask) and context is not None \
                and context.num_replicas_in_sync > 1 and not _left_to_keras():
            tensor = ops.convert_to_tensor(values, dtype=dtype)
            if tensor.shape.rank:   # one value for the batch: Keras's (and scalar-losses')
                return _share(context, tensor, sample_weight, mask, kind, dtype)
        return original(values, sample_weight=sample_weight, mask=mask,
                        reduction=reduction, dtype=dtype)

    return reduce_weighted_values
