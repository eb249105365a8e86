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
from the share and handed to a Mean is not recognised and still logs its
share (Keras's own ``train_step`` hands its Mean the share times N, already
whole); ``keras.metrics.Sum`` needs nothing (its cross-replica sum of the
shares is the global loss already).

A step can also return its losses in its logs, as keras.io's "Knowledge
distillation" does (``{"student_loss": student_loss, "distillation_loss":
kl * temperature**2}``): Keras averages each log over the replicas, which
makes a share 1/N of the global value. A log that is a share, or a sum of
shares each times a factor that depends on no share (``alpha * a + (1 -
alpha) * b``, ``kl * t**2``), is logged N times over: its replica average is
then the global value. Any other log (a metric's result, a product of two
shares) is left as it is.

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
        # The share itself only: Keras's own train_step hands its Mean the
        # share times N (unscale_loss_for_distribution), already whole.
        n = share_of(values)
        if n:
            from keras import ops

            values = ops.multiply(values, ops.cast(n, values.dtype))
        return original(self, values, sample_weight=sample_weight)

    return update_state


# Ops through which a log stays a share's multiple: one input carries it.
_SAME = frozenset({"Identity", "Cast", "Neg"})
_TIMES = frozenset({"Mul", "RealDiv", "DivNoNan"})
_SUMS = frozenset({"AddV2", "Add", "Sub", "AddN"})
# How far back a log is followed (the ops between a loss and a log are few).
_MAX_OPS = 200


def _free_of_shares(tensor: Any, seen: set) -> bool:
    stack = [tensor]
    while stack:
        t = stack.pop()
        if share_of(t):
            return False
        if t.op.name in seen:
            continue
        seen.add(t.op.name)
        if len(seen) > _MAX_OPS:
            return False
        stack.extend(t.op.inputs)
    return True


def linear_share(value: Any, _seen: set | None = None) -> int:
    """N when ``value`` is a sum of N-replica loss shares times share-free factors, else 0.

    Example:
        >>> linear_share(2.0)
        0
    """
    n = share_of(value)
    # An eager tensor has no op (hasattr is False): only a share itself counts.
    if n or not hasattr(value, "op") or not hasattr(value, "graph"):
        return n
    op = value.op
    seen = set() if _seen is None else _seen
    if len(seen) > _MAX_OPS:
        return 0
    seen.add(op.name)
    inputs = list(op.inputs)
    if op.type in _SAME and inputs:
        return linear_share(inputs[0], seen)
    if op.type in _TIMES and len(inputs) == 2:
        # A share divides, it is not the divisor.
        carriers = inputs[:1] if op.type != "Mul" else inputs
        for carrier in carriers:
            other = inputs[1] if carrier is inputs[0] else inputs[0]
            n = linear_share(carrier, seen)
            if n and _free_of_shares(other, set()):
                return n
        return 0
    if op.type in _SUMS and inputs:
        found = {linear_share(t, seen) for t in inputs}
        return found.pop() if len(found) == 1 else 0
    return 0


def _whole(value: Any) -> Any:
    n = linear_share(value)
    if not n:
        return value
    from keras import ops

    return ops.multiply(value, ops.cast(n, value.dtype))


def make_make_function(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``TensorFlowTrainer._make_function`` (``original``): a step's logged shares, whole.

    Example:
        >>> from keras.src.backend.tensorflow import trainer         # doctest: +SKIP
        >>> patched = make_make_function(trainer.TensorFlowTrainer._make_function)  # doctest: +SKIP
    """

    def _make_function(self: Any, step_function: Callable[..., Any]) -> Any:
        from tensorflow.python.autograph.core import ag_ctx
        from tensorflow.python.autograph.impl import api as autograph

        @autograph.do_not_convert
        def step(data: Any) -> Any:
            # Converted as strategy.run would have converted the step itself.
            converted = autograph.tf_convert(step_function, ag_ctx.control_status_ctx(),
                                             convert_by_default=False)
            logs = converted(data)
            if not _SHARES:
                return logs
            import tensorflow as tf

            return tf.nest.map_structure(_whole, logs)

        return original(self, step)

    return _make_function

