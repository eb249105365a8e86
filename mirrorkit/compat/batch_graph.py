"""How a value in one replica's step depends on the batch: the graph reader two checks share.

``batch-sum-losses`` (:mod:`mirrorkit.compat.batch_sums`) asks whether an
``add_loss`` value sums over the batch, averages over it or depends on it
in a way no per-replica weighting makes exact; ``paired-step-losses``
(:mod:`mirrorkit.compat.paired_losses`) asks whether a step's loss pairs
the examples of its batch (:func:`row_pairings`). Both read the replica's
graph from the value back to the step's input: each tensor gets a state
(below) from its op's rule and its inputs' states. Rows are assumed
independent until a reduction, as in the rest of tf.distribute
(BatchNormalization aside); the values of collectives (all-gather,
all-reduce) are every replica's, so they are not this replica's rows.

Example:
    >>> Reader(batch=16).state(add_loss_value)            # doctest: +SKIP
    1
    >>> row_pairings(contrastive_loss)                    # doctest: +SKIP
    [<tf.Operation 'MatMul' type=MatMul>]
"""

from __future__ import annotations

from typing import Any

from mirrorkit.compat import replica_loss, step_rows


def mark_global(tensor: Any) -> None:
    """Record ``tensor`` (a graph tensor) as the global batch: every replica's rows, not this one's.

    A batch gathered through ``merge_call`` shows in the graph only as a
    concatenation of the replicas' own rows.

    Example:
        >>> mark_global(gathered)                            # doctest: +SKIP
    """
    replica_loss.note(tensor, replica_loss.GLOBAL)


def mark_rows(tensor: Any) -> None:
    """Record ``tensor`` (a graph tensor) as per-example: its row i depends on example i alone.

    For a value made by an op the reader cannot follow (Keras's ``ctc_loss``
    is a While loop on TensorFlow).

    Example:
        >>> mark_rows(ctc_losses)                            # doctest: +SKIP
    """
    replica_loss.note(tensor, replica_loss.PER_ROW)


def mark_mean(loss: Any) -> None:
    """Record ``loss`` (a graph tensor) as a Keras Loss's mean: it does not scale with the rows.

    Its divisor may be a static shape's product, which the graph does not
    show as the batch size.

    Example:
        >>> mark_mean(loss)                                  # doctest: +SKIP
    """
    replica_loss.note(loss, replica_loss.KERAS_MEAN)


# A tensor's state: independent of the batch, per-row (still carrying the
# batch dimension), the batch shape vector, or a reduced value scaling like
# rows**degree (an int). None: unknown.
INDEP, ROWS, SHAPE = "indep", "rows", "shape"
# An integer or boolean tensor computed from sizes in a way not followed
# (Tensordot's gathered dimensions, a range over the batch): only where it
# shapes a new tensor does it matter, and that tensor is taken as per-row.
SIZES = "sizes"

_SOURCES = ("IteratorGetNext", "IteratorGetNextSync", "MultiDeviceIteratorGetNextFromShard",
            "OptionalGetValue")
_COLLECTIVES = ("Collective", "Nccl")
_LINEAR = {"Identity", "Cast", "Neg", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
           "Snapshot", "EnsureShape"}
_REDUCTIONS = {"Sum": 1, "Mean": 0}
# Gathers whose second input is the ids: (params, indices, ...) and (resource, indices).
_LOOKUPS = {"GatherV2", "Gather", "ResourceGather"}
# A 2-D product of two per-row tensors: (batch, d) x (d, batch) scores every
# pair of examples, (d, batch) x (batch, d) sums outer products over them.
PAIRING = {"MatMul"}
_OTHER_REDUCTIONS = {"Max", "Min", "Prod", "All", "Any", "ArgMax", "ArgMin", "EuclideanNorm"}


def _axes_include_batch(op: Any) -> bool | None:
    import tensorflow as tf

    axes = tf.get_static_value(op.inputs[1])
    rank = op.inputs[0].shape.rank
    if axes is None or rank is None:
        return None
    return any(int(a) % rank == 0 for a in (axes.ravel() if hasattr(axes, "ravel") else [axes]))


class Reader:
    """Each tensor's state in one replica's step graph, memoised.

    ``batch`` is the replica's static batch size (a constant that is a
    multiple of it counts as a batch size), or None; ``means=False`` reads
    inside a Keras Loss's mean instead of taking it as one (0);
    ``global_batch``, when given, is a constant the script divides by to
    average over every replica's rows (plain Python's batch size), so it is
    not this replica's size.

    Example:
        >>> Reader(16).state(add_loss_value)                # doctest: +SKIP
        1
    """

    def __init__(self, batch: int | None, *, means: bool = True,
                 global_batch: int | None = None) -> None:
        self.batch = batch
        self.global_batch = global_batch
        # Whether a Keras Loss's mean is read as one (0) without looking inside.
        self.means = means
        self.states: dict[Any, Any] = {}

    def state(self, tensor: Any) -> Any:
        # Iterative post-order: a model's graph is deeper than Python's recursion limit.
        pending = [tensor]
        while pending:
            top = pending[-1]
            if top.ref() in self.states:
                pending.pop()
                continue
            inputs = self._inputs(top)
            missing = [t for t in inputs if t.ref() not in self.states]
            if missing:
                pending.extend(missing)
                continue
            pending.pop()
            states = [self.states[t.ref()] for t in inputs]
            self.states[top.ref()] = _sized(top, states, self._rule(top, states))
        return self.states[tensor.ref()]

    def _inputs(self, tensor: Any) -> list[Any]:
        if _eager(tensor) or (self.means and _keras_mean(tensor)) \
                or _marked(replica_loss.GLOBAL, tensor) or _marked(replica_loss.PER_ROW, tensor):
            return []
        op = tensor.op
        if op.type == "Placeholder":
            if tensor.dtype.name == "resource":
                return []
            outer = _captured(tensor)
            return [outer] if outer is not None else []
        if op.type.startswith(_COLLECTIVES):
            return []
        if op.type in _SOURCES or op.type in ("Shape", "Size"):
            # What a Shape reads is only whether its input is per-row.
            return list(op.inputs[:1]) if op.type in ("Shape", "Size") else []
        operand = _broadcast_operand(op)
        if operand is not None:
            return [op.inputs[0], operand]
        return list(op.inputs)

    def _rule(self, tensor: Any, states: list[Any]) -> Any:
        import tensorflow as tf

        if _eager(tensor) or _marked(replica_loss.GLOBAL, tensor):
            # A value captured from outside the step, or every replica's rows.
            return INDEP
        if self.means and _keras_mean(tensor):
            return 0
        if _marked(replica_loss.PER_ROW, tensor):
            return ROWS
        op, kind = tensor.op, tensor.op.type
        if kind in _SOURCES:
            return ROWS
        if kind.startswith(_COLLECTIVES):
            # all_gather / all-reduce: the same value on every replica, not this
            # replica's rows (a loss over the gathered batch pairs every row).
            return INDEP
        if kind == "Placeholder":
            if states:
                return states[0]
            # A function argument: data when it has a batch dimension.
            if tensor.dtype == tf.resource or not tensor.shape.rank:
                return INDEP
            return ROWS
        if kind == "Const":
            return 1 if self._batch_size(tensor) else INDEP
        if all(s == INDEP for s in states):
            # tf.shape(x)[0] of a static shape: a slice of a constant vector.
            return 1 if kind == "StridedSlice" and self._batch_size(tensor) else INDEP
        if kind in ("Shape", "Size"):
            if states[0] != ROWS:
                return INDEP
            return SHAPE if kind == "Shape" else 1
        if kind == "StridedSlice" and states[0] == SHAPE:
            begin = tf.get_static_value(op.inputs[1])
            return 1 if begin is not None and begin.size and int(begin.ravel()[0]) == 0 else INDEP
        if _broadcast_operand(op) is not None:
            # A gradient summed back to a broadcast operand's shape: a per-row
            # operand keeps its rows; one broadcast over the batch (a bias, a
            # scale) gets the sum over them.
            if states[0] == ROWS and states[1] in (ROWS, INDEP):
                return ROWS if states[1] == ROWS else 1
            return None
        if kind in _REDUCTIONS or kind in _OTHER_REDUCTIONS:
            if states[0] == ROWS:
                batch_axis = _axes_include_batch(op)
                if batch_axis is False:
                    return ROWS
                return _REDUCTIONS.get(kind) if batch_axis else None
            if isinstance(states[0], int) and kind in _REDUCTIONS:
                return states[0]
            return INDEP if states[0] in (INDEP, 0) and kind in _REDUCTIONS else None
        if kind in _LINEAR:
            return states[0]
        if kind == "Rank":
            return INDEP
        if kind in ("Fill", "BroadcastTo", "ZerosLike", "OnesLike", "Tile"):
            # A tensor shaped like the batch (tf.ones(tf.shape(x)), a mean's
            # gradient tiled back over the rows) is per-row.
            return ROWS if {ROWS, SHAPE, SIZES} & set(states) else None
        if kind == "IdentityN":
            # tf.custom_gradient's pass-through: each output is its input.
            return states[tensor.value_index]
        if tensor.dtype == tf.variant and ROWS in states:
            # A TensorList of per-row tensors (a recurrent layer's loop over the
            # time steps carries each row's state): what it stacks is per-row.
            return ROWS
        if kind in _LOOKUPS and len(states) > 1 and states[1] == ROWS:
            # A table looked up with per-row ids (an Embedding): row i is example i's.
            return ROWS
        floating = [s for s, t in zip(states, op.inputs) if t.dtype.is_floating]
        return _combine(kind, floating or states, tensor.shape.rank)

    def _batch_size(self, tensor: Any) -> bool:
        import tensorflow as tf

        value = _static_index(tensor) if tensor.op.type == "StridedSlice" \
            else tf.get_static_value(tensor)
        # The per-replica batch size (or a size of a batch-shaped tensor)
        # written as a number by a static shape. A constant that only happens
        # to be one is taken for a batch size too: the value is then left as
        # Keras scales it.
        return self.batch is not None and self.batch > 1 and value is not None \
            and value.size == 1 and _batch_multiple(float(value.ravel()[0]), self.batch) \
            and float(value.ravel()[0]) != self.global_batch


def _broadcast_operand(op: Any) -> Any | None:
    """The operand whose shape a gradient's ``Sum`` restores, or None for any other op.

    The gradient of a broadcasting op (``x * mask``, ``x + bias``) with
    shapes known only when the step runs sums the incoming gradient over
    ``BroadcastGradientArgs(shape(a), shape(b))[k]``, the axes operand k was
    broadcast along: which they are follows from that operand alone.
    """
    if op.type != "Sum" or op.inputs[1].op.type != "BroadcastGradientArgs":
        return None
    axes = op.inputs[1]
    shape = axes.op.inputs[axes.value_index]
    return shape.op.inputs[0] if shape.op.type == "Shape" else None


def _static_index(tensor: Any) -> Any:
    """``vector[i]`` of a constant vector and index (``tf.shape(x)[0]`` of a static shape)."""
    import numpy as np
    import tensorflow as tf

    op = tensor.op
    vector, begin = (tf.get_static_value(t) for t in op.inputs[:2])
    if vector is None or begin is None or np.ndim(vector) != 1 or np.size(begin) != 1 \
            or op.get_attr("shrink_axis_mask") != 1:
        return None
    return np.asarray(vector[int(np.ravel(begin)[0])])


def _sized(tensor: Any, states: list[Any], state: Any) -> Any:
    """``state``, or what an unknown state means for a tensor made from sizes.

    Shape arithmetic the rules do not follow (Tensordot's gathered
    dimensions, a range over the batch) gives integer SIZES; a non-scalar
    float made from sizes and batch-independent values only, with no row's
    data in it (a dropout mask, a loop's stacked list, ``Empty``, a draw
    shaped ``tf.shape(x)[:1]``), is shaped like the batch, as ``Fill`` is:
    per-row.
    """
    if state is not None or ROWS in states:
        return state
    if not tensor.dtype.is_floating:
        return SIZES
    sized = any(s in (SIZES, SHAPE) or (isinstance(s, int) and s and not t.dtype.is_floating)
                for s, t in zip(states, tensor.op.inputs))
    if tensor.shape.rank != 0 and sized and all(
            s in (INDEP, SIZES, SHAPE) or isinstance(s, int) for s in states):
        return ROWS
    return None


def _keras_mean(tensor: Any) -> bool:
    return _marked(replica_loss.KERAS_MEAN, tensor)


def _marked(kind: str, tensor: Any) -> bool:
    return not _eager(tensor) and bool(replica_loss.fact(tensor, kind))


def _batch_multiple(value: float, batch: int) -> bool:
    return value >= batch and value.is_integer() and int(value) % batch == 0


def _eager(tensor: Any) -> bool:
    from tensorflow.python.framework import ops

    return isinstance(tensor, ops.EagerTensor)


def _degree(state: Any) -> int | None:
    return 0 if state == INDEP else state if isinstance(state, int) else None


def _combine(kind: str, states: list[Any], rank: int | None) -> Any:
    if any(s is None or s in (SHAPE, SIZES) for s in states):
        return None
    if ROWS in states:
        # Row-wise arithmetic on per-row tensors stays per-row (integer inputs,
        # shapes and indices, are left out by the caller); mixing in a reduced
        # value that scales with the batch couples the rows, and so does a
        # product of two per-row matrices (a similarity matrix pairs them).
        if any(isinstance(s, int) and s != 0 for s in states) or rank == 0 \
                or (kind in PAIRING and states.count(ROWS) == 2):
            return None
        return ROWS
    degrees = [_degree(s) for s in states]
    if kind == "Mul":
        return sum(degrees)
    if kind in ("RealDiv", "Div", "DivNoNan"):
        return degrees[0] - degrees[1]
    if kind in ("AddV2", "Add", "Sub", "AddN"):
        return degrees[0] if len(set(degrees)) == 1 else None
    # Any other function of reduced values: fine when none scales with the rows.
    return 0 if set(degrees) == {0} else None


def _captured(tensor: Any) -> Any:
    """The outer tensor a function graph's placeholder captures, or None."""
    graph = tensor.graph
    for external, internal in getattr(graph, "captures", ()) or ():
        if internal is tensor:
            return external
    return None


def row_pairings(value: Any) -> list[Any]:
    """The products in ``value``'s graph that pair the examples of the step's batch.

    Each is a 2-D ``MatMul`` of two per-row tensors (a contrastive loss's
    similarity matrix, a cross-correlation over the batch): on N replicas
    each replica pairs only its own slice's rows, which no weighting of its
    result makes one device's.

    Example:
        >>> row_pairings(similarity_loss)                  # doctest: +SKIP
        [<tf.Operation 'MatMul' type=MatMul>]
    """
    rows = step_rows.current()
    # Into Keras Losses too: a Loss called on a similarity matrix pairs rows.
    reader = Reader(rows.static if rows is not None else None, means=False)
    reader.state(value)
    pairs = []
    for ref in reader.states:
        op = ref.deref().op
        if op.type in PAIRING and len(op.inputs) == 2 \
                and all(reader.states.get(t.ref()) == ROWS for t in op.inputs) and op not in pairs:
            pairs.append(op)
    return pairs
