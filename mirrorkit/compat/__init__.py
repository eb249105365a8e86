"""Fixes for the upstream Keras 3 bugs that break training under ``tf.distribute``.

With TensorFlow 2.19-2.21 and Keras 3.15, ``model.fit`` under
``tf.distribute.MultiWorkerMirroredStrategy`` fails before the first step
(keras-team/keras#20585, tensorflow/tensorflow#72388), and
``steps_per_execution > 1`` fails under any strategy with 2+ replicas
(keras-team/keras#19246). Three independent spots in
``keras/src/backend/tensorflow/trainer.py`` are to blame; each has a fix here:

``symbolic-build`` (keras#20585, part 1)
    ``TensorFlowTrainer._maybe_symbolic_build`` peeks at one batch and calls
    ``strategy.reduce("MEAN", per_replica_batch, axis=None)`` to get one
    example batch. In multi-worker mode that raises ``ValueError: Attempt to
    convert a value (PerReplica...)``. Under a local MirroredStrategy it fails
    too whenever the global batch does not divide evenly by the replicas
    (``fit(x, y, batch_size=32)`` on 3 GPUs: "Inputs to operation AddN ...
    must have the same size and shape"). The build only needs shapes and
    dtypes, so the fix hands it this worker's first local replica batch
    (``experimental_local_results(v)[0]``): no collective, same shapes.

``scalar-logs`` (keras#20585, part 2; tensorflow#72388)
    ``reduce_per_replica``'s multi-worker branch reduces the step logs with
    ``strategy.reduce("MEAN", v, axis=0)``. Logs are scalars (loss, metric
    results), so TF raises ``Invalid reduction dimension 0 for input with 0
    dimensions``. The fix reduces rank-0 values with ``axis=None`` (the mean
    over replicas, which is what the single-worker branch computes), all
    scalars of a dtype in one collective instead of one each, and leaves
    every other value and reduction to Keras.

``multi-step`` (keras#19246)
    With ``steps_per_execution > 1`` Keras runs each step inside a
    ``tf.cond`` in a ``tf.while_loop``; under 2+ replicas the cond's branch
    captures per-replica tensors it never feeds ("You must feed a value for
    placeholder tensor ..."). The fix (:mod:`mirrorkit.compat.multistep`) runs the
    same steps in a while loop whose condition, not a cond around the step,
    checks for the next batch. One replica keeps Keras's code.

``predict`` needs no fix on the installed versions: Keras gathers every
replica's outputs in replica order (``_multi_worker_concat``) and the array
adapter shards batches by replica, so each worker gets every example once,
in order (``tests/compat/test_multi_worker.py`` checks this against a single-process
predict).

How a fix decides it is needed (:mod:`mirrorkit.compat.fix`): inside the
Keras range mirrorkit's test matrix covers, from that version table; outside
it, from a small behavioural probe on the strategy at hand
(:mod:`mirrorkit.compat.probes`), once per process; with nothing to probe on,
the fix is applied, since every patch behaves like the code it wraps when the
bug is absent. Keras's source text is never consulted, so a harmless upstream
refactor changes nothing. A fix whose target is gone is ``unavailable``: one
warning naming the fix and the versions, and what depends on it turns off
(``steps_per_execution`` falls back to 1 with 2+ replicas); creating a
strategy never fails because of a fix. ``mirrorkit info`` shows each fix's
status and how it was decided.

Every fix is idempotent, is applied only when needed, and can be disabled:
``apply(disable=[...])``, or ``MIRRORKIT_COMPAT=off`` (all fixes) /
``MIRRORKIT_COMPAT_DISABLE=symbolic-build,scalar-logs`` (some) in the
environment. Tests disable a fix to assert the upstream failure still exists,
so mirrorkit notices when upstream fixes it.

:func:`mirrorkit.get_strategy` applies the fixes when it creates a
multi-worker strategy. Code that creates its own strategy calls
:func:`apply` (or ``mirrorkit.fix_multi_worker()``) once, before ``fit``.

Example:
    >>> import tensorflow as tf                                  # doctest: +SKIP
    >>> import mirrorkit
    >>> strategy = tf.distribute.MultiWorkerMirroredStrategy()   # doctest: +SKIP
    >>> mirrorkit.fix_multi_worker()                             # doctest: +SKIP
    {'symbolic-build': 'applied', 'scalar-logs': 'applied', 'multi-step': 'applied'}
"""

from mirrorkit.compat.fix import Decision, Fix, FixUnavailable
from mirrorkit.compat.registry import (
    APPLIED,
    DISABLED,
    FIXES,
    NOT_APPLIED,
    NOT_NEEDED,
    UNAVAILABLE,
    apply,
    decisions,
    revert,
    status,
    works,
)

__all__ = [
    "APPLIED",
    "DISABLED",
    "FIXES",
    "NOT_APPLIED",
    "NOT_NEEDED",
    "UNAVAILABLE",
    "Decision",
    "Fix",
    "FixUnavailable",
    "apply",
    "decisions",
    "revert",
    "status",
    "works",
]


# Failure detection was documented under this package before it moved to
# mirrorkit.distribute (it is not an upstream fix); the old names keep working.
_MOVED = {"configure_failure_detection", "DEFAULT_JOIN_TIMEOUT", "DEFAULT_PEER_TIMEOUT",
          "EXIT_MARGIN"}


def __getattr__(name: str):
    if name in _MOVED:
        from mirrorkit.distribute import failure_detection  # architecture: allowed alias

        return getattr(failure_detection, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
