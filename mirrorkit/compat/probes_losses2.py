"""Behavioural probes for losses outside compiled ``fit`` steps, and what every loss probe shares.

The probes of custom ``train_step``s (a logged loss, a mean by hand), of a
loss where no gradient is taken, and of the two checks (a loss pairing a
batch's rows, a variable each replica assigns), by the contract of
:mod:`mirrorkit.compat.probes_losses`, which lists every loss probe in its
the fix records (``probe=``). The checks change no number: their probes show the behaviour
they name, which stays with them applied.

Example:
    >>> import mirrorkit                                            # doctest: +SKIP
    >>> hand_mean(mirrorkit.get_strategy(simulate_cpus=2))          # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

from mirrorkit.compat.probes import _local_replicas

__all__ = ["dense_model", "fitted", "guarded", "hand_mean", "logged_step_loss",
           "loss_without_gradient", "on_both", "paired_rows", "variable_copies", "verdict"]

logger = logging.getLogger(__name__)

# How close a ratio must be to 1 (one device) or to the bug's factor.
_RTOL = 1e-3


@contextlib.contextmanager
def _quietly() -> Iterator[None]:
    """Keras's object-name counters kept (``dense_1`` stays the script's next name), and
    TensorFlow's warning about the probes' many traced steps unsaid."""
    from keras.src.backend.common import global_state

    key = "object_name_uids"
    saved = global_state.get_global_attribute(key)
    kept = None if saved is None else saved.copy()
    tf_logger = logging.getLogger("tensorflow")
    level = tf_logger.level
    tf_logger.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        tf_logger.setLevel(level)
        global_state.set_global_attribute(key, kept)


def guarded(name: str) -> Callable[[Callable[[Any, int], bool | None]], Callable[[Any], bool | None]]:
    """Make ``probe(strategy, n)`` a probe: None without 2+ local replicas or on a failure.

    Shared with :mod:`mirrorkit.compat.probes_losses`. ``n`` is the local
    replica count.

    Example:
        >>> guarded("demo")(lambda strategy, n: True)(None) is None
        True
    """
    def wrap(probe: Callable[[Any, int], bool | None]) -> Callable[[Any], bool | None]:
        @functools.wraps(probe)
        def run(strategy: Any) -> bool | None:
            n = _local_replicas(strategy)
            if n < 2:
                return None
            try:
                import tensorflow as tf

                if tf.distribute.has_strategy():
                    # Inside a scope one device's reference cannot be built.
                    logger.info("mirrorkit.compat probe %s: inside a strategy's scope; "
                                "undecided", name)
                    return None
                with _quietly():
                    return probe(strategy, n)
            except Exception as err:  # noqa: BLE001 -- a probe reports, it never raises
                text = str(err)
                logger.info("mirrorkit.compat probe %s: unexpected %s (%s); undecided", name,
                            type(err).__name__, text.splitlines()[0] if text else "")
                return None
        return run
    return wrap


def verdict(name: str, found: float, one: float, factor: float) -> bool | None:
    """True when ``found`` is ``factor`` times one device's ``one``, False when it is ``one``.

    Shared with :mod:`mirrorkit.compat.probes_losses`.

    Example:
        >>> verdict("demo", 2.0, 1.0, 2.0), verdict("demo", 1.0, 1.0, 2.0)
        (True, False)
    """
    if not (math.isfinite(found) and math.isfinite(one)) or one == 0:
        logger.info("mirrorkit.compat probe %s: %r against one device's %r; undecided",
                    name, found, one)
        return None
    ratio = found / one
    if abs(ratio - 1.0) <= _RTOL:
        return False
    if abs(ratio - factor) <= _RTOL * abs(factor):
        return True
    logger.info("mirrorkit.compat probe %s: %.6g times one device's value, not the bug's "
                "%.6g; undecided", name, ratio, factor)
    return None


def on_both(strategy: Any, run: Callable[[], float]) -> tuple[float, float]:
    """``run()`` in ``strategy``'s scope, then in one device's: ``(found, one)``.

    Example:
        >>> found, one = on_both(strategy, lambda: 1.0)             # doctest: +SKIP
    """
    import tensorflow as tf

    with strategy.scope():
        found = run()
    with tf.distribute.get_strategy().scope():
        one = run()
    return found, one


def dense_model(*layers: Any, cls: Any = None, **compile_args: Any) -> Any:
    """``Input((1,))``, a zero ``Dense(1)`` and ``layers``, compiled with SGD(1.0).

    On one device the model runs eagerly: the same arithmetic, without the
    cost of tracing the reference's step.

    Example:
        >>> model = dense_model(loss="mse")                          # doctest: +SKIP
    """
    import keras
    import tensorflow as tf

    model = (cls or keras.Sequential)(
        [keras.Input((1,)), keras.layers.Dense(1, kernel_initializer="zeros", name="probe"),
         *layers], name="mirrorkit_probe")
    model.compile(keras.optimizers.SGD(1.0),
                  run_eagerly=tf.distribute.get_strategy().num_replicas_in_sync == 1,
                  **compile_args)
    return model


def fitted(model: Any, x: Any, y: Any = None, *, log: str | None = None, **fit_args: Any
           ) -> float:
    """The Dense's bias after ``fit`` (one epoch, no shuffling), or the epoch's log ``log``."""
    from keras import ops

    fit_args.setdefault("batch_size", len(x))
    history = model.fit(x, y, epochs=1, verbose=0, shuffle=False, **fit_args)
    if log is not None:
        return float(history.history[log][-1])
    return float(ops.convert_to_numpy(model.get_layer("probe").bias)[0])


def ones(rows: int) -> Any:
    """``rows`` rows of one feature, all 1 (float32)."""
    import numpy as np

    return np.ones((rows, 1), "float32")


def _replicas_mean(strategy: Any, step: Callable[[Any], Any], rows: Any) -> float:
    """The mean over the replicas of ``step`` on each one's equal slice of ``rows``, traced."""
    import tensorflow as tf

    n = strategy.num_replicas_in_sync
    size = len(rows) // n
    sliced = strategy.experimental_distribute_values_from_function(
        lambda ctx: tf.constant(rows[ctx.replica_id_in_sync_group * size:][:size]))
    per_replica = tf.function(lambda v: strategy.run(step, args=(v,)))(sliced)
    return float(strategy.reduce(tf.distribute.ReduceOp.MEAN, per_replica, axis=None))


@guarded("paired-step-losses")
def paired_rows(strategy: Any, n: int) -> bool | None:
    """``paired-step-losses``: does a loss pairing its batch's rows see 1/N of the pairs?

    Each row's summed similarity to every row of its batch, averaged (a
    ``(batch, batch)`` product, as a contrastive loss scores it): on
    constant rows each replica's value is 1/N of one device's. No Keras
    code runs: the check names this behaviour, it does not change it.

    Example:
        >>> paired_rows(None) is None
        True
    """
    import tensorflow as tf

    def pairs(p: Any) -> Any:
        return tf.reduce_mean(tf.reduce_sum(tf.matmul(p, p, transpose_b=True), axis=1))

    rows = ones(2 * n)
    found = _replicas_mean(strategy, pairs, rows)
    return verdict("paired-step-losses", found, float(pairs(tf.constant(rows))), 1 / n)


@guarded("no-gradient-losses")
def loss_without_gradient(strategy: Any, n: int) -> bool | None:
    """``no-gradient-losses``: is a ``Loss`` called where no gradient is taken 1/N?

    Example:
        >>> loss_without_gradient(None) is None
        True
    """
    import keras
    import tensorflow as tf

    loss = keras.losses.MeanSquaredError()
    rows = ones(2 * n)
    found = _replicas_mean(strategy, lambda y: loss(y, tf.zeros_like(y)), rows)
    one = float(loss(rows, tf.zeros_like(rows)))
    return verdict("no-gradient-losses", found, one, 1 / n)


def _step_model(kind: str) -> Any:
    """A model whose ``train_step`` logs a ``Loss``'s value (``"logged"``) or means by hand."""
    import keras
    import tensorflow as tf
    from keras import ops

    class Stepped(keras.Sequential):
        def __init__(self, layers: Any, name: str | None = None) -> None:
            super().__init__(layers, name=name)
            self.loss_fn = keras.losses.MeanSquaredError()
            self.tracker = keras.metrics.Mean(name="loss")

        def train_step(self, data: Any) -> Any:
            x, y = data
            with tf.GradientTape() as tape:
                pred = self(x, training=True)
                loss = self.loss_fn(y, pred) if kind == "logged" else \
                    ops.mean(ops.square(y - pred))
            self.optimizer.apply(tape.gradient(loss, self.trainable_weights),
                                 self.trainable_weights)
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

        @property
        def metrics(self) -> list[Any]:
            return [self.tracker]

    return dense_model(cls=Stepped)


@guarded("logged-step-losses")
def logged_step_loss(strategy: Any, n: int) -> bool | None:
    """``logged-step-losses``: does a custom ``train_step`` log 1/N of a ``Loss``'s value?

    Example:
        >>> logged_step_loss(None) is None
        True
    """
    rows = ones(2 * n)
    found, one = on_both(strategy, lambda: fitted(_step_model("logged"), rows, rows, log="loss"))
    return verdict("logged-step-losses", found, one, 1 / n)


@guarded("hand-mean-gradients")
def hand_mean(strategy: Any, n: int) -> bool | None:
    """``hand-mean-gradients``: does a custom step's ``ops.mean`` loss step N times as far?

    Example:
        >>> hand_mean(None) is None
        True
    """
    rows = ones(2 * n)
    found, one = on_both(strategy, lambda: fitted(_step_model("hand"), rows, rows))
    return verdict("hand-mean-gradients", found, one, n)


@guarded("replica-variable-copies")
def variable_copies(strategy: Any, n: int) -> bool | None:
    """``replica-variable-copies``: do the replicas' copies of an assigned variable differ?

    A ``keras.Variable`` (aggregation "none") assigned in each replica's
    step the sum of its rows 1, 2, ..., 2N: True when each copy holds its
    own slice's sum, False when every copy holds the batch's (one device's
    value, plain math). The check names this, it does not change it.

    Example:
        >>> variable_copies(None) is None
        True
    """
    import keras
    import numpy as np
    from keras import ops

    rows = np.arange(1, 2 * n + 1, dtype="float32").reshape(-1, 1)
    with strategy.scope():
        variable = keras.Variable(0.0, trainable=False, aggregation="none", name="probe_copy")
    _replicas_mean(strategy, lambda r: variable.assign(ops.sum(r)) * 0.0, rows)
    copies = [float(c) for c in strategy.experimental_local_results(variable.value)]
    own = rows.reshape(n, -1).sum(axis=1).tolist()
    if np.allclose(copies, float(rows.sum()), rtol=1e-3):
        return False
    if np.allclose(copies, own, rtol=1e-3):
        return True
    logger.info("mirrorkit.compat probe replica-variable-copies: copies %s, slices' sums %s; "
                "undecided", copies, own)
    return None
