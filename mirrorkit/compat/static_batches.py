"""The ``static-batch-shapes`` fix: across workers, full batches keep their static size.

In one process a batch of 64 from ``model.fit(x, y, batch_size=64)`` has the
static shape ``(64, ...)`` (Keras's array input yields only full batches when
the data divides by the batch). Under ``MultiWorkerMirroredStrategy``
TensorFlow's ``experimental_distribute_dataset`` turns on partial-batch
handling for every finite dataset, because a worker might run out first and
have to feed empty batches, and with it every batch dimension becomes None.
Code that is right in one process then fails across workers: keras.io's
supervised contrastive loss calls ``ops.squeeze`` on the labels, which on a
``(None,)`` tensor gives a tensor of unknown rank, and ``expand_dims`` raises
"Cannot take the length of shape with unknown rank" on every worker.

A worker can only run out first when the workers read different data: file
sharding (each worker its own files, a different number of batches). When a
dataset is sharded by data (each worker keeps its own slice of every global
batch; Keras's array input asks for it, and ``AUTO`` falls back to it when
nothing reads files) and every global batch has the same static size that
divides by the replicas, every worker yields the same number of full
batches, so the fix turns the partial-batch handling off for that dataset:
each replica sees ``(global_batch / N, ...)``, as under a one-worker
``MirroredStrategy``. Anything else (file sharding, a dataset that reads
files, an unknown batch size, a batch that does not divide) keeps
TensorFlow's handling.

Example:
    >>> reads_files(tf.data.TFRecordDataset(["a.tfrecord"]))         # doctest: +SKIP
    True
"""

from __future__ import annotations

from typing import Any, Callable

# Words in the names of the tf.data reader datasets (ops and classes: TFRecord,
# FixedLengthRecord, ArrayRecord, RecordIO, TextLine, SSTable): what AUTO shards
# by file. Without one, AUTO shards by data, whatever reads files in a map
# (tf.io.read_file behind image_dataset_from_directory).
_READER_WORDS = ("RecordDataset", "RecordIODataset", "TextLineDataset", "SSTableDataset")


def _graph_reads_files(graph: Any) -> bool:
    ops = [op.type for op in graph.get_operations()]
    library = graph.as_graph_def().library.function
    ops += [node.op for function in library for node in function.node_def]
    return any(word in op for op in ops for word in _READER_WORDS)


def reads_files(dataset: Any) -> bool:
    """Whether ``dataset`` (or any function inside it) holds a reader dataset AUTO shards by file.

    Walks the dataset's inputs and the graphs of its map, interleave and
    filter functions. An input it cannot walk counts as reading files.

    Example:
        >>> import tensorflow as tf
        >>> reads_files(tf.data.Dataset.range(8).batch(2))
        False
        >>> reads_files(tf.data.Dataset.from_tensor_slices(["a"]).interleave(
        ...     tf.data.TFRecordDataset))
        True
        >>> reads_files(tf.data.Dataset.from_tensor_slices(["a"]).map(tf.io.read_file))
        False
    """
    seen: set[int] = set()
    stack = [dataset]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if any(word in type(current).__name__ for word in _READER_WORDS):
            return True
        for value in vars(current).values():
            graph = getattr(getattr(value, "function", None), "graph", None)
            if graph is not None and _graph_reads_files(graph):
                return True
        try:
            stack.extend(current._inputs())
        except Exception:  # noqa: BLE001 -- an input we cannot walk may read files
            return True
    return False


def _shards_by_data(dataset: Any) -> bool:
    import tensorflow as tf

    policy = dataset.options().experimental_distribute.auto_shard_policy
    policies = tf.data.experimental.AutoShardPolicy
    if policy in (policies.DATA, policies.OFF):
        return True
    return policy == policies.AUTO and not reads_files(dataset)


def equal_full_batches(built: Any, dataset: Any) -> bool:
    """Whether every worker of ``built`` (a DistributedDataset) yields the same full batches.

    Example:
        >>> equal_full_batches(strategy.experimental_distribute_dataset(ds), ds)  # doctest: +SKIP
        True
    """
    from tensorflow.python.distribute import input_lib

    clones = getattr(built, "_cloned_datasets", None) or []
    return (bool(clones) and input_lib._is_statically_shaped(dataset.element_spec)
            and all(input_lib._is_statically_shaped(c.element_spec) for c in clones)
            and _shards_by_data(dataset))


def make_build(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``DistributedDataset.build`` (``original``): no partial batches where none can come."""

    def build(self: Any, dataset_to_replace: Any = None) -> Any:
        result = original(self, dataset_to_replace)
        dataset = dataset_to_replace or self._original_dataset
        if (self._enable_get_next_as_optional
                and self._strategy.extended._in_multi_worker_mode()
                and equal_full_batches(self, dataset)):
            self._enable_get_next_as_optional = False
        return result

    return build
