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
step: the first batch of a call is fetched unconditionally (an exhausted
iterator raises ``OutOfRangeError``, which Keras's epoch iterator turns into
``StopIteration``, exactly as with ``steps_per_execution=1``), and the loop
condition, not a cond inside the body, checks whether the next batch exists.
Every step runs at the loop's one call site, so the step is traced once.

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
        if self.run_eagerly or replicas(strategy) <= 1:
            return original(self, step_function)
        if self.steps_per_execution <= 1:
            if _one_step_outside_a_function():
                return _one_step(self, step_function, strategy)
            return original(self, step_function)
        return _multi_step(self, step_function, strategy)

    return _make_function


def _one_step_outside_a_function() -> bool:
    """True for Keras 3.16's one-step path, which fetches the batch outside any tf.function.

    Keras 3.16 (its nightlies) runs ``steps_per_execution=1`` as
    ``iterator.get_next_as_optional()`` in Python, then the traced step on
    its value. Under 2+ replicas a replica's empty share of the last batch
    then logs a NaN loss in ``evaluate`` (one image on 2 replicas), and a
    last batch of another size fails the step's shape check (``EnsureShape``).
    Fetching inside the traced function, as Keras 3.15 does, gives one
    device's numbers: so mirrorkit does that there.
    """
    from mirrorkit.patching import targets

    return targets.applies("keras>=3.16.0.dev0")


def _one_step(model: Any, step_function: Callable[..., Any], strategy: Any) -> Any:
    """One step per call, the batch fetched inside the traced function (as Keras 3.15)."""
    import tensorflow as tf

    from mirrorkit.patching import targets

    # Looked up at each trace, as Keras looks it up: the scalar-logs fix replaces it.
    trainer_module = targets.owner("backend-trainer-module")

    # As Keras's own: no autograph conversion, so an error inside the step (a
    # fix's FixFailed, the user's own) reaches the caller as it was raised.
    @tf.autograph.experimental.do_not_convert
    def one_step_on_data(data: Any) -> Any:
        outputs = strategy.run(step_function, args=(data,))
        return trainer_module.reduce_per_replica(outputs, strategy, reduction="auto")

    one_step = tf.function(one_step_on_data, reduce_retracing=True,
                           jit_compile=model.jit_compile)
    one_step = getattr(model, "_autoconvert_optionals", lambda f: f)(one_step)

    @tf.function(reduce_retracing=True)
    @tf.autograph.experimental.do_not_convert
    def one_step_on_iterator(iterator: Any) -> Any:
        # An exhausted iterator raises OutOfRangeError here, which Keras's epoch
        # iterator turns into StopIteration.
        return tf.experimental.Optional.from_value(one_step(iterator.get_next()))

    def function(iterator: Any) -> Any:
        if isinstance(iterator, (tf.data.Iterator, tf.distribute.DistributedIterator)):
            return one_step_on_iterator(iterator).get_value()
        outputs = None
        for data in iterator:
            outputs = one_step(data)
            break
        if outputs is None:
            raise StopIteration
        return outputs

    return function


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
        # An exhausted iterator raises here, as with one step per call.
        first = iterator.get_next()
        following = iterator.get_next_as_optional()
        # Every step of the call runs at one call site, the loop's: a step
        # before the loop would be traced and held in the graph a second time
        # (the first batch has static shapes, the optional's are looser), and
        # the first call would take 2x as long (ResNet-20 on 2 replicas, 3
        # steps per call: 17 s against 7 s). So the first batch enters the
        # loop as an optional with the spec of those the loop fetches.
        current = tf.experimental.Optional.from_value(first)
        spec = looser_spec(current.element_spec, following.element_spec)
        if spec is None:
            return _with_step_before_loop(iterator, first, following)
        # Same tensors, looser static shapes: how Keras's own loop sets the
        # spec of the optional it carries.
        current._element_spec = spec
        no_outputs = tf.experimental.Optional.empty(None)

        def cond(done: Any, _outputs: Any, current: Any, _following: Any) -> Any:
            return tf.logical_and(done < steps, current.has_value())

        def body(done: Any, _outputs: Any, current: Any, following: Any) -> Any:
            outputs = tf.experimental.Optional.from_value(one_step(current.get_value()))
            # Keras's way to carry a step's outputs through the loop: an empty
            # optional whose spec is known once the body has been traced.
            no_outputs._element_spec = outputs.element_spec
            # Fetch only while another step will use it: a call consumes
            # exactly as many batches as it trains on.
            after = tf.cond(done + 2 < steps, iterator.get_next_as_optional,
                            lambda: following)
            return done + 1, outputs, following, after

        _, outputs, _, _ = tf.while_loop(
            cond, body, [tf.constant(0), no_outputs, current, following])
        outputs._element_spec = no_outputs.element_spec
        # The first batch existed, so a step ran. The logs are running means
        # kept in the metrics' variables, so the last step's alone are the
        # call's logs: reduce them once per call. Across workers every
        # reduction is a collective (~2 ms each on loopback), which upstream
        # pays for every log of every step.
        return reduce_per_replica(outputs.get_value(), strategy, reduction="auto")

    def _with_step_before_loop(iterator: Any, first: Any, following: Any) -> Any:
        # Batches the optional does not mirror: the first step runs before
        # the loop (the step traced twice, the same training).
        outputs = one_step(first)

        def cond(done: Any, _outputs: Any, pending: Any) -> Any:
            return tf.logical_and(done < steps, pending.has_value())

        def body(done: Any, _outputs: Any, pending: Any) -> Any:
            new_outputs = one_step(pending.get_value())
            after = tf.cond(done + 1 < steps, iterator.get_next_as_optional,
                            lambda: pending)
            return done + 1, new_outputs, after

        _, outputs, _ = tf.while_loop(cond, body, [tf.constant(1), outputs, following])
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


def looser_spec(static: Any, loose: Any) -> Any:
    """``loose`` if it describes the same tensors as ``static`` with looser shapes, else None.

    Example:
        >>> import tensorflow as tf                                  # doctest: +SKIP
        >>> looser_spec(tf.TensorSpec((8, 3)), tf.TensorSpec((None, 3)))  # doctest: +SKIP
        TensorSpec(shape=(None, 3), dtype=tf.float32, name=None)
    """
    import tensorflow as tf

    try:
        tf.nest.assert_same_structure(static, loose)
        pairs = zip(tf.nest.flatten(static, expand_composites=True),
                    tf.nest.flatten(loose, expand_composites=True), strict=True)
        same = all(a.dtype == b.dtype and a.shape.is_subtype_of(b.shape) for a, b in pairs)
    except (TypeError, ValueError):
        return None
    return loose if same else None
