"""The ``logged-step-losses`` fix: a custom ``train_step`` that logs its loss logs one device's value.

Inside a training step under N replicas a reduced Keras loss is each
replica's *share* of the global loss (:mod:`mirrorkit.compat.shares`).
Keras's own ``train_step`` multiplies the share back before logging it. A
custom ``train_step`` written as the keras.io guides write it --
``loss = self.compute_loss(y=y, y_pred=y_pred)`` or ``loss = self.loss_fn(y, p)``
inside the tape, then ``self.loss_tracker.update_state(loss)`` -- logs the
share: 1/N of the one-device loss, while training correctly. A step can
also return its losses in its logs, as keras.io's "Knowledge distillation"
does (``{"student_loss": student_loss, "distillation_loss": kl * temperature**2}``):
Keras averages each log over the replicas, which makes a share 1/N of the
global value too.

The fix records the shares where they are made (a ``keras.losses.Loss``
call's reduction, ``Model.compute_loss``, ``tf.nn.compute_average_loss`` and
``tf.nn.scale_regularization_loss``) and, in Keras's step, reads a value
handed to ``keras.metrics.Mean.update_state`` or returned as a log with
:mod:`mirrorkit.compat.loss_parts`: its share parts and its sums over the
replica's rows are logged N times over (the replicas' average is then one
device's value), its means and batch-independent parts as they are, or
on an uneven split weighed by the replica's rows as Keras weighs its own
loss log (``alpha * a + (1 - alpha) * b`` of two shares, ``kl * t**2``, a
share plus a hand-written mean: each part as one device logs it). What Keras's own
``train_step`` hands its loss tracker (``unscale_loss_for_distribution``,
the share times N) is whole already; where ``compute_loss`` is overridden
with a hand-written mean, that multiplication is the logged loss's error
(N times one device's), and the fix unscales only the share parts. Any other
value (a metric's result, a product of two shares) is left as it is; so
is a value outside Keras's step (a custom loop's ``strategy.run``) unless it
is a share itself. ``keras.metrics.Sum`` needs nothing (its cross-replica
sum of the shares is the global loss already). The gradient is untouched.

Example:
    >>> from keras.src.metrics import reduction_metrics             # doctest: +SKIP
    >>> patched = make_update_state(reduction_metrics.Mean.update_state)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from mirrorkit.compat import loss_parts, replica_loss, shares, step_calls
from mirrorkit.compat.failures import failing_loudly
from mirrorkit.compat.no_gradient_losses import gradient_possible

logger = logging.getLogger(__name__)

_LOGGED_N_TIMES = frozenset({loss_parts.SHARE, loss_parts.SUM})
# Only a mean over the replica's own rows: a batch-independent value (a
# regularizer, a metric on the gathered batch) is the same whoever logs it.
_ROW_MEANS = frozenset({loss_parts.MEAN})
# Masked means written by hand: weighed by their denominators' parts.
_RATIOS = frozenset({loss_parts.RATIO})


def make_share(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a function whose rank-0 result is a share by construction: remember it.

    Keras's ``reduce_weighted_values`` (what every ``keras.losses.Loss`` call
    returns), ``tf.nn.compute_average_loss`` (without ``global_batch_size`` it divides
    by the replica's rows times N) and ``tf.nn.scale_regularization_loss``
    (divides by N) return what Keras's own loss scaling returns: a share.

    Example:
        >>> import tensorflow as tf                                   # doctest: +SKIP
        >>> patched = make_share(tf.nn.compute_average_loss)         # doctest: +SKIP
    """

    def share(*args: Any, **kwargs: Any) -> Any:
        return shares.remember(original(*args, **kwargs))

    return share


def make_compute_loss(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``Trainer.compute_loss`` (``original``): remember a share."""

    def compute_loss(self: Any, *args: Any, **kwargs: Any) -> Any:
        return shares.remember(original(self, *args, **kwargs))

    return compute_loss


def _context_to_read(value: Any) -> Any:
    """The replica context when ``value`` is a Keras step's scalar to read, else None."""
    import tensorflow as tf

    if not step_calls.in_keras_step() or not isinstance(value, tf.Tensor) \
            or not hasattr(value, "graph") or not value.dtype.is_floating \
            or value.shape.rank != 0:
        return None
    context = tf.distribute.get_replica_context()
    return context if context is not None and context.num_replicas_in_sync > 1 else None


def whole(value: Any, *, averaged: bool = True) -> Any:
    """``value`` as one device logs it: its share and sum parts N times over.

    ``averaged``: the replicas' values are averaged alike (a ``Mean``, a
    returned log), so on an uneven split a mean over the replica's rows is
    weighed by them (times N over the global rows); False where Keras weighs
    them by rows itself (its loss tracker).

    Example:
        >>> whole(1.0)
        1.0
    """
    n = shares.share_of(value)
    if n:
        from keras import ops

        return ops.multiply(value, ops.cast(n, value.dtype))
    context = _context_to_read(value)
    if context is None or shares.marked(value, "whole"):
        return value
    with failing_loudly("logged-step-losses"):
        parts = loss_parts.reader(context)
        n_times = parts.split(value, _LOGGED_N_TIMES)
        means = parts.split(value, _ROW_MEANS) if averaged else []
        ratios = parts.split(value, _RATIOS)
    out = value
    n = context.num_replicas_in_sync
    if n_times:
        out += (n - 1) * loss_parts.combined(n_times, value.dtype)
    if ratios:
        out += _ratio_terms(parts, ratios, context, value.dtype, averaged=averaged)
    # Only for a mean of the rows: across workers the rows' count may take a
    # collective in the step, which no other log should cost.
    uneven = replica_loss.rows_weight() if means else None
    if uneven is not None:
        import tensorflow as tf

        rows, total = (tf.cast(w, value.dtype) for w in uneven)
        factor = tf.math.divide_no_nan(rows, total)
        out += (factor - 1) * loss_parts.combined(means, value.dtype)
        if len(means) == 1 and means[0][0] is value and not n_times and not ratios:
            # A replica with no rows of the batch (its last, smaller than the replicas)
            # averages nothing: NaN, which would make the epoch's log NaN. One device has
            # no such rows, so it logs nothing (weight 0): the other replicas' weights
            # make up the batch's mean.
            out = tf.where(rows > 0, out, tf.math.multiply_no_nan(value, factor))
    return out


def _ratio_terms(parts: Any, ratios: list, context: Any, dtype: Any, *, averaged: bool) -> Any:
    """What makes each ratio part (a masked mean by hand) log as one device's.

    One device logs the whole batch's sum over the whole batch's denominator.
    Averaged over the replicas, a replica's part of that is its ratio times N
    times its denominator's part; weighed by the rows (Keras's loss tracker),
    times the global rows over its own instead of N.
    """
    import tensorflow as tf

    n = float(context.num_replicas_in_sync)
    rows = None if averaged else replica_loss.rows_weight()
    per_row = 1.0 if rows is None else tf.math.divide_no_nan(
        *(tf.cast(w, tf.float32) for w in rows))
    terms = []
    for part, coef in ratios:
        factor = parts.ratio_weight(part, context) * n / per_row
        terms.append(tf.cast((factor - 1.0) * coef, dtype) * tf.cast(part, dtype))
    return tf.add_n(terms)


def make_update_state(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``keras.metrics.Mean.update_state`` (``original``): log a share as the whole."""

    def update_state(self: Any, values: Any, sample_weight: Any = None) -> Any:
        # A weighted value is Keras's own loss tracker's (already whole) or the
        # script's weighing, which N times over would change: a share only.
        if sample_weight is None or shares.share_of(values):
            values = whole(values)
        return original(self, values, sample_weight=sample_weight)

    return update_state


def make_step_loss(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``Trainer._compute_loss`` (``original``): remember the loss Keras's step logs."""

    def _compute_loss(self: Any, *args: Any, **kwargs: Any) -> Any:
        return shares.mark(original(self, *args, **kwargs), "step")

    return _compute_loss


def make_unscale(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap ``unscale_loss_for_distribution`` (``original``): only the share parts times N.

    Keras's ``train_step`` logs ``unscale(self._compute_loss(...))``; an
    overridden ``compute_loss`` that averages by hand returns no share, which
    Keras would log N times over. Other callers (``layer-losses``) are left
    to Keras's function.
    """

    def unscale(value: Any) -> Any:
        if not gradient_possible() or _context_to_read(value) is None:
            return original(value)
        out = None
        if shares.marked(value, "step") and not shares.share_of(value):
            with failing_loudly("logged-step-losses"):
                kind = loss_parts.reader(_context_to_read(value)).kind(value)
            out = whole(value, averaged=False) if kind != loss_parts.SHARE else None
        # Whole either way: a Loss called in a layer is unscaled by layer-losses
        # here, and is no share when its call returns.
        return shares.mark(original(value) if out is None else out, "whole")

    return unscale


def _logged(call: Callable[[Any], Any], data: Any) -> Any:
    import tensorflow as tf

    return tf.nest.map_structure(whole, call(data))


def make_make_function(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``TensorFlowTrainer._make_function`` (``original``): a step's logged shares, whole.

    Example:
        >>> from keras.src.backend.tensorflow import trainer         # doctest: +SKIP
        >>> patched = make_make_function(trainer.TensorFlowTrainer._make_function)  # doctest: +SKIP
    """

    def _make_function(self: Any, step_function: Callable[..., Any]) -> Any:
        return original(self, step_calls.around(step_function, _logged))

    return _make_function
