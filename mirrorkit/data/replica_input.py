"""One host input pipeline per replica, for ``MirroredStrategy`` over CPU devices.

``model.fit(dataset)`` under a strategy splits every global batch with
``experimental_distribute_dataset``: a ``MultiDeviceIterator`` fetches each
replica's slice to its device. On CPU devices there is nothing to fetch (every
"device" is the host's memory), yet that iterator costs about 5% of a small
model's step on 2 cores (benchmarks/RESULTS.md, section 3). Here each replica
instead reads its own pipeline on the host
(``distribute_datasets_from_function`` with ``PER_REPLICA`` replication and
no fetch to device).

The replicas still get exactly the slices tf.distribute would cut from the
one-pipeline global batch: every replica shuffles the same stream with the
same seed and keeps block ``i`` of every ``N`` consecutive blocks of
``per_replica`` examples, so at step ``k`` replica ``i`` holds examples
``k*B + i*b`` to ``k*B + (i+1)*b - 1`` of the stream, as before. The same
images meet in each BatchNormalization slice, and accumulated micro-batches
still stand for the replicas they replace. Each replica takes
``size // global_batch`` batches per epoch, the count the global pipeline
yields, so no replica runs ahead into the next epoch.

It applies only where it is safe and helps: one worker, a ``MirroredStrategy``
whose devices are all CPUs, examples that need no per-example ``map_fn``, a
known dataset size and a fixed seed.
:func:`per_replica_train_input` returns None otherwise, and the caller keeps
the global pipeline (GPUs gain from prefetching to the device; multi-worker
input relies on auto-sharding).

Example:
    >>> ds = per_replica_train_input((x, y), batch=batch, strategy=strategy,
    ...                              seed=0)                      # doctest: +SKIP
    >>> model.fit(ds, steps_per_epoch=steps, epochs=3)            # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

from mirrorkit.data.batching import BatchSize
from mirrorkit.data.pipelines import _as_dataset, _check_batch, shuffled
from mirrorkit.errors import UserInputError


def applies(strategy: Any) -> bool:
    """Whether ``strategy`` is a one-worker ``MirroredStrategy`` on CPU devices only.

    Example:
        >>> import mirrorkit
        >>> applies(mirrorkit.get_strategy("mirrored", simulate_cpus=2))  # doctest: +SKIP
        True
    """
    import tensorflow as tf

    from mirrorkit.distribute.strategy import _strategy_name

    if _strategy_name(strategy) != "mirrored":
        return False
    devices = tuple(strategy.extended.worker_devices)
    return bool(devices) and all(tf.DeviceSpec.from_string(d).device_type == "CPU"
                                 for d in devices)


def per_replica_train_input(
    data: Any,
    *,
    batch: BatchSize,
    strategy: Any,
    seed: int | None,
    map_fn: Callable[..., Any] | None = None,
    shuffle_buffer: int | None = None,
) -> Any | None:
    """An endless distributed training input, one host pipeline per replica (see module docstring).

    Args:
        data: a ``tf.data.Dataset`` of unbatched examples, or a tuple of arrays.
        batch: from :func:`mirrorkit.data.resolve_batch`; its ``replicas``
            must be the strategy's.
        strategy: the strategy ``model.fit`` runs under.
        seed: the shuffle seed every replica shares. None returns None: an
            unseeded shuffle would differ between replicas.
        map_fn: a per-example function (decode, augment) returns None: each
            replica's pipeline would map every example to find its slices,
            while the global pipeline maps each example once.
        shuffle_buffer: as in :func:`mirrorkit.data.train_pipeline`.

    Returns:
        A ``tf.distribute.DistributedDataset`` that repeats forever (end
        epochs with ``steps_per_epoch``), or None when this input does not
        apply (not :func:`applies`, no seed, a ``map_fn``, or a dataset of
        unknown size).

    Raises:
        ValueError: fewer examples than one global batch, or a ``batch``
            for another replica count.

    Example:
        >>> ds = per_replica_train_input((x, y), batch=batch, strategy=s, seed=0)  # doctest: +SKIP
    """
    import tensorflow as tf

    batch = _check_batch(batch)
    if seed is None or map_fn is not None or not applies(strategy):
        return None
    if batch.replicas != strategy.num_replicas_in_sync:
        raise ValueError(
            f"`batch` is for {batch.replicas} replicas but the strategy has "
            f"{strategy.num_replicas_in_sync}. Received: batch={batch!r}")
    source = _as_dataset(tf, data)
    size = int(source.cardinality())
    if size < 0:
        return None
    epoch_batches = size // batch.global_batch
    if epoch_batches == 0:
        raise UserInputError(
            f"The training data has fewer examples than one global batch "
            f"({batch.global_batch}). Received: {size} examples")

    per_replica = batch.per_replica

    def replica_pipeline(context: Any) -> Any:
        count, index = context.num_input_pipelines, context.input_pipeline_id
        # Block i of every N consecutive blocks of per_replica examples: the
        # slice of the global batch this replica would get from tf.distribute.
        ds = shuffled(source, size, shuffle_buffer, seed)
        ds = ds.batch(per_replica, drop_remainder=True).shard(count, index)
        return ds.take(epoch_batches).prefetch(tf.data.AUTOTUNE).repeat()

    options = tf.distribute.InputOptions(
        experimental_fetch_to_device=False,
        experimental_replication_mode=tf.distribute.InputReplicationMode.PER_REPLICA)
    return strategy.distribute_datasets_from_function(replica_pipeline, options=options)
