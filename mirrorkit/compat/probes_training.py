"""Behaviour probes of the training fixes: does the installed Keras still have each bug here?

One probe per fix of :mod:`mirrorkit.compat.registry` that concerns training
and inference under a strategy (the loss fixes have theirs elsewhere), each
``probe(strategy) -> bool | None`` as in :mod:`mirrorkit.compat.probes`:
True when the bug showed (its known error, or one device's number off by the
bug's known factor), False when the strategy behaved as one device, None when
it cannot tell (no strategy, fewer than 2 local replicas, several workers, or
an unexpected failure, logged at INFO). Each computes its one-device
reference in the same call, never raises and leaves Keras's names and every
global random state as it found them (:mod:`mirrorkit.compat.probes_training2`
holds the shared runner and the probes of traced steps). Each fix's record
names its probe (``probe=``).

Example:
    >>> import mirrorkit                                          # doctest: +SKIP
    >>> batch_logs_average_replicas(mirrorkit.get_strategy(simulate_cpus=2))  # doctest: +SKIP
    True
    >>> batch_logs_average_replicas(None) is None
    True
"""

from __future__ import annotations

import logging
from typing import Any

from mirrorkit.compat.probes_training2 import (
    _data,
    _decide,
    _dense,
    _which,
)

logger = logging.getLogger(__name__)


def _empty_conv(strategy: Any, n: int) -> bool:
    import keras
    import numpy as np

    from mirrorkit.compat import empty_conv

    if not empty_conv._kernel_is_broken():
        return False  # this CPU's kernels shape empty batches right: nothing can show
    with strategy.scope():
        model = keras.Sequential([keras.Input((3, 3, 3)),
                                  keras.layers.Conv2D(2, 3, kernel_initializer="zeros"),
                                  keras.layers.BatchNormalization()])
    # One row: every replica but the first gets an empty batch, which upstream's
    # convolution returns as its 3-channel input, and the normalisation's 2
    # channels do not fit.
    model.predict(np.zeros((1, 3, 3, 3), "float32"), verbose=0)
    return False


def empty_batch_convolution(strategy: Any) -> bool | None:
    """``empty-conv`` (tensorflow#30968): does ``predict`` of one row through a convolution fail?

    Example:
        >>> empty_batch_convolution(None) is None
        True
    """
    return _decide(strategy, ("Incompatible shapes",), _empty_conv)


def _no_call(strategy: Any, n: int) -> bool:
    import keras

    class NoCall(keras.Model):  # keras.io's GAN: its own train_step, no call()
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(1, kernel_initializer="zeros")
            self.dense.build((None, 2))

        def train_step(self, data: Any) -> dict:
            return {"out": keras.ops.mean(self.dense(data[0]))}

    with strategy.scope():
        model = NoCall()
        model.compile()
    x, y = _data(2 * n)
    model.fit(x, y, batch_size=2 * n, epochs=1, verbose=0, shuffle=False)
    return False


def model_without_call(strategy: Any) -> bool | None:
    """``no-call-build``: does ``fit`` of a model without ``call()`` fail to build it?

    Example:
        >>> model_without_call(None) is None
        True
    """
    return _decide(strategy, ("does not have a `call()` method implemented",), _no_call)


def _outside_run(strategy: Any, n: int) -> bool | None:
    import keras
    import tensorflow as tf

    x, y = _data(2)

    def gradient(scoped: Any) -> Any:
        with scoped.scope():
            model = keras.Sequential([keras.Input((2,)),
                                      keras.layers.Dense(1, kernel_initializer="ones")])
            with tf.GradientTape() as tape:
                loss = keras.losses.MeanSquaredError()(y, model(x))
            return tape.gradient(loss, model.trainable_weights)[0].numpy()

    one = gradient(tf.distribute.get_strategy())
    # Past the handle, upstream divides the loss by N where nothing sums the N gradients.
    return _which("cross-replica-step", gradient(strategy), one, one / n)


def step_outside_run(strategy: Any) -> bool | None:
    """``cross-replica-step``: does a GradientTape step outside ``strategy.run`` fail or shrink?

    Example:
        >>> step_outside_run(None) is None
        True
    """
    return _decide(strategy, (("DistributedVariable.handle is not available outside the "
                               "replica context"),), _outside_run)


def _generator_shares(strategy: Any, n: int) -> bool:
    import numpy as np
    import tensorflow as tf

    # TensorFlow wraps an array without a copy only at a 64-byte aligned address.
    raw = np.ones(8 + 16, "float32")
    skip = (-raw.ctypes.data % 64) // 4
    source = raw[skip:skip + 8].reshape(2, 4)
    data = tf.data.Dataset.from_generator(lambda: iter([source]),
                                          output_signature=tf.TensorSpec((2, 4), tf.float32))
    return bool(np.shares_memory(next(iter(data))._numpy(), source))


def generator_arrays_shared(strategy: Any) -> bool | None:
    """``generator-copies``: does a generator's aligned array reach TensorFlow uncopied?

    A training step on 2+ replicas may then write into it (buffer forwarding).

    Example:
        >>> generator_arrays_shared(None) is None
        True
    """
    return _decide(strategy, (), _generator_shares)


def _build_names(strategy: Any, n: int) -> bool | None:
    import tensorflow as tf
    from keras.src.utils import naming

    def advance(scoped: Any) -> int:
        model = _dense(scoped)
        before = naming.get_uid("keras_tensor")
        x, y = _data(2 * n)
        model.fit(x, y, batch_size=2 * n, epochs=1, verbose=0, shuffle=False)
        return naming.get_uid("keras_tensor") - before - 1

    one = advance(tf.distribute.get_strategy())
    got = advance(strategy)
    return None if got < one else got > one


def build_advances_names(strategy: Any) -> bool | None:
    """``symbolic-build-names``: does ``fit`` name more symbolic tensors than one device's?

    Example:
        >>> build_advances_names(None) is None
        True
    """
    return _decide(strategy, (), _build_names)


def _build_order(strategy: Any, n: int) -> bool | None:
    import tensorflow as tf

    x, y = _data(2 * n)
    starts = []

    def generate() -> Any:
        starts.append(1)  # one pass over the input's randomness per start
        yield x, y

    data = tf.data.Dataset.from_generator(generate, output_signature=(
        tf.TensorSpec((None, 2), tf.float32), tf.TensorSpec((None, 1), tf.float32)))

    def passes(scoped: Any) -> int:
        starts.clear()
        _dense(scoped).fit(data, epochs=1, verbose=0, shuffle=False)
        return len(starts)

    one = passes(tf.distribute.get_strategy())
    got = passes(strategy)
    return None if got < one else got > one


def build_peeks_input(strategy: Any) -> bool | None:
    """``symbolic-build-order``: does ``fit`` start its input once more than one device does?

    Example:
        >>> build_peeks_input(None) is None
        True
    """
    return _decide(strategy, (), _build_order)


def _batch_logs(strategy: Any, n: int) -> bool | None:
    import keras
    import numpy as np

    x, y = _data(2 * n)
    y[-1], weights = 2.0, np.ones(2 * n, "float32")
    weights[-1] = 3.0
    logged = []
    model = _dense(strategy, compile_args=lambda: {"weighted_metrics": [
        keras.metrics.MeanSquaredError(name="wmse")]})
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: logged.append(float(logs["wmse"])))
    model.fit(x, y, sample_weight=weights, batch_size=2 * n, epochs=1, verbose=0,
              shuffle=False, callbacks=[record])
    # Outputs are 0: one device logs the weighted mean of y**2; upstream averages the
    # replicas' own means (2 rows each, only the last replica's nonzero: 4*3 / 4).
    return _which("step-metrics", logged[0], 12.0 / float(np.sum(weights)), 3.0 / n)


def batch_logs_average_replicas(strategy: Any) -> bool | None:
    """``step-metrics``: is a weighted metric's batch-end log the replicas' average?

    Example:
        >>> batch_logs_average_replicas(None) is None
        True
    """
    return _decide(strategy, (), _batch_logs)


def _replica_draws(strategy: Any, n: int) -> bool | None:
    import keras
    import numpy as np
    import tensorflow as tf

    rows = 2 * n
    data = tf.data.Dataset.from_tensor_slices(tf.zeros((rows, 2))).batch(rows)
    batch = next(iter(strategy.experimental_distribute_dataset(data)))
    with strategy.scope():
        seed = keras.random.SeedGenerator(7)

    def draw(x: Any) -> Any:
        return keras.random.uniform((tf.shape(x)[0], 3), seed=seed)

    out = tf.function(lambda b: strategy.run(draw, args=(b,)))(batch)
    parts = [t.numpy() for t in strategy.experimental_local_results(out)]
    one = keras.random.uniform((rows, 3), seed=keras.random.SeedGenerator(7)).numpy()
    # Upstream every replica draws replica 0's rows.
    return _which("replica-random", np.concatenate(parts), one, np.concatenate([one[:2]] * n))


def replicas_draw_alike(strategy: Any) -> bool | None:
    """``replica-random``: do the replicas draw the same numbers for their rows (explicit seed)?

    Example:
        >>> replicas_draw_alike(None) is None
        True
    """
    return _decide(strategy, (), _replica_draws)


def _sparse_sums(strategy: Any, n: int) -> bool | None:
    import keras

    class Positions(keras.layers.Layer):  # a position table, looked up the same on every replica
        def build(self, shape: Any) -> None:
            self.table = self.add_weight(shape=(2, 1), initializer="zeros")

        def call(self, x: Any) -> Any:
            rows = keras.ops.take(self.table, keras.ops.arange(2), axis=0)[:, 0]
            return keras.ops.sum(x + rows, axis=1, keepdims=True)

    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), Positions()])
        model.compile(keras.optimizers.Adam(0.1), "mse")
    x, y = _data(2 * n)
    model.fit(x, y, batch_size=2 * n, epochs=1, verbose=0, shuffle=False)
    # Adam's first step moves each entry by its learning rate; upstream squares the
    # N equal parts apart (N * (g/N)**2 for g**2), a step sqrt(N) times as long.
    return _which("sparse-gradient-sums", -model.get_weights()[0] / 0.1, [[1.0]] * 2,
                  [[n ** 0.5]] * 2)


def sparse_gradients_squared_apart(strategy: Any) -> bool | None:
    """``sparse-gradient-sums``: does Adam step a position table sqrt(N) times as far?

    Example:
        >>> sparse_gradients_squared_apart(None) is None
        True
    """
    return _decide(strategy, (), _sparse_sums)

