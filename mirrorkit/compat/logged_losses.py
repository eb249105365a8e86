"""The ``logged-step-losses`` fix: a custom ``train_step`` that logs its loss logs one device's value.

Inside a training step under N replicas a reduced Keras loss is each
replica's *share* of the global loss (Keras divides it by N, see
:mod:`mirrorkit.compat.no_gradient_losses`), so that summing the replicas'
gradients gives the global gradient. Keras's own ``train_step`` multiplies
the share back before logging it. A custom ``train_step`` written as the
keras.io guides write it --
``loss = self.compute_loss(y=y, y_pred=y_pred)`` or ``loss = self.loss_fn(y, p)``
inside the tape, then ``self.loss_tracker.update_state(loss)`` -- logs the
share: 1/N of the one-device loss, while training correctly.

The fix remembers the shares (the rank-0 result of a ``keras.losses.Loss``
call or of ``Model.compute_loss`` in a replica context of N > 1 replicas
while a gradient tape records) and, when exactly such a value reaches
``keras.metrics.Mean.update_state``, logs N times it: the Mean's
cross-replica average is then the global loss, what one device logs. The
gradient is untouched (nothing on the loss's path changes). A value derived
from the share (``loss * 2``, ``loss + other``) is not recognised and still
logs its share; ``keras.metrics.Sum`` needs nothing (its cross-replica sum of
the shares is the global loss already).

Example:
    >>> from keras.src.metrics import reduction_metrics             # doctest: +SKIP
    >>> patched = make_update_state(reduction_metrics.Mean.update_state)  # doctest: +SKIP
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

from mirrorkit.compat.no_gradient_losses import gradient_possible

# id(tensor) -> (weak reference to it, replicas it is a share of).
_SHARES: dict[int, tuple[weakref.ref, int]] = {}


def _replicas_if_share() -> int:
    """The replica count when a loss computed here is a share of the global loss, else 0."""
    import tensorflow as tf

    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return 0
    n = int(tf.distribute.get_strategy().num_replicas_in_sync)
    return n if n > 1 and gradient_possible() else 0


def _remember(value: Any) -> Any:
    n = _replicas_if_share()
    if n and tuple(getattr(value, "shape", (None,)) or ()) == ():
        try:
            key = id(value)
            _SHARES[key] = (weakref.ref(value, lambda _r, k=key: _SHARES.pop(k, None)), n)
        except TypeError:
            pass  # a value that takes no weak reference (a Python float): not a tensor
    return value


def share_of(value: Any) -> int:
    """How many replicas ``value`` is a share of (0: not a remembered share).

    Example:
        >>> share_of(1.0)
        0
    """
    found = _SHARES.get(id(value))
    return found[1] if found is not None and found[0]() is value else 0


def make_loss_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``keras.losses.Loss.__call__`` (``original``): remember a share."""

    def __call__(self: Any, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        return _remember(original(self, y_true, y_pred, sample_weight=sample_weight))

    return __call__


def make_compute_loss(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``Trainer.compute_loss`` (``original``): remember a share."""

    def compute_loss(self: Any, *args: Any, **kwargs: Any) -> Any:
        return _remember(original(self, *args, **kwargs))

    return compute_loss


def make_update_state(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``keras.metrics.Mean.update_state`` (``original``): log a share as the whole."""

    def update_state(self: Any, values: Any, sample_weight: Any = None) -> Any:
        n = share_of(values)
        if n:
            from keras import ops

            values = ops.multiply(values, ops.cast(n, values.dtype))
        return original(self, values, sample_weight=sample_weight)

    return update_state
