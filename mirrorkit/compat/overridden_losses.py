"""The ``overridden-loss-call`` fix: a ``Loss`` that overrides ``__call__`` trains as on one device.

keras.io's supervised contrastive learning example writes its loss as a
``keras.losses.Loss`` subclass whose ``__call__`` returns one value for the
batch. That skips ``Loss.__call__`` and with it ``reduce_values``, where Keras
divides a loss by the replica count N for the gradients' all-reduce (a sum).
Under N replicas the step then moves the weights N times as far and the
trainer, which unscales the logged loss, logs N times the replicas' mean
(measured: 2 replicas, the contrastive phase logs 5.48 vs plain Python's 3.48).
The ``scalar-losses`` fix does not see it: it wraps ``reduce_weighted_values``,
which this path never calls.

The fix wraps each such loss where ``CompileLoss`` builds its list of losses:
the wrapper calls the loss and, when Keras's own scaling did not run during
the call (a subclass may call ``super().__call__``), scales the scalar it
returns as Keras scales a per-example loss's mean. A loss that is batch-wide
(a similarity matrix over the batch) still sees only its replica's rows: no
scaling makes that equal to one device, and the one-device check says so.

Example:
    >>> from keras.src.trainers import compile_utils                  # doctest: +SKIP
    >>> patched = make_build(compile_utils.CompileLoss.build)          # doctest: +SKIP
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable

# While a wrapped loss runs: a list that Keras's scaling appends to.
_SCALED: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "mirrorkit_loss_scaled", default=None)


def overrides_call(loss: Any) -> bool:
    """Is ``loss`` a Keras ``Loss`` whose class defines its own ``__call__``?

    Example:
        >>> import keras
        >>> overrides_call(keras.losses.MeanSquaredError())
        False
    """
    from keras.src.losses.loss import Loss

    if not isinstance(loss, Loss):
        return False
    owner = next(c for c in type(loss).__mro__ if "__call__" in c.__dict__)
    return owner is not Loss


class _Scaled:
    """``loss`` as ``CompileLoss`` calls it, its scalar scaled for the replicas."""

    def __init__(self, loss: Any) -> None:
        self.loss = loss
        self.name = getattr(loss, "name", None)

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        import tensorflow as tf
        from keras import ops
        from keras.src.losses.loss import scale_loss_for_distribution

        seen: list = []
        token = _SCALED.set(seen)
        try:
            value = self.loss(y_true, y_pred, sample_weight)
        finally:
            _SCALED.reset(token)
        context = tf.distribute.get_replica_context()
        if seen or context is None or context.num_replicas_in_sync <= 1:
            return value
        value = ops.convert_to_tensor(value)
        if tuple(value.shape) != ():
            return value   # per-example values: Keras reduces and scales them
        return scale_loss_for_distribution(value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loss, name)


def make_build(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``CompileLoss.build`` (``original``): wrap the losses that override ``__call__``."""

    def build(self: Any, y_true: Any, y_pred: Any) -> Any:
        result = original(self, y_true, y_pred)
        flat = getattr(self, "_flat_losses", None) or []
        for index, entry in enumerate(flat):
            if len(entry) >= 2 and overrides_call(entry[1]):
                flat[index] = (entry[0], _Scaled(entry[1]), *entry[2:])
        return result

    return build


def make_scale(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap ``scale_loss_for_distribution`` (``original``): note that Keras scaled a loss."""

    def scale_loss_for_distribution(value: Any) -> Any:
        seen = _SCALED.get()
        if seen is not None:
            seen.append(True)
        return original(value)

    return scale_loss_for_distribution
