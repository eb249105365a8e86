"""The ``hand-mean-gradients`` fix: a loss a custom step averages by hand trains as on one device.

Keras divides a ``keras.losses`` loss by the replica count N inside a
training step (each replica's value is a *share*), so that the all-reduced
sum of the replicas' gradients is one device's gradient. A loss written by
hand gets no such division: keras.io's "Variational AutoEncoder" computes
``ops.mean(ops.sum(binary_crossentropy(...), axis=(1, 2)))`` in its
``train_step``, and the "Customizing what happens in fit()" guide overrides
``compute_loss`` with ``ops.mean((y_pred - y) ** 2)``. Under N replicas
each replica differentiates the mean over its own rows and the sum of those
gradients is N times one device's: with SGD every update is N times as
large (measured: one step, 2 replicas, kernel update 0.2801 vs plain
Python's 0.1401); Adam's normalised step hides most of it.

The fix reads what a gradient tape differentiates in a replica's step of
Keras's ``fit`` (not a custom loop's ``strategy.run``, whose author scales
for the strategy), from the loss back through its scalar arithmetic:

* a *mean* over the replica's rows (``ops.mean``, a sum divided by the
  replica's batch size) or a value that does not depend on the batch (a
  weight regularizer, ``sum(self.losses)``) is each replica's estimate of
  the whole: its gradient is weighed by 1/N (by the replica's rows over
  the global batch's on an uneven split, as ``uneven-batch-losses`` weighs
  Keras's own shares);
* a masked mean written by hand (``reduce_sum(loss * mask) / reduce_sum(mask)``,
  keras.io's image captioning) is weighed by its denominator over the
  replicas' total (one sum per step), the part of one device's denominator
  the replica holds;
* a Keras share (a ``Loss`` call, ``compute_loss``, ``tf.nn.compute_average_loss``:
  see ``logged-step-losses``) is scaled already, and a *sum* over the rows
  (``ops.sum``, a sum divided by the global batch size written as a number)
  adds up across the replicas to one device's: both are left as they are;
* a loss made of several of these (a share plus a hand-written mean, a mean
  plus a regularizer) is split along its additions and constant factors, and
  each part weighed as above (through the tape's ``output_gradients``: the
  graph the step built is not changed).

A part that is none of these (a maximum over the batch, a product of two
shares, or a value the reader cannot follow) is named in one line and
weighed as a mean: each replica's value is most often an estimate of the
whole batch's, and upstream's N times would scale it against the parts
beside it (keras.io's WGAN-GP critic loss, ``mean(fake) - mean(real)``
plus a gradient penalty, then moves the critic's output bias, whose
gradient is 0 on one device). The loss is
read by :mod:`mirrorkit.compat.loss_parts`, with the shares
``logged-step-losses`` records (without it the fix does nothing: every
compiled loss would read as a hand-written mean); a step run eagerly
(``run_eagerly=True``) has no graph to read and is left as it is.

Example:
    >>> from tensorflow.python.eager.backprop import GradientTape   # doctest: +SKIP
    >>> patched = make_gradient(GradientTape.gradient)               # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from mirrorkit.compat import loss_parts, replica_loss, step_calls
from mirrorkit.compat.failures import failing_loudly
from mirrorkit.patching import engine

logger = logging.getLogger(__name__)

_WEIGHED = frozenset({loss_parts.MEAN, loss_parts.INDEP})
# The places already named for a loss the fix cannot split (once each).
_NAMED: set[str] = set()


def _weight(context: Any) -> Any:
    """This replica's weight of its own mean: 1/N, or its rows over the global rows."""
    import tensorflow as tf

    n = context.num_replicas_in_sync
    found = replica_loss.rows_weight()
    if found is None:
        return tf.constant(1.0 / n)
    rows, total = (tf.cast(w, tf.float32) for w in found)
    return tf.math.divide_no_nan(rows, total) / n


def _name_once(target: Any, replicas: int) -> None:
    from mirrorkit.compat.paired_losses import where

    place = where(target.op)
    if place not in _NAMED:
        _NAMED.add(place)
        logger.warning(
            "mirrorkit: the loss this step differentiates (%s) has a part that is not a "
            "mean, a sum over its batch or a Keras loss (a maximum over the batch, a product "
            "of two means): under %d replicas each replica computes it from its own rows; its "
            "gradient is weighed as a mean's (each replica's value an estimate of the whole), "
            "which is one device's only if the part is one.", place, replicas)


def plan(target: Any, context: Any) -> tuple[list[Any], list[Any]] | None:
    """``(targets, output_gradients)`` that give one device's gradient, or None to keep it.

    Example:
        >>> targets, weights = plan(loss, tf.distribute.get_replica_context())  # doctest: +SKIP
    """
    import tensorflow as tf

    parts = loss_parts.reader(context)
    kind = parts.kind(target)
    if kind in (loss_parts.SHARE, loss_parts.SUM):
        return None
    weight = _weight(context)
    if kind in _WEIGHED or kind == loss_parts.OTHER:
        if kind == loss_parts.OTHER:
            _name_once(target, context.num_replicas_in_sync)
        return [target], [tf.cast(weight, target.dtype) * tf.ones_like(target)]
    if kind == loss_parts.RATIO:
        return [target], [tf.cast(parts.ratio_weight(target, context), target.dtype)
                          * tf.ones_like(target)]
    found = parts.split(target, _WEIGHED | {loss_parts.RATIO, loss_parts.OTHER})
    if not found:
        return None
    for part, _ in found:
        if parts.kind(part) == loss_parts.OTHER:
            _name_once(part, context.num_replicas_in_sync)
    weights = [parts.ratio_weight(part, context) if parts.kind(part) == loss_parts.RATIO
               else weight for part, _ in found]
    return ([target, *(part for part, _ in found)],
            [tf.ones_like(target), *(tf.cast((w - 1.0) * coef, part.dtype)
                                      for w, (part, coef) in zip(weights, found))])


def _applies(target: Any, output_gradients: Any) -> Any:
    """The replica context when ``target`` is a Keras step's scalar loss to read, else None."""
    import tensorflow as tf

    if output_gradients is not None or not step_calls.in_keras_step() \
            or tf.executing_eagerly():
        return None
    if not isinstance(target, tf.Tensor) or not target.dtype.is_floating \
            or target.shape.rank != 0:
        return None
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync <= 1:
        return None
    # Keras's own shares are known, and its step marked, only while
    # logged-step-losses records and wraps them.
    return context if engine.is_applied("logged-step-losses") else None


def make_gradient(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``GradientTape.gradient`` (``original``): a hand-written mean's gradient, one device's."""

    def gradient(self: Any, target: Any, sources: Any, output_gradients: Any = None,
                 *args: Any, **kwargs: Any) -> Any:
        context = _applies(target, output_gradients)
        if context is not None:
            with failing_loudly("hand-mean-gradients"):
                found = plan(target, context)
            if found is not None:
                target, output_gradients = found
        return original(self, target, sources, output_gradients, *args, **kwargs)

    return gradient
