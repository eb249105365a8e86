"""The ``overridden-loss-call`` fix: a ``Loss`` that overrides ``__call__`` trains as on one device.

keras.io's supervised contrastive learning example writes its loss as a
``keras.losses.Loss`` subclass whose ``__call__`` returns one value for the
batch. That skips ``Loss.__call__`` and with it ``reduce_values``, where Keras
divides a loss by the replica count N for the gradients' all-reduce (a sum).
Under N replicas the step then moves the weights N times as far and the
trainer, which unscales the logged loss, logs N times the replicas' mean
(measured: 2 replicas, the contrastive phase logs 5.48 vs plain Python's 3.48).
The ``scalar-losses`` fix does not see it: it wraps ``reduce_weighted_values``,
which this path never calls.

The fix wraps each such loss where ``CompileLoss`` builds its list of losses:
the wrapper calls the loss and, when Keras's own scaling did not run during
the call (a subclass may call ``super().__call__``), scales the scalar it
returns as Keras scales a per-example loss's mean. A ``__call__`` that
returns per-example values needs no scaling for its gradient (the replicas'
sums add up to one device's) but is logged N times too large: its value is
scaled and its gradient kept.

Such a loss is often batch-wide (the contrastive loss scores every pair of
the batch), which no scaling of each replica's value makes equal to one
device's: each replica would score only its own rows' pairs (measured: 2.75
logged vs plain Python's 3.48). So the wrapper calls the loss on the global
batch, every replica's labels, predictions and weights gathered in their
global order: the loss is then plain Python's, and ``all_gather``'s gradient
hands each replica its own rows' share. The cost is N times the loss's own
arithmetic and its inputs' memory on each replica, small next to the model
for the losses that take this path.

Example:
    >>> from keras.src.trainers import compile_utils                  # doctest: +SKIP
    >>> patched = make_build(compile_utils.CompileLoss.build)          # doctest: +SKIP
"""

from __future__ import annotations

import contextvars
from typing import Any, Callable

from mirrorkit.compat import batch_graph

# While a wrapped loss runs: a list that Keras's scaling appends to.
_SCALED: contextvars.ContextVar[list | None] = contextvars.ContextVar(
    "mirrorkit_loss_scaled", default=None)


def overrides_call(loss: Any) -> bool:
    """Is ``loss`` a Keras ``Loss`` whose class defines its own ``__call__``?

    Example:
        >>> import keras
        >>> overrides_call(keras.losses.MeanSquaredError())
        False
    """
    from keras.src.losses.loss import Loss

    if not isinstance(loss, Loss):
        return False
    owner = next(c for c in type(loss).__mro__ if "__call__" in c.__dict__)
    return owner is not Loss


def gather_batch(context: Any, values: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """``values`` with every replica's rows, in global-batch order; None when they cannot be.

    Called inside a replica (``context`` is its replica context); a None in
    ``values`` stays None. Also used by ``batch-wide-metrics``.

    Example:
        >>> y_true, y_pred = gather_batch(context, (y_true, y_pred))   # doctest: +SKIP
    """
    import tensorflow as tf
    from keras import ops

    present = [ops.convert_to_tensor(v) for v in values if v is not None]
    if any(t.shape.rank in (None, 0) for t in present):
        return None
    # all_gather sends each tensor to its own device, which must be named: a
    # multi-worker replica's input tensors carry none. Replica ids run worker by
    # worker, so the id modulo the local devices is this replica's device.
    local = context.strategy.extended.worker_devices
    replica = tf.get_static_value(context.replica_id_in_sync_group)
    if replica is None:
        return None
    with tf.device(local[int(replica) % len(local)]):
        present = [tf.identity(t) for t in present]
    # One gather per tensor: a batched gather concatenates them, so all would
    # need one dtype (labels are often integers).
    gathered = [context.all_gather(t, axis=0) for t in present]
    replicas = context.num_replicas_in_sync
    # Every replica of a distributed batch has the same static shape or none; a
    # static one makes the global batch's static, as in one process (a loss may
    # need the rank: ops.squeeze of an unknown first dimension loses it).
    gathered = [tf.ensure_shape(g, [t.shape[0] * replicas, *t.shape[1:]])
                if t.shape[0] is not None else g for g, t in zip(gathered, present)]
    for g in gathered:
        batch_graph.mark_global(g)
    rows = iter(gathered)
    return tuple(None if v is None else next(rows) for v in values)


def _own_rows(context: Any, value: Any, local: Any) -> Any:
    """This replica's rows of ``value``, computed on the gathered batch."""
    import tensorflow as tf

    from mirrorkit.compat import step_rows

    rows = step_rows.current()
    if rows is not None:
        # Where the step's rows are recorded, their offset is known (and shared
        # with replica-random and uneven-batch-losses: at most one collective).
        begin, _total = step_rows.share(rows, context)
    else:
        sizes = context.all_gather(tf.shape(local)[:1], axis=0)
        begin = tf.reduce_sum(sizes[:context.replica_id_in_sync_group])
    return value[begin:begin + tf.shape(local)[0]]


class _Scaled:
    """``loss`` as ``CompileLoss`` calls it, on the whole global batch, scaled for the replicas.

    The loss runs on every replica's rows gathered (``all_gather``, whose
    gradient returns to each replica the gradient of its own rows), so a
    batch-wide loss such as a similarity matrix over the batch sees the batch
    plain Python sees. Each replica returns the loss divided by N: their
    gradients, summed by the all-reduce, are one device's.
    """

    def __init__(self, loss: Any) -> None:
        self.loss = loss
        self.name = getattr(loss, "name", None)

    def __call__(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> Any:
        import tensorflow as tf
        from keras import ops
        from keras.src.losses.loss import scale_loss_for_distribution

        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync <= 1:
            return self.loss(y_true, y_pred, sample_weight)
        gathered = gather_batch(context, (y_true, y_pred, sample_weight))
        seen: list = []
        token = _SCALED.set(seen)
        try:
            value = self.loss(*(gathered or (y_true, y_pred, sample_weight)))
        finally:
            _SCALED.reset(token)
        value = ops.convert_to_tensor(value)
        if tuple(value.shape) == ():
            return value if seen else scale_loss_for_distribution(value)
        # Per-example values: this replica's rows. Keras neither reduces nor
        # scales them: the gradient of a vector is the gradient of its sum, and
        # the replicas' sums add up to one device's, but the trainer multiplies
        # the logged value by N (measured: 2 replicas logged twice plain
        # Python's loss). The value is scaled as Keras scales a loss, the
        # gradient is not.
        if gathered is not None:
            value = _own_rows(context, value, y_pred)
        if seen:
            return value
        return value + tf.stop_gradient(scale_loss_for_distribution(value) - value)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loss, name)


def make_build(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``CompileLoss.build`` (``original``): wrap the losses that override ``__call__``."""

    def build(self: Any, y_true: Any, y_pred: Any) -> Any:
        result = original(self, y_true, y_pred)
        flat = getattr(self, "_flat_losses", None) or []
        for index, entry in enumerate(flat):
            if len(entry) >= 2 and overrides_call(entry[1]):
                flat[index] = (entry[0], _Scaled(entry[1]), *entry[2:])
        return result

    return build


def make_scale(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap ``scale_loss_for_distribution`` (``original``): note that Keras scaled a loss."""

    def scale_loss_for_distribution(value: Any) -> Any:
        seen = _SCALED.get()
        if seen is not None:
            seen.append(True)
        return original(value)

    return scale_loss_for_distribution
