"""``tf.data`` input pipelines for data-parallel training.

Under a ``tf.distribute`` strategy the batch a ``tf.data`` pipeline yields is
the *global* batch (see :mod:`mirrorkit.data.batching`). This module
builds pipelines that never hand a replica an empty or short slice
(:func:`train_pipeline`), keeps every example for evaluation
(:func:`eval_pipeline`), and picks the auto-shard policy explicitly
(:func:`~mirrorkit.data.batching.shard_policy`) so multi-worker runs neither read data twice nor warn.

Importing this module does not import TensorFlow.

Example:
    >>> from mirrorkit.data import resolve_batch
    >>> batch = resolve_batch(per_replica_batch=32, replicas=4)
    >>> ds = train_pipeline((x, y), batch=batch, seed=0)     # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from mirrorkit.data.batching import (
    BatchSize,
    check_positive_int,
    current_workers,
    shard_policy,
)
from mirrorkit.errors import UserInputError

logger = logging.getLogger(__name__)

# Default shuffle buffer when the dataset is larger (or of unknown size): big
# enough to mix well, small enough not to hold an image dataset in memory.
_MAX_SHUFFLE_BUFFER = 10_000
# Every worker of a multi-worker DATA-sharded pipeline must shuffle in the same
# order (tf.data keeps every N-th element of a deterministic stream), so an
# unseeded shuffle gets this shared seed there.
_SHARED_SEED = 1234
# The second half of each example's stateless seed (the first is drawn).
_SEED_PAIR = 0


def _as_dataset(tf: Any, data: Any) -> Any:
    if isinstance(data, tf.data.Dataset):
        return data
    if isinstance(data, list):
        # from_tensor_slices would stack a list of arrays into one tensor.
        data = tuple(data)
    try:
        return tf.data.Dataset.from_tensor_slices(data)
    except (TypeError, ValueError) as err:
        raise ValueError(
            "`data` must be a tf.data.Dataset of unbatched examples or a tuple "
            f"(x, y) of arrays with the same first dimension. Received: data of "
            f"type {type(data).__name__} ({str(err).splitlines()[0]})"
        ) from err


def _check_batch(batch: Any) -> BatchSize:
    if not isinstance(batch, BatchSize):
        raise ValueError(
            "`batch` must be a mirrorkit.data.BatchSize, e.g. "
            f"resolve_batch(global_batch=64). Received: batch={batch!r}"
        )
    return batch


def _with_options(tf: Any, ds: Any, policy: str) -> Any:
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(
        tf.data.experimental.AutoShardPolicy, policy)
    return ds.with_options(options)


def _prepare(tf: Any, data: Any, cache: bool | str, num_files: int | None,
             num_workers: int | None) -> tuple[Any, str]:
    ds = _as_dataset(tf, data)
    if num_workers is None:
        num_workers = current_workers()
    policy = shard_policy(from_files=num_files is not None, num_files=num_files,
                          num_workers=num_workers)
    if cache:
        # A string caches to that file prefix; True caches in memory.
        ds = ds.cache(cache) if isinstance(cache, str) else ds.cache()
    return ds, policy


def shuffled(ds: Any, size: int, shuffle_buffer: int | None, seed: int | None) -> Any:
    """``ds`` reshuffled every epoch; the buffer defaults to ``size`` capped at 10,000.

    Example:
        >>> ds = shuffled(ds, size=1437, shuffle_buffer=None, seed=0)   # doctest: +SKIP
    """
    if shuffle_buffer is None:
        shuffle_buffer = min(size, _MAX_SHUFFLE_BUFFER) if size > 0 else _MAX_SHUFFLE_BUFFER
    shuffle_buffer = check_positive_int("shuffle_buffer", shuffle_buffer)
    return ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)


def _map(tf: Any, ds: Any, map_fn: Callable[..., Any] | None, *, training: bool = False,
         seed: int | None = None) -> Any:
    if map_fn is None:
        return ds
    if not callable(map_fn):
        raise ValueError(f"`map_fn` must be callable. Received: map_fn={map_fn!r}")
    train_fn = getattr(map_fn, "train_fn", None) if training else None
    if train_fn is None:
        return ds.map(map_fn, num_parallel_calls=tf.data.AUTOTUNE)
    return seeded_map(ds, seed, lambda example, pair: train_fn(*example, pair))


def seeded_map(ds: Any, seed: int | None, fn: Callable[[Any, Any], Any]) -> Any:
    """``ds.map(fn(example, example_seed))`` with one stateless ``[2]`` seed per example.

    The seeds come from a seeded stream redrawn every epoch: the k-th
    example's random crop depends on (seed, epoch, k) only, not on which
    thread decodes it, so a seeded run repeats (and every worker of a
    DATA-sharded job draws the same crops for the same stream).

    Example:
        >>> import tensorflow as tf
        >>> ds = seeded_map(tf.data.Dataset.range(2), 0, lambda x, pair: pair)
        >>> [tuple(s.shape) for s in ds]
        [(2,), (2,)]
    """
    import tensorflow as tf

    # The map stays deterministic (in-order): out-of-order decoding measured
    # no gain per CPU-second on JPEG folders (benchmarks/RESULTS.md section 11)
    # and would break both the repeatable seeded run and DATA sharding.
    # One int64 per example (not a batch of two: a stage fewer per example),
    # paired with a constant into the [2] seed stateless ops take.
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True)
    pair = tf.constant(_SEED_PAIR, tf.int64)
    return tf.data.Dataset.zip((ds, seeds)).map(
        lambda example, one: fn(example, tf.stack([one, pair])),
        num_parallel_calls=tf.data.AUTOTUNE)


def train_pipeline(
    data: Any,
    *,
    batch: BatchSize,
    seed: int | None = None,
    shuffle: bool = True,
    shuffle_buffer: int | None = None,
    cache: bool | str = False,
    map_fn: Callable[..., Any] | None = None,
    num_workers: int | None = None,
    num_files: int | None = None,
    training: bool | None = None,
) -> Any:
    """Build the training ``tf.data`` pipeline for one process.

    Steps: optional cache -> shuffle (reshuffled every epoch) -> ``map_fn``
    (parallel) -> batch of ``batch.global_batch`` with ``drop_remainder=True``
    -> prefetch. Dropping the last partial batch keeps every replica's slice
    full: a short final batch would give some replica an empty slice (NaN
    weights with BatchNormalization) and unequal slices break the
    "N replicas == one device on the global batch" equivalence.

    Args:
        data: a ``tf.data.Dataset`` of unbatched examples, or a tuple ``(x, y)``
            (or ``(x, y, sample_weight)``) of arrays.
        batch: from :func:`resolve_batch`; the pipeline yields global batches.
        seed: shuffle seed, for a reproducible order. Defaults to None (random);
            under multi-worker DATA sharding a fixed shared seed is used, since
            every worker must produce the same order.
        shuffle: False keeps the input order (e.g. for reproducibility tests).
        shuffle_buffer: examples in the shuffle buffer. Defaults to the dataset
            size when known, capped at 10,000.
        cache: True caches examples in memory before shuffling; a string caches
            to that file prefix. ``map_fn`` runs after the cache, so random
            augmentation stays random every epoch.
        map_fn: per-example function (decode, augment), run in parallel.
        num_workers: training processes. Defaults to the current strategy's.
        num_files: how many files ``data`` reads, when it reads files; enables
            FILE sharding (see :func:`shard_policy`).
        training: use ``map_fn.train_fn`` (random augmentation, e.g. the
            random-resized-crop of :class:`mirrorkit.datasets.jpeg_crops.ImageDecoder`)
            when ``map_fn`` has one, with a per-example seed drawn from
            ``seed``. Defaults to ``shuffle``: an unshuffled pipeline (the
            per-epoch validation) gets the deterministic ``map_fn``.

    Returns:
        A ``tf.data.Dataset`` of global batches, with the auto-shard policy set.

    Raises:
        ValueError: for a bad ``data``, ``batch``, ``map_fn`` or buffer, or a
            dataset with fewer examples than one global batch.

    Example:
        >>> batch = resolve_batch(per_replica_batch=32)   # doctest: +SKIP
        >>> ds = train_pipeline((x_train, y_train), batch=batch, seed=0)  # doctest: +SKIP
        >>> model.fit(ds, epochs=5)                       # doctest: +SKIP
    """
    import tensorflow as tf

    batch = _check_batch(batch)
    ds, policy = _prepare(tf, data, cache, num_files, num_workers)
    size = int(ds.cardinality())
    if 0 <= size < batch.global_batch:
        raise UserInputError(
            f"The training data has fewer examples than one global batch "
            f"({batch.global_batch}), so drop_remainder would leave no batch. "
            f"Received: {size} examples"
        )
    if shuffle:
        if seed is None and policy == "DATA":
            seed = _SHARED_SEED
            logger.info("train_pipeline: DATA sharding needs the same order on every "
                        "worker; shuffling with seed=%d", seed)
        ds = shuffled(ds, size, shuffle_buffer, seed)
    ds = _map(tf, ds, map_fn, training=shuffle if training is None else training, seed=seed)
    ds = ds.batch(batch.global_batch, drop_remainder=True)
    return _with_options(tf, ds.prefetch(tf.data.AUTOTUNE), policy)


def eval_pipeline(
    data: Any,
    *,
    batch: BatchSize,
    cache: bool | str = False,
    map_fn: Callable[..., Any] | None = None,
    num_workers: int | None = None,
    num_files: int | None = None,
) -> Any:
    """Build the evaluation/prediction pipeline: every example, in order.

    Unlike :func:`train_pipeline` nothing is shuffled or dropped; the last
    batch may be partial (Keras handles it in ``evaluate``/``predict``, and no
    weights are updated, so a short slice is harmless).

    Args:
        data: a ``tf.data.Dataset`` of unbatched examples, or a tuple of arrays.
        batch: from :func:`resolve_batch`; batches are ``batch.global_batch``.
        cache: as in :func:`train_pipeline`.
        map_fn: per-example preprocessing, run in parallel.
        num_workers: training processes. Defaults to the current strategy's.
        num_files: as in :func:`train_pipeline`.

    Returns:
        A batched, prefetched ``tf.data.Dataset`` with the auto-shard policy set.

    Example:
        >>> ds = eval_pipeline((x_test, y_test), batch=batch)  # doctest: +SKIP
        >>> model.evaluate(ds)                            # doctest: +SKIP
    """
    import tensorflow as tf

    batch = _check_batch(batch)
    ds, policy = _prepare(tf, data, cache, num_files, num_workers)
    ds = _map(tf, ds, map_fn)
    ds = ds.batch(batch.global_batch, drop_remainder=False)
    return _with_options(tf, ds.prefetch(tf.data.AUTOTUNE), policy)


def distribute_from_function(
    dataset_fn: Callable[[Any], Any],
    *,
    batch: BatchSize,
    num_examples: int,
    strategy: Any | None = None,
) -> tuple[Any, int]:
    """Build one input pipeline per worker with ``distribute_datasets_from_function``.

    ``dataset_fn(input_context)`` runs once per input pipeline (worker). It
    should shard by ``input_context.input_pipeline_id`` when there are several
    and batch with the per-replica size
    ``input_context.get_per_replica_batch_size(batch.global_batch)`` -- the
    strategy then hands consecutive per-replica batches to the replicas. The
    returned dataset is repeated, and the step count is computed from the
    global batch, because Keras reads the per-pipeline cardinality (counted in
    per-replica batches) and would show the wrong number of steps.

    Args:
        dataset_fn: ``fn(tf.distribute.InputContext) -> tf.data.Dataset``.
        batch: from :func:`resolve_batch`; its replicas must match the strategy.
        num_examples: examples in one epoch (over all workers).
        strategy: defaults to the current strategy (see
            :func:`mirrorkit.distribute.scope.current_strategy`).

    Returns:
        ``(distributed_dataset, steps_per_epoch)`` with
        ``steps_per_epoch = num_examples // batch.global_batch``.

    Raises:
        ValueError: for a non-callable ``dataset_fn``, a ``batch`` made for a
            different replica count, or fewer examples than one global batch.

    Example:
        >>> def dataset_fn(ctx):
        ...     per_replica = ctx.get_per_replica_batch_size(batch.global_batch)
        ...     ds = tf.data.Dataset.from_tensor_slices((x, y))
        ...     ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
        ...     return ds.shuffle(1000).batch(per_replica, drop_remainder=True)
        >>> ds, steps = distribute_from_function(dataset_fn, batch=batch,
        ...                                      num_examples=len(x))  # doctest: +SKIP
        >>> model.fit(ds, steps_per_epoch=steps, epochs=5)  # doctest: +SKIP
    """
    if not callable(dataset_fn):
        raise ValueError(f"`dataset_fn` must be callable. Received: dataset_fn={dataset_fn!r}")
    batch = _check_batch(batch)
    num_examples = check_positive_int("num_examples", num_examples)
    if strategy is None:
        from mirrorkit.distribute.scope import current_strategy

        strategy = current_strategy()
    if int(strategy.num_replicas_in_sync) != batch.replicas:
        raise ValueError(
            f"`batch` was resolved for {batch.replicas} replicas but the strategy has "
            f"{strategy.num_replicas_in_sync}. Received: batch={batch!r}"
        )
    steps = num_examples // batch.global_batch
    if steps < 1:
        raise UserInputError(
            f"`num_examples` must be at least one global batch ({batch.global_batch}). "
            f"Received: num_examples={num_examples}"
        )

    def repeated(input_context: Any) -> Any:
        # Keras keeps one iterator across epochs when steps_per_epoch is given,
        # so a finite pipeline would run dry after the first epoch.
        return dataset_fn(input_context).repeat()

    return strategy.distribute_datasets_from_function(repeated), steps
