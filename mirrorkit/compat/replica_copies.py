"""The ``replica-variable-copies`` check: a variable each replica assigns its own way is named.

A variable created with ``aggregation="none"`` (Keras's default for
``keras.Variable``) and assigned inside a replica's step is updated on each
replica's own copy, without synchronisation: TensorFlow's
``_on_write_update_replica`` writes each device's copy alone. When the value
comes from the replica's rows (keras.io's NNCLR keeps a queue of the batch's
projections: ``queue.assign(ops.concatenate([projections, queue[:-batch]]))``)
the copies drift apart, from each other and from plain Python's single value,
with no error: measured on that pattern under ``mirrorkit launch`` with 2
workers, the queue's sum of magnitudes 417.36 on the chief and 418.40 on the
other worker after 2 epochs (plain Python 418.32), and every later step of
each replica reads its own copy. Neither a mean nor a sum over the replicas
is right for every such variable, so nothing is changed: the assignment is
named once, where the script makes it, with the ways to make it exact.

A value that does not depend on the batch (a counter's ``assign_add(1)``, a
value all-reduced or all-gathered across the replicas) and Keras's own
variables (assigned outside the script's code, or inside a Keras layer the
script's ``train_step`` calls: BatchNormalization's moving statistics) are
not named.

Example:
    >>> from tensorflow.python.distribute import values          # doctest: +SKIP
    >>> patched = make(values._on_write_update_replica)           # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from mirrorkit.compat.failures import failing_loudly

logger = logging.getLogger(__name__)

# The places already named (where the script assigns), once per process.
_NAMED: set[str] = set()


def _check(var: Any, value: Any, replicas: int) -> None:
    import tensorflow as tf

    from mirrorkit.compat import batch_graph
    from mirrorkit.compat.paired_losses import where

    if not isinstance(value, tf.Tensor) or tf.executing_eagerly() \
            or not hasattr(value, "graph"):
        return
    place = where(value.op)
    if ".py:" not in place or place in _NAMED or _in_keras_layer(value.op):
        return   # Keras's or TensorFlow's own assignment, or named already
    if batch_graph.Reader(None).state(value) == batch_graph.INDEP:
        return
    _NAMED.add(place)
    logger.warning(
        "mirrorkit: %s assigns the variable %r from this replica's rows; it was created "
        "with aggregation 'none', so under %d replicas each replica writes its own copy "
        "and the copies drift apart (and from plain Python's one value). If one device's "
        "value is the replicas' mean or sum, create it with aggregation='mean' or 'sum'; if "
        "it needs every row (a queue of the batch's embeddings), gather them first "
        "(tf.distribute.get_replica_context().all_gather(x, axis=0)).",
        place, str(getattr(var, "name", "?")).split(":")[0], replicas)


def _in_keras_layer(op: Any) -> bool:
    """Was ``op`` made inside a Keras layer's own code, below the script's last frame?

    A BatchNormalization's moving statistics are assigned by Keras inside the
    layer even when a custom ``train_step`` calls the model: announced on
    their own (``--sync-batch-norm``), not the script's assignment.
    """
    from mirrorkit.compat.paired_losses import in_script

    frames = list(getattr(op, "traceback", None) or ())
    below = []
    for frame in reversed(frames):
        filename = getattr(frame, "filename", "")
        if in_script(filename):
            break   # the script's innermost frame
        below.append(filename)
    return any("/keras/src/layers/" in filename for filename in below)


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap TensorFlow's ``values._on_write_update_replica`` (``original``): name such an update.

    Example:
        >>> from tensorflow.python.distribute import values      # doctest: +SKIP
        >>> patched = make(values._on_write_update_replica)       # doctest: +SKIP
    """

    def _on_write_update_replica(var: Any, update_fn: Any, value: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1 \
                and var.aggregation == tf.VariableAggregation.NONE:
            with failing_loudly("replica-variable-copies"):
                _check(var, value, context.num_replicas_in_sync)
        return original(var, update_fn, value, **kwargs)

    return _on_write_update_replica
