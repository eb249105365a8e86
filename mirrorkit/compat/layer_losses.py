"""The ``layer-losses`` fix: a Keras loss computed inside a layer is scaled for the replicas once.

A ``keras.losses.Loss`` divides its mean by the replica count when called in
a replica context, so that summing the replicas' gradients gives the mean of
the global batch. ``add_loss`` values are divided by the replica count too
(``TensorFlowTrainer._aggregate_additional_loss``). A loss object called
inside a layer and handed to ``add_loss`` -- keras.io's ``LogisticEndpoint``
("Training & evaluation with the built-in methods") -- is divided twice:
under N replicas it trains at 1/N of its strength, silently.

The fix leaves a loss object's value unscaled while a layer is being called
(Keras's call context is open): what a layer computes reaches the training
loss only through ``add_loss``, which scales it once. A loss called anywhere
else -- ``compile``'s loss, a custom ``train_step`` or training loop -- is
scaled as before.

Example:
    >>> from keras.src.losses import loss                          # doctest: +SKIP
    >>> patched = make(loss.reduce_values)                         # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

# The reductions that Keras's reduce_values divides by the replica count.
_SCALED = ("sum_over_batch_size", "mean", "mean_with_sample_weight")


def inside_layer_call() -> bool:
    """Is a Keras layer's ``call`` running? (a loss made there is ``add_loss``'s to scale)

    Shared with ``scalar-losses`` and ``masked-loss-means``, which leave such a loss alone.

    Example:
        >>> inside_layer_call()
        False
    """
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute("current_call_ctx") is not None


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``keras.src.losses.loss.reduce_values`` (``original``) with the fix."""

    def reduce_values(values, sample_weight=None, reduction="sum_over_batch_size"):
        loss = original(values, sample_weight=sample_weight, reduction=reduction)
        if reduction in _SCALED and tuple(values.shape) not in ((), (0,)) \
                and inside_layer_call():
            from keras.src.losses.loss import unscale_loss_for_distribution

            # add_loss scales it (once) when the model sums its losses.
            loss = unscale_loss_for_distribution(loss)
        return loss

    return reduce_values
