"""The ``paired-step-losses`` check: a step loss that pairs its batch's examples is named.

A loss that compares every example of its batch with every other (keras.io's
SimCLR and supervised contrastive examples score a ``(batch, batch)``
similarity matrix; Barlow Twins correlates features over the batch) has no
per-replica form: under N replicas each replica pairs only the B/N rows of
its own slice, so the loss, its gradients and a contrastive accuracy differ
from one device's, with no error. A compiled ``keras.losses.Loss`` that
overrides ``__call__`` gets the global batch (``overridden-loss-call``); a
loss computed inside a custom ``train_step`` cannot be rewritten from
outside. This check reads the graph of what a gradient tape differentiates
in a replica's step (:func:`mirrorkit.compat.batch_graph.row_pairings`) and
names, once per product, a 2-D matrix product of two per-row tensors, with
the way to make it exact (gather the rows: ``all_gather``). The gradient is
returned as computed.

Example:
    >>> from tensorflow.python.eager.backprop import GradientTape   # doctest: +SKIP
    >>> patched = make(GradientTape.gradient)                        # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
from typing import Any, Callable

from mirrorkit.compat.failures import failing_loudly

logger = logging.getLogger(__name__)

# The products already named (where the script made them), once per process.
_NAMED: set[str] = set()


_LIBRARIES = ("tensorflow", "keras", "mirrorkit", "site-packages", "dist-packages")


def in_script(filename: str) -> bool:
    """Is ``filename`` the script's code (not a library's nor Python's own)?

    Example:
        >>> in_script("/home/me/train.py"), in_script("/x/site-packages/keras/src/ops.py")
        (True, False)
    """
    return bool(filename) and not any(f"/{lib}/" in filename for lib in _LIBRARIES) \
        and "/lib/python3" not in filename


def where(op: Any) -> str:
    """The script's line that made ``op`` (``file.py:12 in train_step``), else its name."""
    for frame in reversed(list(getattr(op, "traceback", None) or ())):
        if in_script(getattr(frame, "filename", "")):
            return f"{os.path.basename(frame.filename)}:{frame.lineno} in {frame.name}"
    return repr(op.name)


def _check(target: Any, replicas: int) -> None:
    import tensorflow as tf

    from mirrorkit.compat import batch_graph

    for value in tf.nest.flatten(target):
        if not isinstance(value, tf.Tensor) or not value.dtype.is_floating \
                or not hasattr(value, "graph"):
            continue
        for op in batch_graph.row_pairings(value):
            place = where(op)
            if place in _NAMED:
                continue
            _NAMED.add(place)
            logger.warning(
                "mirrorkit: the loss this step differentiates pairs the examples of its batch "
                "(%s multiplies two per-row tensors, as a contrastive similarity matrix does): "
                "under %d replicas each replica pairs only its own slice's rows, so the loss "
                "and the weight updates differ from one device's. To make it exact, gather "
                "the rows before pairing them "
                "(tf.distribute.get_replica_context().all_gather(x, axis=0)).", place, replicas)


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``GradientTape.gradient`` (``original``): read its target in a replica's step."""

    def gradient(self: Any, target: Any, *args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        context = tf.distribute.get_replica_context()
        # The first replica's trace reads for all: the others' graphs are its copies.
        if context is not None and context.num_replicas_in_sync > 1 \
                and not tf.executing_eagerly() \
                and tf.get_static_value(context.replica_id_in_sync_group) == 0:
            with failing_loudly("paired-step-losses"):
                _check(target, context.num_replicas_in_sync)
        return original(self, target, *args, **kwargs)

    return gradient
