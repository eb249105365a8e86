"""Behaviour probes of the training fixes, part 2: the shared runner, and the steps Keras traces.

Each probe runs the smallest computation that shows one fix's bug on the
strategy at hand, with the fix itself not applied, and answers as
:mod:`mirrorkit.compat.probes` does: True (the bug showed: its known error,
or a number off one device's by the bug's known factor), False (the strategy
gave one device's behaviour), None (cannot tell here: no strategy, fewer than
2 local replicas, several workers, or an unexpected failure, logged at INFO).
A probe never raises and leaves no trace: models use zero or constant
initialisers on fixed data, and Keras's name counters, Python's and NumPy's
random states and Keras's global ``SeedGenerator`` are put back afterwards,
so a script's names and seeded numbers are the same with or without it.
the fix records name them (``probe=``).

Example:
    >>> import mirrorkit                                          # doctest: +SKIP
    >>> accumulated_gradients(mirrorkit.get_strategy(simulate_cpus=2))  # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from mirrorkit.compat.probes import _local_replicas

logger = logging.getLogger(__name__)

_PLACEHOLDER = "You must feed a value for placeholder tensor"


@contextlib.contextmanager
def _leaves_no_trace() -> Iterator[None]:
    """Keras's name counters, the random states and the global SeedGenerator, as they were.

    Warnings about the probe's own throwaway models (retracing, ``jit_compile``
    turned off) are not the script's: they stay quiet.
    """
    import random
    import warnings

    import numpy as np
    from keras.src.backend.common import global_state
    from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR

    uids = global_state.get_global_attribute("object_name_uids")
    names = dict(uids) if uids is not None else {}
    python_state, numpy_state = random.getstate(), np.random.get_state()
    generator = global_state.get_global_attribute(GLOBAL_SEED_GENERATOR)
    seed_state = None if generator is None else generator.state.numpy()
    tf_logger = logging.getLogger("tensorflow")
    tf_level = tf_logger.level
    tf_logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        tf_logger.setLevel(tf_level)
        now = global_state.get_global_attribute("object_name_uids")
        if now is not None:
            now.clear()
            now.update(names)
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        global_state.set_global_attribute(GLOBAL_SEED_GENERATOR, generator)
        if generator is not None:
            generator.state.assign(seed_state)


def _decide(strategy: Any, markers: tuple[str, ...], body: Callable[..., bool | None],
            *args: Any) -> bool | None:
    """Run ``body(strategy, replicas, *args)`` where a probe can tell; its error is True if known."""
    n = _local_replicas(strategy)
    if n < 2:
        return None
    return answer(markers, body, strategy, n, *args)


def answer(markers: tuple[str, ...], body: Callable[..., bool | None],
           *args: Any) -> bool | None:
    """``body(*args)`` leaving no trace; an error naming one of ``markers`` is True, another None.

    Example:
        >>> answer(("Invalid reduction",), lambda: 1 / 0) is None    # logged, undecided
        True
    """
    try:
        with _leaves_no_trace():
            return body(*args)
    except Exception as err:  # noqa: BLE001 -- a probe reports, it never raises
        text = str(err)
        if any(m in text for m in markers):
            return True
        logger.info("mirrorkit.compat probe %s: unexpected %s (%s); undecided",
                    body.__name__.lstrip("_"), type(err).__name__,
                    text.splitlines()[0] if text else "")
        return None


def _which(what: str, got: Any, one: Any, bug: Any) -> bool | None:
    """False when ``got`` is one device's value, True when it is the bug's, else None."""
    import numpy as np

    got, one, bug = (np.asarray(v, "float64") for v in (got, one, bug))
    if got.shape == one.shape and np.allclose(got, one, rtol=1e-4, atol=1e-6):
        return False
    if got.shape == bug.shape and np.allclose(got, bug, rtol=1e-4, atol=1e-6):
        return True
    logger.info("mirrorkit.compat probe %s: %s, one device %s, the bug %s; undecided",
                what, got.tolist(), one.tolist(), bug.tolist())
    return None


def _data(rows: int) -> tuple[Any, Any]:
    import numpy as np

    return np.ones((rows, 2), "float32"), np.zeros((rows, 1), "float32")


def _dense(strategy: Any, *, compile_args: Callable[[], dict] | dict | None = None) -> Any:
    """A compiled one-unit Dense model (zero kernel) on 2 features, made in ``strategy``'s scope.

    ``compile_args`` (or what it returns, called in the scope) go to ``compile``.
    """
    import keras

    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)),
                                  keras.layers.Dense(1, kernel_initializer="zeros")])
        extra = compile_args() if callable(compile_args) else compile_args
        model.compile(**{"optimizer": "sgd", "loss": "mse", **(extra or {})})
    return model


def _fits(strategy: Any, n: int, compile_args: Callable[[], dict] | dict) -> bool:
    x, y = _data(2 * n)
    _dense(strategy, compile_args=compile_args).fit(x, y, batch_size=2 * n, epochs=1,
                                                     verbose=0, shuffle=False)
    return False


def _rows_metric() -> Any:
    import keras

    class Rows(keras.metrics.Metric):
        """Counts rows; its result is its variable, read summed over the replicas as Keras does."""

        def __init__(self) -> None:
            super().__init__(name="rows")
            self.rows = self.add_variable(shape=(), name="rows", initializer="zeros")

        def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
            self.rows.assign_add(keras.ops.sum(keras.ops.ones_like(y_true[:, 0])))

        def result(self) -> Any:
            return self.rows

    return Rows()


def _on_batch(strategy: Any, n: int, kind: str) -> bool | None:
    x, y = _data(2 * n)
    model = _dense(strategy, compile_args=lambda: {"metrics": [_rows_metric()]})
    if kind == "predict":
        got = len(model.predict_on_batch(x))
    else:
        got = getattr(model, f"{kind}_on_batch")(x, y, return_dict=True)["rows"]
    # Upstream every replica takes the whole batch.
    return _which(f"{kind}-on-batch", got, 2 * n, 2 * n * n)


def predict_on_batch_rows(strategy: Any) -> bool | None:
    """``predict-on-batch``: does ``predict_on_batch`` of 2N rows return N times the rows?

    Example:
        >>> predict_on_batch_rows(None) is None
        True
    """
    return _decide(strategy, (), _on_batch, "predict")


def test_on_batch_counts(strategy: Any) -> bool | None:
    """``test-on-batch``: does ``test_on_batch`` count each of 2N rows N times (a summing metric)?

    Example:
        >>> test_on_batch_counts(None) is None
        True
    """
    return _decide(strategy, (), _on_batch, "test")


def train_on_batch_counts(strategy: Any) -> bool | None:
    """``train-on-batch``: does ``train_on_batch`` count each of 2N rows N times?

    Example:
        >>> train_on_batch_counts(None) is None
        True
    """
    return _decide(strategy, (), _on_batch, "train")


def _variables_in_step(strategy: Any, n: int) -> bool:
    import keras
    import tensorflow as tf

    with strategy.scope():
        # Neither is built: the layer's kernel and the optimizer's variables are
        # made by their first use, inside the trace. Both halves of the bug are
        # needed here: Keras 3.16 makes an optimizer's variables under
        # tf.init_scope (keras-team/keras#23087), so a step whose only new
        # variables are optimizer slots trains there, while a layer's weights
        # first made in the step still fail (with an optimizer applying them).
        layer = keras.layers.Dense(1, kernel_initializer="zeros")
        optimizer = keras.optimizers.SGD(0.1, momentum=0.5)
    batch = strategy.experimental_distribute_values_from_function(lambda _: tf.ones((2, 2)))

    def train(x: Any) -> None:
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(layer(x))
        optimizer.apply(tape.gradient(loss, layer.trainable_variables),
                        layer.trainable_variables)

    @tf.function
    def step(x: Any) -> None:
        # The cond upstream then wraps the step in leaves the replicas' inputs unfed.
        strategy.run(train, args=(x,))

    step(batch)
    return False


def variables_made_in_a_step(strategy: Any) -> bool | None:
    """``step-variables`` (keras#19308): does a step that first builds a layer and optimizer fail?

    Example:
        >>> variables_made_in_a_step(None) is None
        True
    """
    return _decide(strategy, (_PLACEHOLDER,), _variables_in_step)


def accumulated_gradients(strategy: Any) -> bool | None:
    """``gradient-accumulation`` (keras#20582): does ``gradient_accumulation_steps=2`` fail?

    Example:
        >>> accumulated_gradients(None) is None
        True
    """
    return _decide(strategy, ("`merge_call` called while defining a new graph",), _fits,
                   _accumulating)


def _accumulating() -> dict:
    import keras

    return {"optimizer": keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)}


def jit_on_cpu_replicas(strategy: Any) -> bool | None:
    """``xla-cpu-replicas``: does ``jit_compile=True`` fail to compile the step?

    Replicas that are not CPU devices compile and train: False.

    Example:
        >>> jit_on_cpu_replicas(None) is None
        True
    """
    return _decide(strategy, ("Trying to access resource",
                              "Collectives are not yet implemented for CPU devices"),
                   _fits, {"jit_compile": True})


def _seedless(strategy: Any, n: int) -> bool:
    import keras
    import tensorflow as tf

    # tf.function traces twice (variables allowed, then not), each trace in new
    # replica threads: a generator made per thread is a variable on the second.
    def draw() -> Any:
        return keras.random.normal((1,))

    tf.function(lambda: strategy.run(draw))()
    return False


def seedless_draw_in_step(strategy: Any) -> bool | None:
    """``replica-global-seed``: does a seedless ``keras.random`` draw in a traced step fail?

    The draw uses Keras's global SeedGenerator; its state (and Python's,
    which a new generator draws its seed from) is put back afterwards.

    Example:
        >>> seedless_draw_in_step(None) is None
        True
    """
    return _decide(strategy, ("only supports singleton tf.Variables created on the first call",),
                   _seedless)
