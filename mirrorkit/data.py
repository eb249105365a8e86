"""Input pipelines for data-parallel training: batch math, sharding, tf.data.

Under a ``tf.distribute`` strategy the batch a ``tf.data`` pipeline yields is
the *global* batch: Keras splits it into ``replicas`` equal per-replica
slices. This module keeps the two numbers straight (:func:`resolve_batch`),
builds pipelines that never hand a replica an empty or short slice
(:func:`train_pipeline`), keeps every example for evaluation
(:func:`eval_pipeline`), and picks the auto-shard policy explicitly
(:func:`shard_policy`) so multi-worker runs neither read data twice nor warn.

Importing this module does not import TensorFlow.

Example:
    >>> batch = resolve_batch(per_replica_batch=32, replicas=4)
    >>> batch.global_batch
    128
    >>> shard_policy(from_files=True, num_files=8, num_workers=2)
    'FILE'
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
from typing import Any, Callable

logger = logging.getLogger(__name__)

# Default shuffle buffer when the dataset is larger (or of unknown size): big
# enough to mix well, small enough not to hold an image dataset in memory.
_MAX_SHUFFLE_BUFFER = 10_000
# Every worker of a multi-worker DATA-sharded pipeline must shuffle in the same
# order (tf.data keeps every N-th element of a deterministic stream), so an
# unseeded shuffle gets this shared seed there.
_SHARED_SEED = 1234
_POLICIES = ("FILE", "DATA", "OFF")
_logged_batches: set[tuple[int, int, int]] = set()


@dataclasses.dataclass(frozen=True)
class BatchSize:
    """The batch of one training step, per replica and in total.

    Attributes:
        per_replica: examples each replica computes on per step.
        global_batch: examples per step over all replicas; what the pipeline
            yields and what the loss is averaged over.
        replicas: replicas in sync (``strategy.num_replicas_in_sync``).

    Example:
        >>> BatchSize(per_replica=16, global_batch=64, replicas=4).global_batch
        64
    """

    per_replica: int
    global_batch: int
    replicas: int


def _check_positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)


def _current_replicas() -> int:
    from mirrorkit.scope import current_strategy

    return int(current_strategy().num_replicas_in_sync)


def _current_workers() -> int:
    from mirrorkit.scope import current_strategy
    from mirrorkit.strategy import describe

    return describe(current_strategy()).workers


def resolve_batch(
    *,
    per_replica_batch: int | None = None,
    global_batch: int | None = None,
    replicas: int | None = None,
) -> BatchSize:
    """Turn a per-replica or a global batch size into both.

    Give exactly one of ``per_replica_batch`` and ``global_batch``.

    Args:
        per_replica_batch: examples per replica per step.
        global_batch: examples per step over all replicas; must be divisible
            by ``replicas`` so every replica gets an equal slice.
        replicas: replicas in sync. Defaults to the current strategy's
            ``num_replicas_in_sync`` (the entered ``strategy.scope()``, else
            the strategy :func:`mirrorkit.get_strategy` created, else 1).

    Returns:
        A :class:`BatchSize`. The resolved numbers are logged once.

    Raises:
        ValueError: when both or neither batch argument is given, a value is
            not a positive integer, or ``global_batch`` is not divisible by
            ``replicas``.

    Example:
        >>> resolve_batch(global_batch=256, replicas=8)
        BatchSize(per_replica=32, global_batch=256, replicas=8)
    """
    if (per_replica_batch is None) == (global_batch is None):
        raise ValueError(
            "Pass exactly one of `per_replica_batch` and `global_batch`. Received: "
            f"per_replica_batch={per_replica_batch!r}, global_batch={global_batch!r}"
        )
    if replicas is None:
        replicas = _current_replicas()
    replicas = _check_positive_int("replicas", replicas)
    if per_replica_batch is not None:
        per_replica = _check_positive_int("per_replica_batch", per_replica_batch)
        total = per_replica * replicas
    else:
        total = _check_positive_int("global_batch", global_batch)
        if total % replicas:
            raise ValueError(
                f"`global_batch` must be divisible by the number of replicas "
                f"({replicas}). Received: global_batch={global_batch}"
            )
        per_replica = total // replicas
    key = (per_replica, total, replicas)
    if key not in _logged_batches:
        _logged_batches.add(key)
        logger.info("batch: %d per replica x %d replicas = %d global", *key)
    return BatchSize(per_replica=per_replica, global_batch=total, replicas=replicas)


def shard_policy(*, from_files: bool, num_files: int | None, num_workers: int) -> str:
    """Choose the ``tf.data`` auto-shard policy for a multi-worker pipeline.

    ``"FILE"`` (each worker reads its own files) needs at least as many files
    as workers; otherwise ``"DATA"`` (each worker reads everything and keeps
    every N-th element). With one worker nothing is sharded: ``"OFF"``.
    Choosing explicitly avoids tf.data's AUTO fallback and its warning.

    Args:
        from_files: True when the dataset reads files (TFRecord, images, ...).
        num_files: how many files; required to choose FILE.
        num_workers: training processes (not replicas).

    Returns:
        ``"FILE"``, ``"DATA"`` or ``"OFF"`` (names of
        ``tf.data.experimental.AutoShardPolicy``).

    Raises:
        ValueError: for ``num_workers`` < 1 or a negative ``num_files``.

    Example:
        >>> shard_policy(from_files=True, num_files=1, num_workers=2)
        'DATA'
        >>> shard_policy(from_files=False, num_files=None, num_workers=1)
        'OFF'
    """
    num_workers = _check_positive_int("num_workers", num_workers)
    if num_files is not None and (isinstance(num_files, bool)
                                  or not isinstance(num_files, numbers.Integral)
                                  or num_files < 0):
        raise ValueError(
            f"`num_files` must be a non-negative integer or None. Received: num_files={num_files!r}"
        )
    if num_workers == 1:
        return "OFF"
    if from_files and num_files is not None and num_files >= num_workers:
        return "FILE"
    return "DATA"


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
        num_workers = _current_workers()
    policy = shard_policy(from_files=num_files is not None, num_files=num_files,
                          num_workers=num_workers)
    if cache:
        # A string caches to that file prefix; True caches in memory.
        ds = ds.cache(cache) if isinstance(cache, str) else ds.cache()
    return ds, policy


def _map(tf: Any, ds: Any, map_fn: Callable[..., Any] | None) -> Any:
    if map_fn is None:
        return ds
    if not callable(map_fn):
        raise ValueError(f"`map_fn` must be callable. Received: map_fn={map_fn!r}")
    return ds.map(map_fn, num_parallel_calls=tf.data.AUTOTUNE)


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
        raise ValueError(
            f"The training data has fewer examples than one global batch "
            f"({batch.global_batch}), so drop_remainder would leave no batch. "
            f"Received: {size} examples"
        )
    if shuffle:
        if shuffle_buffer is None:
            shuffle_buffer = min(size, _MAX_SHUFFLE_BUFFER) if size > 0 else _MAX_SHUFFLE_BUFFER
        shuffle_buffer = _check_positive_int("shuffle_buffer", shuffle_buffer)
        if seed is None and policy == "DATA":
            seed = _SHARED_SEED
            logger.info("train_pipeline: DATA sharding needs the same order on every "
                        "worker; shuffling with seed=%d", seed)
        ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    ds = _map(tf, ds, map_fn)
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
            :func:`mirrorkit.scope.current_strategy`).

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
    num_examples = _check_positive_int("num_examples", num_examples)
    if strategy is None:
        from mirrorkit.scope import current_strategy

        strategy = current_strategy()
    if int(strategy.num_replicas_in_sync) != batch.replicas:
        raise ValueError(
            f"`batch` was resolved for {batch.replicas} replicas but the strategy has "
            f"{strategy.num_replicas_in_sync}. Received: batch={batch!r}"
        )
    steps = num_examples // batch.global_batch
    if steps < 1:
        raise ValueError(
            f"`num_examples` must be at least one global batch ({batch.global_batch}). "
            f"Received: num_examples={num_examples}"
        )

    def repeated(input_context: Any) -> Any:
        # Keras keeps one iterator across epochs when steps_per_epoch is given,
        # so a finite pipeline would run dry after the first epoch.
        return dataset_fn(input_context).repeat()

    return strategy.distribute_datasets_from_function(repeated), steps
