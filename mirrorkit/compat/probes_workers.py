"""Behaviour probes of the bugs of multi-worker mode: ``scalar-logs``, ``static-batch-shapes``.

Keras reduces step logs on axis 0, and TensorFlow drops the static batch
size of a distributed dataset, only for a ``MultiWorkerMirroredStrategy`` in
multi-worker mode (2+ worker processes). On such a strategy these probes
answer as those of :mod:`mirrorkit.compat.probes` do: True (the bug showed:
its known error, or a batch size of None), False (the strategy behaved as
one device), None (an unexpected failure, logged at INFO). On any other
strategy, or None, they answer None: one process cannot show these bugs,
whatever its replicas. Each fix's record names its probe (``probe=``).

Every worker runs a probe at the same moment: each creates the strategy and
decides its fixes alike (:meth:`mirrorkit.compat.fix.Fix.decide`), so a
collective a probe starts is one every worker starts. The probes keep to
that: what they do depends on nothing a worker has alone (only a replica's
value differs), the bug's error comes while tracing, before any collective
runs, and without the bug one scalar all-reduce, which every worker runs, is
all. They never raise and leave Keras's names and every global random state
as they found them.

Example:
    On each worker of a 2-worker ``TF_CONFIG``, Keras's own code, then the fix's:

    >>> import mirrorkit                                             # doctest: +SKIP
    >>> strategy = mirrorkit.get_strategy()                          # doctest: +SKIP
    >>> mirrorkit.compat.revert()                                    # doctest: +SKIP
    >>> scalar_logs_reduced_on_axis_0(strategy)                      # doctest: +SKIP
    True
    >>> _ = mirrorkit.compat.apply(strategy=strategy)                # doctest: +SKIP
    >>> scalar_logs_reduced_on_axis_0(strategy)                      # doctest: +SKIP
    False
    >>> scalar_logs_reduced_on_axis_0(None) is None
    True
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from mirrorkit.compat.probes_training2 import answer
from mirrorkit.strategy_facts import in_multi_worker_mode, replicas

logger = logging.getLogger(__name__)


def _across_workers(strategy: Any, markers: tuple[str, ...],
                    body: Callable[[Any], bool | None]) -> bool | None:
    """Run ``body(strategy)`` in multi-worker mode only; its error is True if known."""
    if strategy is None or not in_multi_worker_mode(strategy):
        return None  # one process takes Keras's and TensorFlow's bug-free branch
    return answer(markers, body, strategy)


def _scalar_logs(strategy: Any) -> bool | None:
    import numpy as np
    import tensorflow as tf

    from mirrorkit.patching import targets

    # The function as Keras's step calls it now: Keras's own, or the fix's wrapper.
    reduce_per_replica = targets.owner("backend-trainer-module").reduce_per_replica

    def log() -> Any:
        # A different scalar on each replica, so a mean of one worker's alone shows.
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.cast(replica, tf.float32)

    @tf.function(autograph=False)  # Keras's step is not autograph-converted either
    def step() -> Any:
        # Keras's step: the replicas' logs from strategy.run, reduced with "auto".
        return reduce_per_replica({"loss": strategy.run(log)}, strategy, "auto")

    # Upstream fails here, while tracing (the reduction's shape check), before
    # any collective; without the bug this runs the one all-reduce on every worker.
    got = float(step()["loss"].numpy())
    n = replicas(strategy)
    one = (n - 1) / 2  # the mean over the replicas, as one worker's branch logs it
    if np.isclose(got, one):
        return False
    logger.info("mirrorkit.compat probe scalar-logs: logged %s, the replicas' mean %s; "
                "undecided", got, one)
    return None


def scalar_logs_reduced_on_axis_0(strategy: Any) -> bool | None:
    """``scalar-logs`` (tensorflow#72388): does reducing a step's scalar logs fail?

    Keras's ``reduce_per_replica`` (the backend trainer's module) reduces logs
    across workers with ``strategy.reduce("MEAN", v, axis=0)``, which a
    scalar does not have. The probe reduces the replicas' scalars from
    ``strategy.run`` in a ``tf.function``, as Keras's step does.

    Example:
        >>> scalar_logs_reduced_on_axis_0(None) is None
        True
    """
    return _across_workers(strategy, ("Invalid reduction dimension 0 for input with 0 "
                                      "dimensions",), _scalar_logs)


def _batch_shapes(strategy: Any) -> bool | None:
    import tensorflow as tf

    n = replicas(strategy)
    # Two global batches of 2 rows a replica: every batch full, each dividing by
    # the replicas, and sharded by data (nothing reads files), so every worker
    # yields the same full batches: one device's static batch size is right.
    data = tf.data.Dataset.from_tensor_slices(tf.zeros((4 * n, 1))).batch(
        2 * n, drop_remainder=True)
    # The spec only: building the distributed dataset starts no iterator and no
    # collective (partial-batch handling runs one per batch, when iterated).
    spec = strategy.experimental_distribute_dataset(data).element_spec
    sizes = {part.shape[0] for part in tf.nest.flatten(spec, expand_composites=True)}
    if sizes == {2}:
        return False
    if sizes == {None}:
        return True  # partial-batch handling: upstream drops every static batch size
    logger.info("mirrorkit.compat probe static-batch-shapes: per-replica batch sizes %s, "
                "one device 2; undecided", sorted(sizes, key=str))
    return None


def full_batches_lose_static_size(strategy: Any) -> bool | None:
    """``static-batch-shapes``: is a dataset of full, dividing batches given a batch size of None?

    Looks at the element spec of ``strategy.experimental_distribute_dataset``
    of 2 batches of 2 rows a replica; nothing is iterated.

    Example:
        >>> full_batches_lose_static_size(None) is None
        True
    """
    return _across_workers(strategy, (), _batch_shapes)
