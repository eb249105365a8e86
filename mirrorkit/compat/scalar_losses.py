"""The ``scalar-losses`` fix: a loss that reduces itself trains and logs as on one device.

A loss function or ``Loss.call`` that returns one value for the batch
(``ops.mean(ops.square(y - p))``, a sum divided by the batch size) is common
in user code. Under N replicas Keras divides a per-example loss's mean by N
in ``reduce_values`` (so that the all-reduce, a sum over replicas, gives the
gradient of the global mean) but returns a shape-``()`` value before that
scaling. The trainer still unscales the logged loss and the all-reduce still
sums the gradients: ``evaluate`` reports N times the one-device loss and each
step moves the weights N times as far, silently (measured: Dense(1)
regression, batch 64, 2 replicas: loss 26.81 vs 13.40, kernel 0.6276 vs
0.3138 after one SGD step).

The fix scales such a value like a per-example loss's mean: in a replica
context of N > 1 replicas, with a reduction that averages
(``sum_over_batch_size``/``mean``) and no sample weight or mask (those make
Keras broadcast the value to the batch, and its own scaling then applies).
A loss computed inside a layer call is left alone: ``add_loss`` scales it
once (see :mod:`mirrorkit.compat.layer_losses`). A loss that returns one
value per example keeps Keras's exact behaviour.

Example:
    >>> from keras.src.losses import loss                          # doctest: +SKIP
    >>> patched = make(loss.reduce_weighted_values)                # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

from mirrorkit.compat import replica_loss
from mirrorkit.compat.layer_losses import inside_layer_call

# The reductions whose per-example result Keras divides by the replica count.
_AVERAGING = ("sum_over_batch_size", "mean")


def _weighted(values: Any, sample_weight: Any, dtype: Any, loss: Any) -> Any:
    """A scalar loss times the *global* batch's mean sample weight, scaled as Keras scales.

    Keras broadcasts the scalar to the weights and averages: ``L * mean(w)``
    over the replica's batch. One device computes ``L * mean(w)`` over the
    global batch; the replicas' ``L`` average to the global one, but their
    mean weights do not multiply back to its mean weight. So the replica's
    ``L`` is multiplied by the global mean weight (one sum over the replicas
    per step; no gradient flows into weights).
    """
    import tensorflow as tf
    from keras import ops
    from keras.src.losses.loss import scale_loss_for_distribution

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync <= 1:
        return loss
    values = ops.convert_to_tensor(values, dtype=dtype)
    weight = ops.cast(ops.convert_to_tensor(sample_weight), values.dtype)
    local = ops.stack([ops.sum(weight), ops.cast(ops.size(weight), values.dtype)])
    total = replica_loss.global_sum(context, local)
    return scale_loss_for_distribution(values * ops.divide_no_nan(total[0], total[1]))


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``keras.src.losses.loss.reduce_weighted_values`` (``original``) with the fix."""

    def reduce_weighted_values(values, sample_weight=None, mask=None,
                               reduction="sum_over_batch_size", dtype=None):
        loss = original(values, sample_weight=sample_weight, mask=mask,
                        reduction=reduction, dtype=dtype)
        if mask is not None or getattr(values, "shape", None) is None \
                or tuple(values.shape) != () or inside_layer_call():
            return loss
        from keras.src.losses.loss import scale_loss_for_distribution, standardize_reduction

        if standardize_reduction(reduction) not in _AVERAGING:
            return loss
        if sample_weight is not None:
            return _weighted(values, sample_weight, dtype, loss)
        # One value for the whole local batch: its mean. Scaled as Keras
        # scales a per-example loss's mean (a no-op with one replica).
        return scale_loss_for_distribution(loss)

    return reduce_weighted_values
