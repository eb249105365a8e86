"""``steps_per_execution > 1`` under a multi-replica strategy (keras#19246).

Keras 3's ``TensorFlowTrainer._make_function`` runs ``k`` steps per
``tf.function`` call with a ``tf.while_loop`` whose body wraps every step in
``tf.cond(has_value, has_next, no_has_next)``. When the step itself calls
``strategy.run`` over 2+ replicas, that branch function captures per-replica
tensors that the cond never feeds, and the first call fails with
``You must feed a value for placeholder tensor '.../while/cond/Placeholder'``.

The replacement keeps upstream's contract (at most ``k`` steps per call,
stop early when the iterator runs dry, return the last step's logs, raise
``StopIteration`` when there was nothing left) without a ``tf.cond`` around the
step: the first step of a call runs unconditionally (an exhausted iterator
raises ``OutOfRangeError``, which Keras's epoch iterator turns into
``StopIteration``, exactly as with ``steps_per_execution=1``), and the loop
condition, not a cond inside the body, checks whether the next batch exists.

Only multi-replica strategies take this path; one replica keeps Keras's own
code (which works there and supports ``unrolled_steps_per_execution``).

Unlike upstream, the step logs (loss, metrics) are reduced over the replicas
once per call instead of once per step. They are running means held in the
metrics' variables, so the values are the same; across workers each
reduction is a collective, ~2 ms apiece on loopback, paid per log per step.
:mod:`mirrorkit.compat.registry` registers it as the ``multi-step`` fix.
"""

from __future__ import annotations

from typing import Any, Callable

from mirrorkit.strategy_facts import replicas


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``TensorFlowTrainer._make_function`` (``original``) with the fix.

    Example:
        >>> from keras.src.backend.tensorflow import trainer     # doctest: +SKIP
        >>> patched = make(trainer.TensorFlowTrainer._make_function)  # doctest: +SKIP
    """

    def _make_function(self: Any, step_function: Callable[..., Any]) -> Any:
        strategy = self.distribute_strategy
        if self.steps_per_execution <= 1 or self.run_eagerly or replicas(strategy) <= 1:
            return original(self, step_function)
        return _multi_step(self, step_function, strategy)

    return _make_function


def _multi_step(model: Any, step_function: Callable[..., Any], strategy: Any) -> Any:
    import tensorflow as tf
    from keras.src.backend.tensorflow.trainer import reduce_per_replica

    steps = int(model.steps_per_execution)

    def one_step_on_data(data: Any) -> Any:
        # Per-replica logs, not reduced: see multi_step_on_iterator.
        return strategy.run(step_function, args=(data,))

    one_step = tf.function(one_step_on_data, reduce_retracing=True,
                           jit_compile=model.jit_compile)
    # Keras >= 3.9 hands optional (None) inputs through as empty tf Optionals.
    one_step = getattr(model, "_autoconvert_optionals", lambda f: f)(one_step)

    @tf.function(reduce_retracing=True)
    def multi_step_on_iterator(iterator: Any) -> Any:
        outputs = one_step(iterator.get_next())

        def cond(done: Any, _outputs: Any, pending: Any) -> Any:
            return tf.logical_and(done < steps, pending.has_value())

        def body(done: Any, _outputs: Any, pending: Any) -> Any:
            new_outputs = one_step(pending.get_value())
            # Fetch only while another step will run: a call consumes exactly
            # as many batches as it trains on.
            following = tf.cond(done + 1 < steps, iterator.get_next_as_optional,
                                lambda: pending)
            return done + 1, new_outputs, following

        _, outputs, _ = tf.while_loop(
            cond, body, [tf.constant(1), outputs, iterator.get_next_as_optional()])
        # The logs are running means kept in the metrics' variables, so the
        # last step's alone are the call's logs: reduce them once per call.
        # Across workers every reduction is a collective (~2 ms each on
        # loopback), which upstream pays for every log of every step.
        return reduce_per_replica(outputs, strategy, reduction="auto")

    def function(iterator: Any) -> Any:
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            return multi_step_on_iterator(iterator)
        # Keras's own fallback for plain Python iterators of batches.
        outputs = None
        for _, data in zip(range(steps), iterator):
            outputs = one_step(data)
        if outputs is None:
            raise StopIteration
        return reduce_per_replica(outputs, strategy, reduction="auto")

    return function
