"""The loss *shares* of a training step: what Keras divided by the replica count N.

Inside a training step under N replicas a reduced Keras loss is each
replica's share of the global loss (Keras divides it by N, see
:mod:`mirrorkit.compat.no_gradient_losses`), so that summing the replicas'
gradients gives the global gradient. ``logged-step-losses`` records every
share where it is made (the rank-0 result of a ``keras.losses.Loss`` call,
of ``Model.compute_loss``, of ``tf.nn.compute_average_loss``, in a replica
context of N > 1 replicas while a gradient tape records), and the values
Keras's own step multiplies back (``unscale_loss_for_distribution``), which
are whole. The fixes that read a step's losses ask here; the facts are kept
in the loss model's ledger (:mod:`mirrorkit.compat.replica_loss`).

Example:
    >>> share_of(1.0), marked(2.0, "whole")
    (0, False)
"""

from __future__ import annotations

from typing import Any

from mirrorkit.compat import replica_loss
from mirrorkit.compat.no_gradient_losses import gradient_possible

_KINDS = {"whole": replica_loss.WHOLE, "step": replica_loss.STEP}


def _replicas_if_share() -> int:
    """The replica count when a loss computed here is a share of the global loss, else 0."""
    import tensorflow as tf

    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return 0
    n = int(tf.distribute.get_strategy().num_replicas_in_sync)
    return n if n > 1 and gradient_possible() else 0


def remember(value: Any) -> Any:
    """Record ``value`` as a share when it is one here (a rank-0 loss in a replica's step).

    Example:
        >>> remember(1.5)
        1.5
    """
    n = _replicas_if_share()
    if n and tuple(getattr(value, "shape", (None,)) or ()) == () and not marked(value, "whole"):
        replica_loss.note(value, replica_loss.SHARE, n)
    return value


def mark(value: Any, kind: str) -> Any:
    """Record ``value`` (in a replica's step) as ``"whole"`` or ``"step"``; returns it.

    ``"whole"``: Keras multiplied a share back (``unscale_loss_for_distribution``),
    so it is one device's value. ``"step"``: the loss Keras's own
    ``train_step`` got from ``compute_loss``, which it differentiates and logs.

    Example:
        >>> mark(2.0, "whole")
        2.0
    """
    if _replicas_if_share():
        replica_loss.note(value, _KINDS[kind])
    return value


def marked(value: Any, kind: str) -> bool:
    """True when ``value`` was recorded by :func:`mark` as ``kind``.

    Example:
        >>> marked(1.0, "step")
        False
    """
    return bool(replica_loss.fact(value, _KINDS[kind]))


def share_of(value: Any) -> int:
    """How many replicas ``value`` is a share of (0: not a remembered share).

    Example:
        >>> share_of(1.0)
        0
    """
    return replica_loss.fact(value, replica_loss.SHARE) or 0
