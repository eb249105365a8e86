"""What a replica's loss, gradient and log must be, relative to one device: the model.

The loss and gradient fixes (records in :mod:`mirrorkit.patching.loss_fixes`)
are one subsystem with one model. One device, given a batch of ``n`` rows,
computes a loss ``L = S / W``: a sum over the rows ``S = sum_i l_i`` (each
row's loss, times its weight or mask) over the batch's weight ``W`` (its
rows, the sum of its sample weights, or its mask's valid entries; ``W = 1``
for a term independent of the batch such as a weight regularizer, or a sum
over the batch). It differentiates ``L`` and logs ``L``.

Under ``N`` replicas, replica ``r`` holds ``n_r`` rows, with ``S_r`` and
``W_r`` (``sum_r S_r = S``, ``sum_r W_r = W``). The all-reduce *sums* the
replicas' gradients, and a ``keras.metrics.Mean`` *averages* what the
replicas log (Keras's own loss tracker weighs each replica by its rows). So
each value is tracked as its sum over the replica's rows and a weight, and
combined once, with the global weight:

* the replica differentiates its **share** ``S_r / W`` (the shares' gradients
  sum to one device's);
* it logs ``N * S_r / W`` where the replicas' logs are averaged
  (``sum_r`` of it ``/ N`` is ``L``), ``n / n_r * S_r / W`` where they are
  weighed by rows;
* a term every replica computes alike (a regularizer) is a share ``T / N``
  and logs ``T``.

Keras computes ``(S_r / W_r) / N`` for a reduced loss
(``scale_loss_for_distribution``) and logs it times ``N``
(``unscale_loss_for_distribution``): the model's values exactly when
``W_r = W / N``, and only for the losses that reach that function. Each fix
puts back one case where Keras's arithmetic leaves the model:

==========================  =========================================  ===================
the value                   Keras per replica                          made the model's by
==========================  =========================================  ===================
mean over uneven rows       ``(S_r / n_r) / N``                        uneven-batch-losses
masked or weighted mean     ``(S_r / W_r) / N``                        masked-loss-means
scalar-returning loss       ``S_r / n_r`` (no ``/ N``)                 scalar-losses
Loss overriding __call__    its own value (no ``/ N``)                 overridden-loss-call
a layer's Loss in add_loss  ``/ N`` twice                              layer-losses
add_loss summing the batch  ``S_r / N``                                batch-sum-losses
hand mean in a custom step  ``S_r / n_r`` (no ``/ N``)                 hand-mean-gradients
no gradient (test_step)     ``/ N``, nothing sums                      no-gradient-losses
outside strategy.run        ``/ N``, nothing sums                      cross-replica-step
a custom step's logs        the share ``S_r / W`` logged               logged-step-losses
a metric pairing the batch  computed per replica's slice               batch-wide-metrics
a loss pairing the batch    computed per replica's slice (reported)    paired-step-losses
==========================  =========================================  ===================

The model's two quantities are computed here, once, for every fix:
:func:`rows_weight` (``n_r * N`` and ``n``: the replica's rows against an
even split's) and :func:`global_sum` (``W``: a weight or count summed over
the replicas, with no gradient through it).

Where several of these change one Keras function, it is wrapped once and
their layers run in the order :mod:`mirrorkit.patching.spots` writes.

What the fixes learn about a value while a step is traced -- that it is a
share of ``N`` replicas, already whole, the loss Keras's own step logs,
every replica's rows gathered, per-row, a Keras Loss's mean -- is one
*fact* in this module's ledger (:func:`note`, :func:`fact`): recorded on the
graph being traced, so it lives exactly as long as that step's graph, or
for an eager tensor as long as the tensor. No fix module keeps a table of
its own.

Example:
    >>> note(2.0, WHOLE), fact(2.0, WHOLE)   # a Python float takes no facts
    (2.0, None)
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from mirrorkit.compat import step_rows

# The facts (what the detail is).
SHARE = "share"              # the replicas N it is a share of (S_r / W)
WHOLE = "whole"              # True: one device's value already (Keras unscaled it)
STEP = "step"                # True: the loss Keras's own train_step differentiates
GLOBAL = "global"            # True: every replica's rows, gathered (not this replica's)
PER_ROW = "per-row"          # True: row i depends on example i alone (an op not read)
KERAS_MEAN = "keras-mean"    # True: a Keras Loss's mean (its divisor may be a static size)

# Per traced graph: fact -> tensor name -> detail. Eager tensors (no graph):
# id -> (weak reference, {fact: detail}).
_BY_GRAPH: "weakref.WeakKeyDictionary[Any, dict[str, dict[str, Any]]]" = \
    weakref.WeakKeyDictionary()
_EAGER: dict[int, tuple[weakref.ref, dict[str, Any]]] = {}
# Replica threads note facts at once while a step is traced.
_LOCK = threading.Lock()


def _graph(value: Any) -> Any:
    """The graph ``value`` lives in, or None for an eager tensor or a non-tensor."""
    from tensorflow.python.framework import ops

    if isinstance(value, ops.EagerTensor) or not hasattr(value, "graph") \
            or not hasattr(value, "name"):
        return None
    return value.graph


def note(value: Any, kind: str, detail: Any = True) -> Any:
    """Record fact ``kind`` (with ``detail``) about tensor ``value``; returns ``value``.

    A value that is not a tensor takes no facts (nothing can ask about it
    later by identity).

    Example:
        >>> import tensorflow as tf
        >>> t = tf.constant(1.0)
        >>> note(t, SHARE, 2) is t, fact(t, SHARE)
        (True, 2)
    """
    graph = _graph(value)
    with _LOCK:
        if graph is not None:
            _BY_GRAPH.setdefault(graph, {}).setdefault(kind, {})[value.name] = detail
            return value
        try:
            key = id(value)
            found = _EAGER.get(key)
            if found is None or found[0]() is not value:
                ref = weakref.ref(value, lambda _r, k=key: _EAGER.pop(k, None))
                found = _EAGER[key] = (ref, {})
        except TypeError:
            return value  # a Python number takes no weak reference: not a tensor
        found[1][kind] = detail
    return value


def fact(value: Any, kind: str) -> Any:
    """The detail of fact ``kind`` recorded about ``value``, or None.

    Example:
        >>> fact(1.0, STEP) is None
        True
    """
    graph = _graph(value)
    if graph is not None:
        return _BY_GRAPH.get(graph, {}).get(kind, {}).get(value.name)
    found = _EAGER.get(id(value))
    if found is None or found[0]() is not value:
        return None
    return found[1].get(kind)


def rows_weight() -> tuple[Any, Any] | None:
    """``(n_r * N, n)`` for this replica's step, or None when their ratio is surely 1.

    The replica's rows times the replica count, and the global batch's rows:
    their ratio is what turns Keras's ``1/N`` weight of a replica's mean into
    the model's ``n_r / n``. None outside a replica's step, on one replica,
    and where the split is even (a static batch size).

    Example:
        >>> rows_weight() is None        # outside a replica's step
        True
    """
    import tensorflow as tf

    rows = step_rows.current()
    context = tf.distribute.get_replica_context()
    if rows is None or context is None or context.num_replicas_in_sync <= 1 \
            or rows.even or not step_rows.inside(rows.graph):
        return None
    _offset, total = step_rows.share(rows, context)
    return rows.count * context.num_replicas_in_sync, total


def global_sum(context: Any, local: Any) -> Any:
    """``local`` (weights, counts) summed over the replicas, no gradient through it: ``W``.

    One collective per call; stack several quantities into ``local`` to sum
    them at once.

    Example:
        >>> context = tf.distribute.get_replica_context()             # doctest: +SKIP
        >>> rows, valid = global_sum(context, ops.stack([rows, valid]))  # doctest: +SKIP
    """
    import tensorflow as tf

    return tf.stop_gradient(context.all_reduce(tf.distribute.ReduceOp.SUM, local))
