"""Batch math and sharding policy for data-parallel training (no TensorFlow).

Under a ``tf.distribute`` strategy the batch a ``tf.data`` pipeline yields is
the *global* batch: Keras splits it into ``replicas`` per-replica slices.
:func:`resolve_batch` keeps the two numbers straight; :func:`shard_policy`
chooses how multi-worker pipelines split the data.

Example:
    >>> resolve_batch(per_replica_batch=32, replicas=4).global_batch
    128
    >>> shard_policy(from_files=True, num_files=8, num_workers=2)
    'FILE'
"""

from __future__ import annotations

import dataclasses
import logging
import numbers

from mirrorkit._checks import check_positive_int
from mirrorkit.errors import UserInputError

logger = logging.getLogger(__name__)

POLICIES = ("FILE", "DATA", "OFF")
_logged_batches: set[tuple[int, int, int]] = set()


@dataclasses.dataclass(frozen=True)
class BatchSize:
    """The batch of one training step, per replica and in total.

    Attributes:
        per_replica: examples each replica computes on per step.
        global_batch: examples per step over all replicas; what the pipeline
            yields and what the loss is averaged over.
        replicas: replicas in sync (``strategy.num_replicas_in_sync``).

    Example:
        >>> BatchSize(per_replica=16, global_batch=64, replicas=4).global_batch
        64
    """

    per_replica: int
    global_batch: int
    replicas: int


def _current_replicas() -> int:
    from mirrorkit.distribute.scope import current_strategy

    return int(current_strategy().num_replicas_in_sync)


def current_workers() -> int:
    """Worker processes of the strategy in scope (1 unless multi-worker)."""
    from mirrorkit.distribute.scope import current_strategy
    from mirrorkit.distribute.strategy import describe

    return describe(current_strategy()).workers


def resolve_batch(
    *,
    per_replica_batch: int | None = None,
    global_batch: int | None = None,
    replicas: int | None = None,
) -> BatchSize:
    """Turn a per-replica or a global batch size into both.

    Give exactly one of ``per_replica_batch`` and ``global_batch``.

    Args:
        per_replica_batch: examples per replica per step.
        global_batch: examples per step over all replicas; must be divisible
            by ``replicas`` so every replica gets an equal slice.
        replicas: replicas in sync. Defaults to the current strategy's
            ``num_replicas_in_sync`` (the entered ``strategy.scope()``, else
            the strategy :func:`mirrorkit.get_strategy` created, else 1).

    Returns:
        A :class:`BatchSize`. The resolved numbers are logged once.

    Raises:
        UserInputError: when both or neither batch argument is given, a value is
            not a positive integer, or ``global_batch`` is not divisible by
            ``replicas``.

    Example:
        >>> resolve_batch(global_batch=256, replicas=8)
        BatchSize(per_replica=32, global_batch=256, replicas=8)
    """
    if (per_replica_batch is None) == (global_batch is None):
        raise UserInputError(
            "Pass exactly one of `per_replica_batch` and `global_batch`. Received: "
            f"per_replica_batch={per_replica_batch!r}, global_batch={global_batch!r}"
        )
    if replicas is None:
        replicas = _current_replicas()
    replicas = check_positive_int("replicas", replicas)
    if per_replica_batch is not None:
        per_replica = check_positive_int("per_replica_batch", per_replica_batch)
        total = per_replica * replicas
    else:
        total = check_positive_int("global_batch", global_batch)
        if total % replicas:
            raise UserInputError(
                f"`global_batch` must be divisible by the number of replicas "
                f"({replicas}). Received: global_batch={global_batch}"
            )
        per_replica = total // replicas
    key = (per_replica, total, replicas)
    if key not in _logged_batches:
        _logged_batches.add(key)
        logger.info("batch: %d per replica x %d replicas = %d global", *key)
    return BatchSize(per_replica=per_replica, global_batch=total, replicas=replicas)


def shard_policy(*, from_files: bool, num_files: int | None, num_workers: int) -> str:
    """Choose the ``tf.data`` auto-shard policy for a multi-worker pipeline.

    ``"FILE"`` (each worker reads its own files) needs at least as many files
    as workers; otherwise ``"DATA"`` (each worker reads everything and keeps
    every N-th element). With one worker nothing is sharded: ``"OFF"``.
    Choosing explicitly avoids tf.data's AUTO fallback and its warning.

    Args:
        from_files: True when the dataset reads files (TFRecord, images, ...).
        num_files: how many files; required to choose FILE.
        num_workers: training processes (not replicas).

    Returns:
        ``"FILE"``, ``"DATA"`` or ``"OFF"`` (names of
        ``tf.data.experimental.AutoShardPolicy``).

    Raises:
        UserInputError: for ``num_workers`` < 1 or a negative ``num_files``.

    Example:
        >>> shard_policy(from_files=True, num_files=1, num_workers=2)
        'DATA'
        >>> shard_policy(from_files=False, num_files=None, num_workers=1)
        'OFF'
    """
    num_workers = check_positive_int("num_workers", num_workers)
    if num_files is not None and (isinstance(num_files, bool)
                                  or not isinstance(num_files, numbers.Integral)
                                  or num_files < 0):
        raise UserInputError(
            f"`num_files` must be a non-negative integer or None. Received: num_files={num_files!r}"
        )
    if num_workers == 1:
        return "OFF"
    if from_files and num_files is not None and num_files >= num_workers:
        return "FILE"
    return "DATA"
