"""The ``no-gradient-losses`` fix: a loss computed where no gradient is taken reports one device's value.

Under N replicas Keras divides every reduced loss by N in a replica context
(``scale_loss_for_distribution``), so that the optimizer's sum of the
replicas' gradients is the gradient of the global batch's mean. Its own
``test_step`` multiplies the logged loss back (``unscale_...``). Code that
takes no gradient gets the division and nothing undoes it: a
``keras.losses.Loss`` called in a custom ``test_step`` and logged with a
``keras.metrics.Mean`` reports 1/N of the one-device value (2 replicas:
0.5493 vs 1.0986), silently.

The fix divides (and multiplies back) only while a gradient can be taken:
inside a ``tf.GradientTape`` (Keras's ``train_step`` computes its loss in
one; so does every custom training step). Elsewhere -- ``evaluate``, a
custom ``test_step``, validation, a metric computed by hand -- a loss is the
replica's own mean, and the metrics' cross-replica average of those means is
the one-device value. Keras's own ``test_step`` divides and multiplies back
in the same place, so its numbers do not change.

Example:
    >>> from keras.src.losses import loss                          # doctest: +SKIP
    >>> patched = make(loss.scale_loss_for_distribution)           # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable


def gradient_possible() -> bool:
    """True while a gradient tape is recording in this thread (eager or while tracing).

    Example:
        >>> import tensorflow as tf                                  # doctest: +SKIP
        >>> with tf.GradientTape():                                  # doctest: +SKIP
        ...     gradient_possible()
        True
    """
    from tensorflow.python.eager import record

    return bool(record.could_possibly_record())


def make(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap ``scale_loss_for_distribution`` / ``unscale_...`` (``original``) with the fix."""

    def scale(value: Any) -> Any:
        if not gradient_possible():
            # No gradient to sum across replicas: the replica's own mean.
            return value
        return original(value)

    return scale
