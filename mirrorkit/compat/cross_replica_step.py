"""Hand-written training steps outside ``strategy.run`` under mirrorkit's scope.

``mirrorkit run`` enters its strategy's scope for the whole script, so every
Keras model the script builds has mirrored variables. A script with no
strategy of its own that trains by hand -- keras.io's "Writing a training
loop from scratch", the mixed-precision guide: ``GradientTape``, then
``optimizer.apply``/``apply_gradients``, eagerly or in a ``tf.function`` --
runs that step in the strategy's cross-replica context, where upstream fails
or silently changes the math:

``Variable.handle``
    ``tape.gradient(loss, model.trainable_weights)`` asks each Keras variable
    for its ``handle`` (``backprop._handle_or_self``); a mirrored variable has
    one per replica and raises ``ValueError: DistributedVariable.handle is not
    available outside the replica context or a `tf.distribute.Strategy.update()`
    call`` (``values.DistributedVariable.handle``). Reading the variable in that
    context reads the copy on the current device, or the primary one
    (``_get_on_device_or_primary``); the fix returns that copy's handle, so the
    tape differentiates exactly what the forward pass read.

``scale_loss_for_distribution`` / ``unscale_loss_for_distribution``
    Keras divides every reduced loss by the replica count whenever a strategy
    is in scope (``keras.src.losses.loss.scale_loss_for_distribution``), because
    inside ``strategy.run`` the optimizer sums the replicas' gradients. Outside
    ``strategy.run`` nothing is summed: the step computes one gradient, and the
    division makes it N times too small (a plain loop would train N times
    slower under mirrorkit than under ``python``, and log halved losses). The
    fix scales (and unscales) only in a replica context, which is every place
    Keras's own ``fit``/``evaluate`` steps call it from.

``maybe_merge_call`` / ``LossScaleOptimizer._tf_apply``
    the optimizer's update then asks for a ``merge_call`` (``AttributeError:
    'NoneType' object has no attribute 'merge_call'``) or, for a
    ``LossScaleOptimizer``, refuses the cross-replica context (``ValueError:
    apply() must be called in a replica context.``); see below.

With these, such a step runs "on one replica's terms": the forward pass and
the gradient use one copy of the weights, and the optimizer's update
(``distribution.extended.update`` in cross-replica context) applies that
gradient to every copy, so the copies stay identical and the result equals
the plain single-device run. Nothing is distributed in that step; ``fit`` and
``strategy.run`` steps of the same script are unaffected.

:mod:`mirrorkit.compat.registry` registers all these patches as one fix,
``cross-replica-step``.
"""

from __future__ import annotations

from typing import Any, Callable


class _Property(property):
    """A property that can carry mirrorkit's bookkeeping attributes."""


def make_handle(original: Any) -> Any:
    """Wrap the TF-backend ``Variable.handle`` property (``original``) with the fix.

    Example:
        >>> from keras.src.backend.tensorflow.core import Variable   # doctest: +SKIP
        >>> Variable.handle = make_handle(Variable.handle)           # doctest: +SKIP
    """
    getter = original.fget

    def handle(self: Any) -> Any:
        import tensorflow as tf

        value = self.value
        if isinstance(value, tf.distribute.DistributedValues) \
                and tf.distribute.in_cross_replica_context():
            try:
                return getter(self)
            except ValueError:
                # The copy a read in this context returns (see module docstring).
                return value._get_on_device_or_primary().handle
        return getter(self)

    return _Property(handle, original.fset, original.fdel, original.__doc__)


def make_loss_scale(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap ``scale_loss_for_distribution`` / ``unscale_...`` to act in a replica context only.

    Example:
        >>> from keras.src.losses import loss                        # doctest: +SKIP
        >>> scaled = make_loss_scale(loss.scale_loss_for_distribution)  # doctest: +SKIP
    """

    def scale(value: Any) -> Any:
        import tensorflow as tf

        if tf.distribute.in_cross_replica_context():
            # No strategy.run here: no gradient sum across replicas to undo.
            return value
        return original(value)

    return scale


def make_maybe_merge_call(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``tf.__internal__.distribute.interim.maybe_merge_call`` for cross-replica callers.

    Keras's TF optimizer routes its update through ``maybe_merge_call``, which
    for MirroredStrategy calls ``get_replica_context().merge_call(fn)``: in the
    cross-replica context there is no replica context and it fails with
    ``AttributeError: 'NoneType' object has no attribute 'merge_call'``. A
    merge call's ``fn`` runs in the cross-replica context with the strategy,
    which is where such a caller already is, so the fix calls ``fn`` directly.

    Example:
        >>> import tensorflow as tf                                   # doctest: +SKIP
        >>> patched = make_maybe_merge_call(
        ...     tf.__internal__.distribute.interim.maybe_merge_call)  # doctest: +SKIP
    """

    def maybe_merge_call(fn: Callable[..., Any], strategy: Any, *args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        if tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context():
            return fn(strategy, *args, **kwargs)
        return original(fn, strategy, *args, **kwargs)

    return maybe_merge_call


def make_lso_apply(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``LossScaleOptimizer._tf_apply`` for cross-replica callers.

    Upstream raises ``ValueError: apply() must be called in a replica
    context.`` there. Outside ``strategy.run`` the step computed one set of
    gradients, so the fix applies them with Keras's own one-replica logic
    (``_common_apply``: check finiteness, then update or halve the scale).

    Example:
        >>> from keras.src.optimizers.loss_scale_optimizer import LossScaleOptimizer  # doctest: +SKIP
        >>> patched = make_lso_apply(LossScaleOptimizer._tf_apply)    # doctest: +SKIP
    """

    def _tf_apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        import tensorflow as tf

        if tf.distribute.has_strategy() and tf.distribute.in_cross_replica_context():
            return self._common_apply(grads, trainable_variables=trainable_variables)
        return original(self, grads, trainable_variables)

    return _tf_apply
