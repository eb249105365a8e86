"""What each part of a step's loss is to the replicas' sums: the reader two fixes share.

Under N replicas the optimizer sums the replicas' gradients and a
``keras.metrics.Mean`` (or a step's returned log) averages the replicas'
values. Whether that gives one device's number depends on what the value
is, read from its graph back through its scalar arithmetic:

``share``
    A Keras loss divided by N (:mod:`mirrorkit.compat.shares`): gradients
    add up to one device's; a log is 1/N of it.
``sum``
    A sum over the replica's rows (``ops.sum``, or divided by the global
    batch size written as a number): gradients add up; a log is 1/N.
``mean`` / ``indep``
    A mean over the replica's rows, or a value that does not depend on the
    batch (a regularizer): each replica's is an estimate of the whole, so
    the gradients add up to N times one device's; a log is right.
``ratio``
    A sum over the replica's rows divided by another such sum (a masked mean
    written by hand: ``reduce_sum(loss * mask) / reduce_sum(mask)``, keras.io's
    image captioning): one device divides by the whole batch's sum, so a
    replica's part of it is its denominator over the replicas' total.
``mixed``
    A sum of parts of different kinds, split along additions and factors
    that depend on no share and not on the batch.
``other``
    Anything else (a maximum over the batch, a product of two means):
    no weighting of it is known to be exact.

``hand-mean-gradients`` weighs the gradient of the mean parts by 1/N and of
a ratio by its denominator's part (:meth:`Parts.ratio_weight`);
``logged-step-losses`` logs N times the share and sum parts, and a ratio
N times its denominator's part.

Example:
    >>> Parts(batch_graph.Reader(16)).kind(loss)          # doctest: +SKIP
    'mean'
"""

from __future__ import annotations

from typing import Any

from mirrorkit.compat import batch_graph, replica_loss, shares, step_rows

INDEP, MEAN, SUM, SHARE, RATIO, MIXED, OTHER = (
    "indep", "mean", "sum", "share", "ratio", "mixed", "other")
_ADDS = frozenset({"AddV2", "Add", "AddN", "Sub"})
_SAME = frozenset({"Identity", "Cast", "Snapshot", "EnsureShape"})
_DIVIDES = frozenset({"RealDiv", "Div", "DivNoNan"})
_SCALES = _DIVIDES | {"Mul"}


class Parts:
    """Each scalar's kind in one replica's step graph, memoised.

    Example:
        >>> Parts(batch_graph.Reader(16)).kind(loss)       # doctest: +SKIP
        'mean'
    """

    def __init__(self, reader: batch_graph.Reader) -> None:
        self.reader = reader
        self.kinds: dict[Any, str] = {}
        self.shared: dict[Any, bool] = {}

    def has_share(self, tensor: Any) -> bool:
        """Is a Keras share among ``tensor``'s scalar ancestors? (Shares are scalars.)"""
        key = tensor.ref()
        if key not in self.shared:
            found = bool(shares.share_of(tensor))
            if not found and tensor.shape.rank == 0 and hasattr(tensor, "op"):
                found = any(self.has_share(t) for t in tensor.op.inputs if t.dtype.is_floating)
            self.shared[key] = found
        return self.shared[key]

    def _factor(self, tensor: Any) -> bool:
        return not self.has_share(tensor) and self.reader.state(tensor) == batch_graph.INDEP

    def scaled(self, tensor: Any) -> tuple[Any, Any, bool] | None:
        """``(carrier, factor, divides)`` when ``tensor`` is a value times or over a factor."""
        op, inputs = tensor.op, list(tensor.op.inputs)
        if op.type not in _SCALES or len(inputs) != 2:
            return None
        pairs = ((inputs[0], inputs[1]), (inputs[1], inputs[0]))
        # A value over a factor, or a product either way round.
        for carrier, other in pairs[:2 if op.type == "Mul" else 1]:
            if self._factor(other):
                return carrier, other, op.type != "Mul"
        return None

    def ratio(self, tensor: Any) -> Any | None:
        """The denominator when ``tensor`` is a sum over the rows over another one, else None.

        Only a denominator that is a reduction (a mask's or weights' sum, plus
        perhaps a constant against a division by zero): a sum over the rows
        divided by the batch size is a mean.

        Example:
            >>> Parts(reader).ratio(ops.sum(loss * mask) / ops.sum(mask))  # doctest: +SKIP
            <tf.Tensor 'Sum_1:0' shape=() dtype=float32>
        """
        op, inputs = tensor.op, list(tensor.op.inputs)
        if op.type not in _DIVIDES or len(inputs) != 2 or tensor.shape.rank != 0 \
                or self.has_share(tensor):
            return None
        top, bottom = inputs
        if self.reader.state(top) != 1:
            return None
        base = bottom
        while base.op.inputs and (base.op.type in _SAME or base.op.type in ("AddV2", "Add")):
            if base.op.type in _SAME:
                base = base.op.inputs[0]
                continue
            # reduce_sum(mask) + epsilon: follow the term that is not a constant.
            terms = [t for t in base.op.inputs if self.reader.state(t) != batch_graph.INDEP]
            if len(terms) != 1:
                return None
            base = terms[0]
        return bottom if base.op.type == "Sum" and self.reader.state(base) == 1 else None

    def ratio_weight(self, tensor: Any, context: Any) -> Any:
        """This replica's denominator over the replicas' total (float32; one sum per call).

        Example:
            >>> context = tf.distribute.get_replica_context()          # doctest: +SKIP
            >>> parts.ratio_weight(masked_mean, context)               # doctest: +SKIP
        """
        import tensorflow as tf

        bottom = tf.cast(self.ratio(tensor), tf.float32)
        total = replica_loss.global_sum(context, bottom)
        return tf.math.divide_no_nan(tf.stop_gradient(bottom), total)

    def kind(self, tensor: Any) -> str:
        """``tensor``'s kind: INDEP, MEAN, SUM, SHARE, RATIO, MIXED or OTHER."""
        key = tensor.ref()
        if key not in self.kinds:
            self.kinds[key] = self._kind(tensor)
        return self.kinds[key]

    def _kind(self, tensor: Any) -> str:
        if shares.share_of(tensor):
            return SHARE
        op, inputs = tensor.op, list(tensor.op.inputs)
        if tensor.shape.rank == 0 and inputs:
            if op.type in _ADDS:
                kinds = {self.kind(t) for t in inputs}
                if kinds <= {INDEP, MEAN}:
                    return MEAN if MEAN in kinds else INDEP
                return kinds.pop() if len(kinds) == 1 else MIXED
            if op.type in _SAME or op.type == "Neg":
                return self.kind(inputs[0])
            scaled = self.scaled(tensor)
            if scaled is not None:
                return self.kind(scaled[0])
            if self.ratio(tensor) is not None:
                return RATIO
        if self.has_share(tensor):
            return OTHER
        return {batch_graph.INDEP: INDEP, 0: MEAN, 1: SUM}.get(self.reader.state(tensor), OTHER)

    def split(self, tensor: Any, wanted: frozenset, coef: Any = 1.0,
              out: list | None = None) -> list[tuple[Any, Any]]:
        """The parts of ``tensor`` of the ``wanted`` kinds, as ``(part, coefficient)``.

        ``tensor`` is the sum of every part times its coefficient (float32,
        a Python float or a scalar tensor of the step's graph).
        """
        out = [] if out is None else out
        kind = self.kind(tensor)
        if kind in wanted:
            out.append((tensor, coef))
        elif kind == MIXED:
            op, inputs = tensor.op, list(tensor.op.inputs)
            if op.type in _ADDS:
                for i, part in enumerate(inputs):
                    self.split(part, wanted, -coef if op.type == "Sub" and i else coef, out)
            elif op.type in _SAME or op.type == "Neg":
                self.split(inputs[0], wanted, -coef if op.type == "Neg" else coef, out)
            else:
                carrier, factor, divides = self.scaled(tensor)
                self.split(carrier, wanted, _times(coef, factor, divides), out)
        return out


def _times(coef: Any, factor: Any, divides: bool) -> Any:
    import tensorflow as tf

    factor = tf.cast(factor, tf.float32)
    return tf.math.divide_no_nan(coef, factor) if divides else coef * factor


def reader(context: Any) -> Parts:
    """A :class:`Parts` for the current replica step (its static batch, if known).

    A number equal to the global batch size divides a sum by it (plain
    Python's batch size written in the script), not by this replica's rows.

    Example:
        >>> reader(tf.distribute.get_replica_context()).kind(loss)   # doctest: +SKIP
        'mean'
    """
    rows = step_rows.current()
    static = rows.static if rows is not None else None
    return Parts(batch_graph.Reader(
        static, global_batch=static * context.num_replicas_in_sync if static else None))


def combined(parts: list[tuple[Any, Any]], dtype: Any) -> Any:
    """The sum of ``parts`` times their coefficients, in ``dtype``.

    Example:
        >>> combined([(mean, 1.0), (reg, 0.5)], tf.float32)       # doctest: +SKIP
    """
    import tensorflow as tf

    return tf.add_n([tf.cast(part, dtype) * tf.cast(coef, dtype) for part, coef in parts])
