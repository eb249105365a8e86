"""The ``step-metrics`` fix: the logs of each batch are the global batch's, as on one device.

Keras's ``train_step``/``test_step`` end with ``get_metrics_result()``, read
inside each replica: every metric's result over that replica's slice of the
batch. ``reduce_per_replica`` then averages those results. For a metric that
is a ratio of sums -- a weighted metric, or any metric when the replicas'
slices differ in size (a global batch of 33: 17 and 16) -- the average of
the replicas' ratios is not the global batch's ratio, so every batch-end log
(the progress bar during an epoch, ``on_train_batch_end`` callbacks,
``TensorBoard(update_freq=...)``) differs from one device's, loss included
(batch 33 on 2 replicas: loss 0.77835 vs 0.77735, weighted accuracy 0.46046
vs 0.46154). Epoch-end logs are read across the replicas and were right.

The fix reads the results once for all replicas (a ``merge_call``: the
metric variables summed over every replica, as at the epoch's end), so each
replica returns the global values and their average is that value. Custom
steps that build their logs from ``metric.result()`` themselves are left
alone. Across workers (``MultiWorkerMirroredStrategy`` in multi-worker
mode) it stays off: there every such read is a collective per metric
variable per step, which would also tie the workers' step times together
and hide a straggler from mirrorkit's per-worker monitoring; batch-end logs
there remain the replicas' average (epoch logs are exact).

Example:
    >>> from keras.src.trainers.trainer import Trainer             # doctest: +SKIP
    >>> patched = make(Trainer.get_metrics_result)                 # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

from mirrorkit.strategy_facts import in_multi_worker_mode


def make(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap ``Trainer.get_metrics_result`` (``original``) with the fix."""

    def get_metrics_result(self: Any) -> Any:
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if not tf.distribute.has_strategy() or context is None \
                or context.num_replicas_in_sync <= 1 \
                or in_multi_worker_mode(tf.distribute.get_strategy()):
            return original(self)
        # In the merge call the metric variables read as their sum over replicas.
        return context.merge_call(lambda _strategy: original(self))

    return get_metrics_result
