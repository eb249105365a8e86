"""The ``gradient-accumulation`` fix (keras#20582): ``gradient_accumulation_steps`` under a strategy.

Keras 3 accumulates gradients inside ``ops.cond(is_update_step, update,
accumulate)``; both branches synchronise the replicas (``merge_call``), which
``tf.distribute`` forbids inside a control-flow branch: every strategy fails
with "`merge_call` called while defining a new graph or a tf.function".

The fix keeps Keras's semantics and moves the branch to where it is allowed:

1. the replicas' gradients are summed once per micro-batch (Keras's own
   all-reduce, outside any branch), so every replica holds the same sum;
2. accumulated + current gradients, averaged over the K micro-batches and
   clipped, are computed on every micro-batch (cheap element-wise work);
3. one ``merge_call`` updates each variable and its accumulator on every
   device, with the choice "optimizer step or accumulate" made by a
   ``tf.cond`` *per device* inside the update, where no synchronisation
   happens.

So the optimizer steps once per K micro-batches with the mean gradient of the
effective batch (per replica x replicas x K), exactly as one device on that
batch; ``optimizer.iterations`` counts optimizer steps (Keras's floor of
micro-batches / K); the accumulators are optimizer variables, saved and
restored with it, so an accumulation that spans an epoch end or a restart
continues where it stopped. Outside a replica context (no strategy, or
``use_ema=True``, which this fix leaves to Keras), Keras's own code runs.

Example:
    >>> from keras.src.backend.tensorflow.optimizer import TFOptimizer    # doctest: +SKIP
    >>> patched = make(TFOptimizer._backend_apply_gradients)               # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable


def _replica_context() -> Any:
    """The replica context of a real strategy's step, or None (default strategy, cross-replica)."""
    import tensorflow as tf

    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return None
    return tf.distribute.get_replica_context()


def _accumulate(optimizer: Any, context: Any, grads: list[Any], variables: list[Any]) -> None:
    import tensorflow as tf
    from keras.src import backend

    steps = optimizer.gradient_accumulation_steps
    accumulators = [optimizer._accumulated_gradients[optimizer._get_variable_index(v)]
                    for v in variables]
    grads = context.all_reduce(tf.distribute.ReduceOp.SUM, list(grads))
    totals = [tf.cast(tf.convert_to_tensor(g), a.dtype) + a.value for g, a in zip(grads, accumulators)]
    averaged = optimizer._clip_gradients([t / steps for t in totals])
    is_update = tf.equal((optimizer._iterations + 1) % steps, 0)
    learning_rate = optimizer.learning_rate
    tf_variables = [v.value if isinstance(v, backend.Variable) else v for v in variables]

    def step(variable, grad, is_update, learning_rate):
        def update():
            if optimizer.weight_decay is not None and optimizer._use_weight_decay(variable):
                decay = tf.cast(optimizer.weight_decay, variable.dtype)
                variable.assign_sub(variable * decay * tf.cast(learning_rate, variable.dtype))
            optimizer.update_step(grad, variable, learning_rate)
            return tf.constant(True)

        return tf.cond(is_update, update, lambda: tf.constant(False))

    def keep(accumulator, total, is_update):
        return accumulator.assign(tf.where(is_update, tf.zeros_like(total), total))

    def on_every_device(distribution, averaged, totals, is_update, learning_rate):
        for variable, grad in zip(tf_variables, averaged):
            distribution.extended.update(variable, step, args=(grad, is_update, learning_rate),
                                         group=False)
        for accumulator, total in zip(accumulators, totals):
            distribution.extended.update(accumulator.value, keep, args=(total, is_update),
                                         group=False)

    context.merge_call(on_every_device, args=(averaged, totals, is_update, learning_rate))


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``BaseOptimizer._backend_apply_gradients`` (``original``) for TensorFlow optimizers."""

    def _backend_apply_gradients(self, grads, trainable_variables):
        context = _replica_context() if self.gradient_accumulation_steps else None
        if context is None or self.use_ema:
            return original(self, grads, trainable_variables)
        return _accumulate(self, context, list(grads), list(trainable_variables))

    return _backend_apply_gradients
