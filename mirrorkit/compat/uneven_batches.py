"""The ``uneven-batch-losses`` fix: an unevenly split batch trains as on one device.

Keras averages a loss over each replica's rows and divides it by the replica
count N (``scale_loss_for_distribution``), so that the all-reduced sum of the
replicas' gradients is the gradient of the global batch's mean. That holds
when the replicas hold equal rows. A last batch that does not divide by N
(``fit`` on 21 examples at ``batch_size=8`` ends with 5 rows: 3 and 2 on 2
replicas; any ``tf.data`` pipeline batched without ``drop_remainder``) gives
every replica's mean the same weight 1/N, so a row of the smaller slice
counts more than on one device, and that step's update differs from plain
Python's silently. Measured: a Dense model, 21 examples, batch 8, 2
replicas: the weights after one epoch 9.2e-3 apart; 23 examples on 3
replicas (3/2/2): 0.036 apart, and the logged epoch loss 1.0810 vs 1.0857.

The fix scales a replica's loss share by ``rows * N / global rows`` (and
unscales the logged value by its inverse), which makes each replica's share
its rows' sum over the global batch's rows: one device's mean. For a term
every replica adds alike (a regularizer, ``add_loss``) the factors sum to
N, so it stays exact too. The factor is exactly 1 on an even split; a batch
whose size is part of the step's static shape (``drop_remainder=True``) is
always even and skips it. On one worker the rows are counted before the step
(no collective); across workers the step pays one small all-gather of the
replicas' row counts (shared with ``replica-random``; measured 0.4-2.8 ms per
step of a small Dense model on 2 loopback workers, ~12 ms steps).

Not covered: steps compiled by XLA (``jit_compile=True``) and losses a
custom loop averages itself (``tf.nn.compute_average_loss`` with
``global_batch_size`` is exact already; without it, it divides by the
replica's rows times N like Keras). A loss divided by a count other than the
rows (a Keras mask, ``reduction="mean_with_sample_weight"``) is
:mod:`mirrorkit.compat.masked_means`'s, which relies on this weighing.

Example:
    >>> from keras.src.losses import loss                        # doctest: +SKIP
    >>> patched = make_scale(loss.scale_loss_for_distribution)   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

from mirrorkit.compat import replica_loss
from mirrorkit.compat.step_rows import make_run

__all__ = ["make_run", "make_scale", "make_unscale"]


def _weighed(original: Callable[[Any], Any], *, inverse: bool) -> Callable[[Any], Any]:
    def weigh(value: Any) -> Any:
        out = original(value)
        found = replica_loss.rows_weight() if out is not value else None
        if found is None:
            return out
        from keras import ops

        rows, total = (ops.cast(w, out.dtype) for w in found)
        # The factor first: exactly 1.0 on an even split, so nothing changes. A
        # replica with no rows logs nothing (Keras weighs its log by 0 rows).
        factor = ops.divide_no_nan(total, rows) if inverse else ops.divide_no_nan(rows, total)
        return ops.multiply(out, factor)

    return weigh


def make_scale(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap ``scale_loss_for_distribution`` (``original``): weigh a replica's share by its rows."""
    return _weighed(original, inverse=False)


def make_unscale(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Wrap ``unscale_loss_for_distribution`` (``original``): the inverse, for the logs."""
    return _weighed(original, inverse=True)
