"""Behavioural probes for the loss fixes: does the installed Keras still weigh a loss wrongly?

Each probe runs, on the strategy at hand and on one device (the same model
and batch under the default strategy, outside any scope), the smallest
computation that shows its fix's bug, and compares the two numbers: True when
the strategy's differs from one device's by the bug's own factor (a weight
step N or 1/N times one device's, a logged loss 1/N of it), False when it is
one device's (rel. 1e-3), None when it cannot tell (no strategy, fewer than 2
local replicas, several workers, inside another strategy's scope, any other
number or an unexpected failure, logged at INFO). A probe never raises.

Models are one ``Dense(1)`` with zero initialisers on 1 feature of constant
rows, trained one epoch of SGD (learning rate 1; one step, two for the
uneven split) without shuffling, so a probe never draws from Keras's or
NumPy's random state; Keras's name counters are put back afterwards, so a
script's layers are named as without the probe. Each probe computes only
its own fix's behaviour: it sees its bug with every other fix applied too.
The probes of the steps and variables outside ``fit`` are in
:mod:`mirrorkit.compat.probes_losses2`; each fix's record names its probe (``probe=``).

Example:
    >>> import mirrorkit                                            # doctest: +SKIP
    >>> scalar_loss(mirrorkit.get_strategy(simulate_cpus=2))        # doctest: +SKIP
    True
"""

from __future__ import annotations

from typing import Any

from mirrorkit.compat.probes_losses2 import dense_model, fitted, guarded, on_both, ones, verdict

__all__ = ["add_loss_of_a_loss", "add_loss_sum", "masked_mean",
           "metric_of_the_batch", "overridden_call", "scalar_loss", "uneven_batch"]


def _replicas_mean_factor(strategy: Any, y: Any) -> float:
    """The mean of the replicas' own means of the batch ``y``, over its mean: tf.distribute's
    split of ``y`` (empty replicas count 0, as Keras's weighed mean gives them)."""
    import numpy as np
    import tensorflow as tf

    data = tf.data.Dataset.from_tensor_slices(y).batch(len(y))
    parts = strategy.experimental_local_results(
        next(iter(strategy.experimental_distribute_dataset(data))))
    means = [float(np.mean(p)) if len(p) else 0.0 for p in (np.asarray(p) for p in parts)]
    return float(np.mean(means) / np.mean(y))


@guarded("uneven-batch-losses")
def uneven_batch(strategy: Any, n: int) -> bool | None:
    """``uneven-batch-losses``: does a replica's mean weigh 1/N on an uneven split?

    An even batch of zero targets (no update, and what Keras's own build
    peeks), then ``2n - 1`` rows, whose last target is 1: one device steps
    the bias by 2/(2n-1), Keras by 2/N times the mean of the last row's
    replica (1/N of the mean of the replicas' means, read from
    tf.distribute's split of that batch).

    Example:
        >>> uneven_batch(None) is None
        True
    """
    import numpy as np

    y = np.zeros((4 * n - 1, 1), "float32")
    y[-1] = 1.0
    bug = _replicas_mean_factor(strategy, y[2 * n:])
    found, one = on_both(strategy, lambda: fitted(dense_model(loss="mse"), ones(4 * n - 1), y,
                                                  batch_size=2 * n))
    return verdict("uneven-batch-losses", found, one, bug)


@guarded("layer-losses")
def add_loss_of_a_loss(strategy: Any, n: int) -> bool | None:
    """``layer-losses``: does a ``Loss`` a layer calls for ``add_loss`` train at 1/N?

    Example:
        >>> add_loss_of_a_loss(None) is None
        True
    """
    import keras
    from keras import ops

    class Endpoint(keras.layers.Layer):
        def call(self, x):
            self.add_loss(keras.losses.MeanSquaredError()(ops.ones_like(x), x))
            return x

    found, one = on_both(strategy, lambda: fitted(dense_model(Endpoint(name="endpoint")),
                                                  ones(2 * n)))
    return verdict("layer-losses", found, one, 1 / n)


@guarded("batch-sum-losses")
def add_loss_sum(strategy: Any, n: int) -> bool | None:
    """``batch-sum-losses``: does an ``add_loss`` sum over the batch train at 1/N?

    Example:
        >>> add_loss_sum(None) is None
        True
    """
    import keras
    from keras import ops

    class BatchSum(keras.layers.Layer):
        def call(self, x):
            self.add_loss(ops.sum(x))
            return x

    found, one = on_both(strategy, lambda: fitted(dense_model(BatchSum(name="batch_sum")),
                                                  ones(2 * n)))
    return verdict("batch-sum-losses", found, one, 1 / n)


def _scalar_mse(y_true: Any, y_pred: Any) -> Any:
    from keras import ops

    return ops.mean(ops.square(y_true - y_pred))


@guarded("scalar-losses")
def scalar_loss(strategy: Any, n: int) -> bool | None:
    """``scalar-losses``: does a loss function returning its batch's mean step N times as far?

    Example:
        >>> scalar_loss(None) is None
        True
    """
    found, one = on_both(strategy, lambda: fitted(dense_model(loss=_scalar_mse), ones(2 * n),
                                                  ones(2 * n)))
    return verdict("scalar-losses", found, one, n)


@guarded("overridden-loss-call")
def overridden_call(strategy: Any, n: int) -> bool | None:
    """``overridden-loss-call``: does a ``Loss`` overriding ``__call__`` step N times as far?

    Example:
        >>> overridden_call(None) is None
        True
    """
    import keras

    class CalledLoss(keras.losses.Loss):
        def __call__(self, y_true, y_pred, sample_weight=None):
            return _scalar_mse(y_true, y_pred)

    found, one = on_both(strategy, lambda: fitted(dense_model(loss=CalledLoss(name="called")),
                                                  ones(2 * n), ones(2 * n)))
    return verdict("overridden-loss-call", found, one, n)


@guarded("masked-loss-means")
def masked_mean(strategy: Any, n: int) -> bool | None:
    """``masked-loss-means``: does a weighted mean divide by each replica's own weights?

    The fix's second case, the same mistake as a Keras mask's valid count:
    ``reduction="mean_with_sample_weight"`` on 2 rows per replica, targets
    0 and 1; replica 0 weighs both rows, the others only the second. One
    device steps the bias by 2 * sum(w * y) / sum(w); Keras's bug by the
    mean of the replicas' own quotients.

    Example:
        >>> masked_mean(None) is None
        True
    """
    import keras
    import numpy as np

    y = np.tile(np.array([[0.0], [1.0]], "float32"), (n, 1))
    w = np.tile(np.array([0.0, 1.0], "float32"), n)
    w[0] = 1.0
    wy = (w * y[:, 0]).reshape(n, 2)
    bug = np.mean(wy.sum(1) / w.reshape(n, 2).sum(1)) / (wy.sum() / w.sum())

    def run() -> float:
        loss = keras.losses.MeanSquaredError(reduction="mean_with_sample_weight")
        return fitted(dense_model(loss=loss), ones(2 * n), y, sample_weight=w)

    found, one = on_both(strategy, run)
    return verdict("masked-loss-means", found, one, float(bug))


@guarded("batch-wide-metrics")
def metric_of_the_batch(strategy: Any, n: int) -> bool | None:
    """``batch-wide-metrics``: does a metric function taking its batch's maximum log 1/N of it?

    Targets 0 but the last: one device's maximum is 1, each replica's own
    is 0 but the last one's, and Keras logs their mean, 1/N. (A maximum,
    not a sum: ``logged-step-losses`` logs a sum over the rows N times.)

    Example:
        >>> metric_of_the_batch(None) is None
        True
    """
    import numpy as np
    from keras import ops

    def batch_max(y_true, y_pred):
        return ops.max(y_true)

    y = np.zeros((2 * n, 1), "float32")
    y[-1] = 1.0

    def run() -> float:
        model = dense_model(loss="mse", metrics=[batch_max])
        return float(model.evaluate(ones(2 * n), y, batch_size=2 * n, verbose=0,
                                    return_dict=True)["batch_max"])

    found, one = on_both(strategy, run)
    return verdict("batch-wide-metrics", found, one, 1 / n)


#: Each loss fix's probe, by fix name.
