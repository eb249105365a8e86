"""Each replica's batch rows during ``strategy.run``, and where they sit in the global batch.

Two fixes need to know, inside a replica's step, how many rows its batch
has and which rows of the global batch they are: ``replica-random`` (a
replica draws its rows of one device's random numbers) and
``uneven-batch-losses`` (a replica's loss weighs its rows as one device
weighs them). :func:`make_run` wraps ``StrategyBase.run`` so that each
replica's call records the rows of the first tensor of its arguments;
:func:`share` gives ``(offset, total)``: on one worker from the row
counts of every replica's batch, taken before ``run`` hands them out; across
workers from one ``all_gather`` of the replicas' row counts, emitted once per
traced step and only when asked for.

Example:
    >>> current() is None        # outside strategy.run
    True
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable

from mirrorkit.strategy_facts import replicas

# This thread's stack of step rows: MirroredStrategy runs each replica's step
# in its own thread, so the rows of one replica are never another's.
_local = threading.local()


@dataclasses.dataclass
class _Rows:
    """The row count of one replica's step, and its share of the global rows per graph."""

    count: Any                    # int32 scalar tensor: this replica's batch rows
    static: int | None            # the same when known at trace time
    graph: Any                    # the step's graph (None when the step runs eagerly)
    counts: Any = None            # every replica's rows, when one worker holds them all

    @property
    def even(self) -> bool:
        """True when every replica surely holds as many rows: a batch size in a traced
        step's static shape (TensorFlow leaves the dimension unknown when the replicas'
        sizes differ; an eager step's shapes are concrete either way)."""
        return self.static is not None and self.graph is not None
    shares: dict = dataclasses.field(default_factory=dict)   # graph -> (offset, total)


def stack() -> list[_Rows]:
    """This thread's rows of the replica steps it is inside, innermost last."""
    if not hasattr(_local, "stack"):
        _local.stack = []
    return _local.stack


def _leading_rows(args: Any, kwargs: Any, counts: Any) -> _Rows | None:
    """The rows of the first tensor of rank >= 1 among a replica's step arguments."""
    import tensorflow as tf

    for leaf in tf.nest.flatten((args, kwargs or {}), expand_composites=False):
        if isinstance(leaf, tf.Tensor) and leaf.shape.rank:
            count = tf.shape(leaf, out_type=tf.int32)[0]
            return _Rows(count, leaf.shape[0], None if tf.executing_eagerly() else count.graph,
                         counts)
    return None


def _local_counts(strategy: Any, args: Any, kwargs: Any) -> tuple[bool, Any]:
    """``(split, counts)`` from the step's arguments, before ``run`` hands them out.

    On one worker every replica's batch is here: ``counts`` are their rows,
    so no collective is needed later. ``split`` is False when the first
    batch-like argument is one tensor every local replica gets whole (there
    is no global batch to take rows of). Across workers ``counts`` is None
    (the others' rows take a collective, made only when needed).
    """
    import tensorflow as tf

    from mirrorkit.strategy_facts import in_multi_worker_mode

    for leaf in tf.nest.flatten((args, kwargs or {}), expand_composites=False):
        if isinstance(leaf, tf.distribute.DistributedValues):
            parts = strategy.experimental_local_results(leaf)
            if not all(isinstance(p, tf.Tensor) and p.shape.rank for p in parts):
                return False, None
            if in_multi_worker_mode(strategy):
                return True, None
            return True, tf.stack([tf.shape(p, out_type=tf.int32)[0] for p in parts])
        if isinstance(leaf, tf.Tensor) and leaf.shape.rank:
            # One worker's replicas would all get this tensor whole.
            return in_multi_worker_mode(strategy), None
    return False, None


def make_run(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``StrategyBase.run`` (``original``): each replica's call knows its batch rows.

    Example:
        >>> from tensorflow.python.distribute import distribute_lib   # doctest: +SKIP
        >>> patched = make_run(distribute_lib.StrategyBase.run)        # doctest: +SKIP
    """

    def run(self: Any, fn: Callable[..., Any], args: Any = (), kwargs: Any = None,
            options: Any = None) -> Any:
        import tensorflow as tf

        # A tf.function given to run eagerly is left to upstream, which runs
        # all replicas in one graph for it (see the module docstring).
        if replicas(self) <= 1 or not isinstance(args, (list, tuple)) \
                or isinstance(fn, tf.types.experimental.GenericFunction):
            return original(self, fn, args, kwargs, options)
        if getattr(fn, "_mirrorkit_rows", False):
            # Another fix's wrapper of run already records the rows.
            return original(self, fn, args, kwargs, options)
        split, counts = _local_counts(self, args, kwargs)
        if not split:
            return original(self, fn, args, kwargs, options)
        from tensorflow.python.autograph.core import ag_ctx
        from tensorflow.python.autograph.impl import api as autograph

        # Convert the step as upstream would, then keep AutoGraph off the wrapper.
        converted = autograph.tf_convert(fn, ag_ctx.control_status_ctx(),
                                         convert_by_default=False)

        @autograph.do_not_convert
        def with_rows(*call_args: Any, **call_kwargs: Any) -> Any:
            rows = _leading_rows(call_args, call_kwargs, counts)
            if rows is None:
                return converted(*call_args, **call_kwargs)
            rows_stack = stack()
            rows_stack.append(rows)
            try:
                return converted(*call_args, **call_kwargs)
            finally:
                rows_stack.pop()

        with_rows._mirrorkit_rows = True
        return original(self, with_rows, args, kwargs, options)

    return run


def _in_cond_branch(graph: Any) -> bool:
    from tensorflow.python.framework import func_graph

    while isinstance(graph, func_graph.FuncGraph):
        if type(graph).__name__ == "CondBranchFuncGraph":
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


def inside(step_graph: Any) -> bool:
    """Is the current graph the step's, or a function or branch traced inside it?

    False inside an XLA-compiled function (``jit_compile=True``): the gather's
    collective is left out of graphs XLA must compile, and the step keeps
    upstream's behaviour. False in Keras's symbolic scope too: a layer
    without ``compute_output_shape`` first called in the step is called on
    symbolic tensors in a scratch graph to infer its output (keras.io's
    SimCLR ``RandomColorAffine``); nothing there runs, and across workers a
    collective there fails ("merge_call called while defining a new graph").
    """
    import tensorflow as tf
    from keras.src.backend.common.symbolic_scope import in_symbolic_scope
    from tensorflow.python.ops import control_flow_util

    if tf.executing_eagerly():
        return step_graph is None
    if in_symbolic_scope():
        return False
    graph = tf.compat.v1.get_default_graph()
    if control_flow_util.GraphOrParentsInXlaContext(graph):
        return False
    while graph is not None:
        if graph is step_graph:
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


def share(rows: _Rows, context: Any) -> tuple[Any, Any]:
    """``(offset, total)``: where this replica's rows start in the global batch, and its size."""
    import tensorflow as tf

    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    if graph in rows.shares:
        return rows.shares[graph]
    replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
    n = context.num_replicas_in_sync
    if rows.counts is not None:
        # One worker: every replica's rows were counted before the step.
        share = (tf.reduce_sum(rows.counts[:replica]), tf.reduce_sum(rows.counts))
    elif rows.even or graph is not None and _in_cond_branch(graph):
        # A batch size in the step's static shape is every replica's: an even
        # split. Inside a branch that replicas may not all take no collective
        # is emitted, and the split is assumed even.
        share = (replica * rows.count, n * rows.count)
    else:
        # One all-reduce of every replica's count in its own slot (float32 is
        # exact for counts below 2**24): one collective, where all_gather
        # takes several (it first gathers the shapes).
        mine = tf.one_hot(replica, n, dtype=tf.float32) * tf.cast(rows.count, tf.float32)
        counts = tf.cast(context.all_reduce(tf.distribute.ReduceOp.SUM, mine), tf.int32)
        share = (tf.reduce_sum(counts[:replica]), tf.reduce_sum(counts))
    rows.shares[graph] = share
    return share


def current() -> _Rows | None:
    """The rows of this thread's innermost replica step, or None outside ``strategy.run``."""
    rows = stack()
    return rows[-1] if rows else None
