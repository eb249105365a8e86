"""What each part of a step's loss is to the replicas' sums (``mirrorkit.compat.loss_parts``).

In-process: each loss is traced in a ``tf.function`` whose inputs carry a
batch dimension, as a replica's step does, and read back. ``hand-mean-gradients``
weighs the gradient of the ``mean`` and ``indep`` parts by 1/N and
``logged-step-losses`` logs the ``share`` and ``sum`` parts N times over, so
a wrong kind here is a wrong update or log there (the end-to-end checks are
``tests/compat/test_step_losses.py``).
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.fast


def _read(losses, batch=None, global_batch=None, wanted=None):
    """``{name: kind}`` (or, with ``wanted``, ``{name: [(part op type, coefficient)]}``)."""
    import tensorflow as tf

    from mirrorkit.compat import batch_graph, loss_parts

    kernel = tf.Variable(tf.ones([3, 1]))
    found, coefficients = {}, {}

    @tf.function(input_signature=[tf.TensorSpec([batch, 3]), tf.TensorSpec([batch, 1])])
    def step(x, y):
        parts = loss_parts.Parts(batch_graph.Reader(batch, global_batch=global_batch))
        for name, value in losses(x, y, x @ kernel, kernel).items():
            if wanted is None:
                found[name] = parts.kind(value)
            else:
                split = parts.split(value, wanted)
                found[name] = [part.op.type for part, _ in split]
                coefficients[name] = [tf.cast(coef, tf.float32) for _, coef in split]
        return coefficients

    rows = batch or 4
    values = step(tf.ones([rows, 3]), tf.ones([rows, 1]))
    if wanted is None:
        return found
    return {name: list(zip(found[name], (round(float(c), 6) for c in values[name])))
            for name in found}


def _losses(x, y, pred, kernel):
    from keras import ops

    error = ops.square(pred - y)
    return {
        "mean": ops.mean(error),
        "mean_of_sums": ops.mean(ops.sum(error, axis=1)),
        "sum": ops.sum(error),
        "sum_over_rows": ops.sum(error) / ops.cast(ops.shape(x)[0], "float32"),
        "regularizer": 0.01 * ops.sum(ops.square(kernel)),
        "mean_and_regularizer": ops.mean(error) + 0.01 * ops.sum(ops.square(kernel)),
        "mean_and_sum": ops.mean(error) + ops.sum(error),
        "max": ops.max(error),
    }


def test_means_sums_and_batch_independent_terms_are_told_apart():
    assert _read(_losses) == {
        "mean": "mean", "mean_of_sums": "mean", "sum": "sum", "sum_over_rows": "mean",
        "regularizer": "indep", "mean_and_regularizer": "mean", "mean_and_sum": "mixed",
        # No weighting of a replica's maximum makes one device's.
        "max": "other"}


def test_a_static_batch_size_and_the_global_batch_size_written_as_numbers():
    import tensorflow as tf
    from keras import ops

    def losses(x, y, pred, kernel):
        error = ops.square(pred - y)
        return {"over_replica_rows": ops.sum(error) / 16.0,    # x.shape[0] of the replica
                "over_global_rows": ops.sum(error) / 32.0,     # plain Python's batch size
                "over_static_shape": ops.sum(error) / ops.cast(tf.shape(x)[0], "float32")}

    assert _read(losses, batch=16, global_batch=32) == {
        "over_replica_rows": "mean", "over_global_rows": "sum", "over_static_shape": "mean"}


def test_a_mixed_loss_splits_into_its_parts_with_their_coefficients():
    from keras import ops

    from mirrorkit.compat import loss_parts

    def losses(x, y, pred, kernel):
        error = ops.square(pred - y)
        return {"mixed": 0.5 * (ops.mean(error) - ops.sum(error) / 4.0)}

    # Split at the factor and the subtraction: each largest part of one kind.
    means = _read(losses, wanted=frozenset({loss_parts.MEAN}))["mixed"]
    sums = _read(losses, wanted=frozenset({loss_parts.SUM}))["mixed"]
    assert means == [("Mean", 0.5)]
    assert sums == [("RealDiv", -0.5)]


def test_a_mask_sum_divided_by_the_mask_count_is_a_ratio_not_a_mean():
    from keras import ops

    def losses(x, y, pred, kernel):
        error = ops.square(pred - y)
        mask = ops.cast(ops.greater(y, 0.5), "float32")
        return {"masked_mean": ops.sum(error * mask) / ops.sum(mask),
                "masked_mean_no_nan": ops.divide_no_nan(ops.sum(error * mask), ops.sum(mask)),
                "masked_mean_epsilon": ops.sum(error * mask) / (ops.sum(mask) + 1e-8),
                # Over the batch size it stays a mean (no collective needed).
                "over_rows": ops.sum(error * mask) / ops.cast(ops.shape(x)[0], "float32"),
                "ratio_and_regularizer": ops.sum(error * mask) / ops.sum(mask)
                + 0.01 * ops.sum(ops.square(kernel))}

    assert _read(losses) == {"masked_mean": "ratio", "masked_mean_no_nan": "ratio",
                             "masked_mean_epsilon": "ratio", "over_rows": "mean",
                             "ratio_and_regularizer": "mixed"}


def test_embedding_lookups_and_recurrent_layers_keep_their_rows():
    # An Embedding's output is per-row (its ids are), and so is an LSTM's loop
    # over the time steps: a sum over them is a sum, not a mean.
    import keras
    import tensorflow as tf
    from keras import layers, ops

    from mirrorkit.compat import batch_graph, loss_parts

    embed = layers.Embedding(30, 4)
    lstm = layers.LSTM(4, return_sequences=True)
    found = {}

    @tf.function(input_signature=[tf.TensorSpec([None, 5], tf.int32)])
    def step(ids):
        parts = loss_parts.Parts(batch_graph.Reader(None))
        looked_up = embed(ids)
        found["lookup"] = parts.reader.state(looked_up)
        found["sum"] = parts.kind(ops.sum(lstm(looked_up)))
        found["mean"] = parts.kind(ops.mean(ops.sum(lstm(looked_up), axis=(1, 2))))
        return looked_up

    step(tf.ones([4, 5], tf.int32))
    assert found == {"lookup": batch_graph.ROWS, "sum": "sum", "mean": "mean"}
    assert keras.backend.backend() == "tensorflow"


def test_a_gradient_penalty_and_a_means_gradient_keep_their_rows():
    # keras.io's WGAN-GP: the gradient of a critic with a dropout, taken with
    # respect to its per-row input, sums over broadcast axes found only when
    # the step runs (BroadcastGradientArgs); a sum's gradient is tiled back
    # over the rows; tf.custom_gradient passes its inputs through IdentityN; a
    # draw shaped like tf.shape(x)[:1] is per-row.
    import tensorflow as tf
    from keras import ops

    from mirrorkit.compat import batch_graph, loss_parts

    kernel = tf.Variable(tf.ones([3, 2]))
    found = {}

    @tf.custom_gradient
    def through(v, total):
        # In a graph, IdentityN(output, v, total): each output is its input.
        return tf.identity(v), lambda dy: (dy, tf.zeros_like(total))

    @tf.function(input_signature=[tf.TensorSpec([None, 3])])
    def step(x):
        parts = loss_parts.Parts(batch_graph.Reader(None))
        keep = tf.cast(tf.random.uniform(tf.shape(x)[:1])[:, None] > 0.3, tf.float32)
        with tf.GradientTape() as tape:
            tape.watch(x)
            critic = tf.reduce_sum(through(x * keep, tf.reduce_sum(x)) @ kernel, axis=1)
        grads = tape.gradient(critic, x)
        penalty = ops.mean((ops.sqrt(ops.sum(ops.square(grads), axis=1) + 1e-12) - 1.0) ** 2)
        with tf.GradientTape() as tape:
            tape.watch(x)
            total = tf.reduce_sum(x @ kernel)
        found["penalty"] = parts.kind(penalty)
        found["sum_gradient"] = parts.reader.state(tape.gradient(total, x))
        found["critic_loss"] = parts.kind(ops.mean(critic) - ops.mean(critic * 2.0)
                                          + 10.0 * penalty)
        return penalty

    step(tf.ones([4, 3]))
    assert found == {"penalty": "mean", "sum_gradient": batch_graph.ROWS,
                     "critic_loss": "mean"}
