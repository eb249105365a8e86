"""``predict_on_batch`` / ``test_on_batch`` / ``train_on_batch`` under 2+ replicas.

Keras 3's TensorFlow trainer hands the batch of these three methods to
``strategy.run`` as plain tensors (``TensorFlowTrainer.predict_on_batch``:
``self.predict_function([(x,)])``; ``train_on_batch``/``test_on_batch``: a
generator yielding ``(x, y, sample_weight)``). ``strategy.run`` gives a plain
tensor to every replica whole, so each replica computes the whole batch:

* ``predict_on_batch`` concatenates the replicas' outputs: 32 images on 2
  replicas return 64 rows (each row twice), silently, under any
  ``MirroredStrategy`` / ``MultiWorkerMirroredStrategy`` with 2+ replicas;
* ``test_on_batch``/``train_on_batch`` count every example once per replica
  (a metric returning a sum, such as true positives, is N times too large)
  and do N times the work.

The fix splits the batch across the replicas the way ``fit``/``predict``
do (contiguous slices in replica order), as distributed values, before
Keras's own method runs. ``predict_on_batch`` always splits (slice sizes may
differ by one; Keras's ``concat`` reduction returns exactly one device's
rows, in order). ``test_on_batch``/``train_on_batch`` split only when the
result is then exactly one device's: the batch divides evenly over the
replicas (their logs are means of per-replica means) and, for training, no
``BatchNormalization`` computes per-replica batch statistics
(``synchronized=False``). Otherwise Keras's behaviour stays: the whole batch
on every replica gives one device's loss and weights (the loss is scaled by
1/N and the N gradients summed), only a metric that sums (true positives)
reads N times too large. Under ``MultiWorkerMirroredStrategy`` every worker
passes the same batch and takes the slices of its own replicas. A batch that
cannot be sliced (ragged, sparse, Python lists) keeps Keras's behaviour. :mod:`mirrorkit.compat.registry`
registers the three fixes as ``predict-on-batch``, ``test-on-batch`` and
``train-on-batch``.

Example:
    >>> from mirrorkit import compat
    >>> compat.apply()["predict-on-batch"]                   # doctest: +SKIP
    'applied'
"""

from __future__ import annotations

from typing import Any, Callable

from mirrorkit.strategy_facts import replicas


def _splittable(value: Any) -> bool:
    import numpy as np
    import tensorflow as tf

    if value is None:
        return True
    if isinstance(value, np.ndarray):
        return value.ndim > 0
    return isinstance(value, tf.Tensor) and value.shape.rank not in (None, 0)


def _rows(data: Any) -> int | None:
    from keras.src import tree

    leaves = [v for v in tree.flatten(data) if v is not None]
    if not leaves or not all(_splittable(v) for v in leaves):
        return None
    sizes = {int(v.shape[0]) if v.shape[0] is not None else -1 for v in leaves}
    return sizes.pop() if len(sizes) == 1 and -1 not in sizes else None


def distribute_batch(strategy: Any, data: Any, *, exact: bool) -> Any | None:
    """Split one batch (a structure of arrays/tensors) across ``strategy``'s replicas.

    Returns:
        The same structure of distributed values (replica ``i`` holds the
        ``i``-th contiguous slice), or None when the batch cannot be split
        (not sliceable, or, with ``exact``, rows that do not divide evenly
        over the replicas).

    Example:
        >>> distribute_batch(strategy, (x, y, None), exact=True)  # doctest: +SKIP
    """
    import tensorflow as tf
    from keras.src import tree

    n = _rows(data)
    count = replicas(strategy)
    if n is None or (exact and n % count):
        return None
    base, extra = divmod(n, count)

    def piece(context: Any) -> Any:
        i = context.replica_id_in_sync_group
        start = i * base + min(i, extra)
        stop = start + base + (1 if i < extra else 0)
        return tree.map_structure(
            lambda v: None if v is None else tf.convert_to_tensor(v[start:stop]), data)

    return strategy.experimental_distribute_values_from_function(piece)


def _batch_statistics(model: Any) -> bool:
    """True when a layer trains on per-replica batch statistics (unsynchronized BN)."""
    import keras

    return any(isinstance(layer, keras.layers.BatchNormalization)
               and not getattr(layer, "synchronized", False) and layer.trainable
               for layer in model._flatten_layers())


def _needs_split(model: Any) -> Any:
    strategy = getattr(model, "_distribute_strategy", None)
    if strategy is None or replicas(strategy) <= 1 or model.run_eagerly:
        return None
    return strategy


def make_predict(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``TensorFlowTrainer.predict_on_batch``.

    Example:
        >>> patched = make_predict(TensorFlowTrainer.predict_on_batch)  # doctest: +SKIP
    """

    def predict_on_batch(self: Any, x: Any) -> Any:
        strategy = _needs_split(self)
        split = None if strategy is None else distribute_batch(strategy, x, exact=False)
        return original(self, x if split is None else split)

    return predict_on_batch


def _make_supervised(original: Callable[..., Any], train: bool) -> Callable[..., Any]:
    def on_batch(self: Any, x: Any, y: Any = None, sample_weight: Any = None,
                 *args: Any, **kwargs: Any) -> Any:
        strategy = _needs_split(self)
        if strategy is None:
            return original(self, x, y, sample_weight, *args, **kwargs)
        if train:
            class_weight = kwargs.pop("class_weight", args[0] if args else None)
            args = args[1:]
            if class_weight is not None and sample_weight is None:
                # Keras's own conversion, on the whole batch, before splitting.
                from keras.src.trainers.data_adapters import data_adapter_utils

                sample_weight = data_adapter_utils.class_weight_to_sample_weights(
                    y, class_weight)
            elif class_weight is not None:
                return original(self, x, y, sample_weight, class_weight, *args, **kwargs)
        split = None
        if not (train and _batch_statistics(self)):
            split = distribute_batch(strategy, (x, y, sample_weight), exact=True)
        if split is None:
            return original(self, x, y, sample_weight, *args, **kwargs)
        # Build on the plain batch (shapes only), as Keras would.
        self._maybe_symbolic_build(data_batch=(x, y, sample_weight))
        return original(self, *split, *args, **kwargs)

    return on_batch


def make_test(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``TensorFlowTrainer.test_on_batch``."""
    return _make_supervised(original, train=False)


def make_train(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``TensorFlowTrainer.train_on_batch``."""
    return _make_supervised(original, train=True)
