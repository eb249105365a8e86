"""Minimal fixes that make Keras 3 ``fit``/``evaluate``/``predict`` work under MWMS.

With TensorFlow 2.21 and Keras 3.15, ``model.fit`` under
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
    placeholder tensor ..."). The fix (:mod:`mirrorkit._multistep`) runs the
    same steps in a while loop whose condition, not a cond around the step,
    checks for the next batch. One replica keeps Keras's code.

``predict`` needs no fix on the installed versions: Keras gathers every
replica's outputs in replica order (``_multi_worker_concat``) and the array
adapter shards batches by replica, so each worker gets every example once,
in order (``tests/test_multi_worker.py`` checks this against a single-process
predict).

How a fix decides it is needed: it looks for the broken call in the source of
the installed Keras function (e.g. ``distribute_strategy.reduce(`` inside
``_maybe_symbolic_build``). That detects the broken code path exactly,
without running a collective, and stops applying the fix the day upstream
changes that code. When the source is unavailable (a frozen install) it falls
back to the affected version range in :mod:`mirrorkit.upstream`.

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

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from typing import Any, Callable, Iterable

from mirrorkit import _env, _multistep

logger = logging.getLogger(__name__)

# Status values :func:`apply` and :func:`status` report for each fix.
APPLIED = "applied"
NOT_NEEDED = "not-needed"
DISABLED = "disabled"
NOT_APPLIED = "not-applied"

_TRAINER = "keras.src.backend.tensorflow.trainer"


@dataclasses.dataclass(frozen=True)
class Fix:
    """One upstream failure and the patch that works around it.

    Attributes:
        name: short name used by ``disable=`` and ``MIRRORKIT_COMPAT_DISABLE``.
        ref: the upstream issue, as listed in :mod:`mirrorkit.upstream`.
        summary: what breaks without the fix, in one sentence.
        error: a fragment of the upstream error message (tests assert it).
    """

    name: str
    ref: str
    summary: str
    error: str
    _target: tuple[str, str, str | None]   # (module, attribute, class or None)
    _broken_marker: str                    # source text of the broken call
    _make: Callable[[Callable[..., Any]], Callable[..., Any]]

    def _owner(self) -> Any:
        import importlib

        module, _attr, cls = self._target
        owner = importlib.import_module(module)
        return getattr(owner, cls) if cls else owner

    def _original(self) -> Callable[..., Any]:
        current = getattr(self._owner(), self._target[1])
        return getattr(current, "__mirrorkit_original__", current)

    def needed(self) -> bool:
        """True when the installed Keras still has the broken code path.

        Example:
            >>> FIXES["scalar-logs"].needed()                # doctest: +SKIP
            True
        """
        try:
            source = inspect.getsource(self._original())
        except (OSError, TypeError):
            # No source (zipped or compiled install): trust the version range.
            from mirrorkit import upstream

            return any(i.ref == self.ref for i in upstream.affecting())
        return self._broken_marker in _squash(source)

    def is_applied(self) -> bool:
        """True when the patch is in place in this process."""
        current = getattr(self._owner(), self._target[1])
        return getattr(current, "__mirrorkit_fix__", None) == self.name

    def _apply(self) -> None:
        if self.is_applied():
            return
        original = self._original()
        patched = self._make(original)
        functools.update_wrapper(patched, original)
        patched.__mirrorkit_fix__ = self.name  # type: ignore[attr-defined]
        patched.__mirrorkit_original__ = original  # type: ignore[attr-defined]
        setattr(self._owner(), self._target[1], patched)

    def _revert(self) -> None:
        if self.is_applied():
            setattr(self._owner(), self._target[1], self._original())


def _squash(text: str) -> str:
    # Compare code without whitespace so reformatting upstream does not matter.
    return "".join(text.split())


def _in_multi_worker_mode(strategy: Any) -> bool:
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and bool(
        strategy.extended._in_multi_worker_mode())


def _splits_batches(strategy: Any) -> bool:
    # Multi-worker mode, or several local replicas: in both the data batch
    # arrives as PerReplica values that upstream reduces element-wise, which
    # fails across workers and whenever the replicas' slices differ in size
    # (a global batch of 32 on 3 replicas is split 11/11/10).
    if _in_multi_worker_mode(strategy):
        return True
    return int(getattr(strategy, "num_replicas_in_sync", 1)) > 1


def _local_first(strategy: Any, value: Any) -> Any:
    import tensorflow as tf

    if isinstance(value, tf.distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


def _make_symbolic_build(original: Callable[..., Any]) -> Callable[..., Any]:
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if iterator is None or strategy is None or not _splits_batches(strategy):
            return original(self, iterator=iterator, data_batch=data_batch)
        from keras.src import tree

        # Same peek as upstream, but take this worker's local batch instead of
        # a cross-worker MEAN of the data: the build needs shapes only.
        for _, _, it in iterator:
            batch = next(it)
            data_batch = tree.map_structure(lambda v: _local_first(strategy, v), batch)
            break
        return original(self, iterator=None, data_batch=data_batch)

    return _maybe_symbolic_build


def _rank(strategy: Any, value: Any) -> int | None:
    local = _local_first(strategy, value)
    shape = getattr(local, "shape", None)
    return None if shape is None else shape.rank


def _mean_of_scalars(strategy: Any, scalars: list[Any]) -> list[Any]:
    """Mean over replicas of each per-replica scalar, in one collective per dtype.

    Upstream reduces every log (loss, each metric) with its own all-reduce;
    across workers each costs a network round trip (~2 ms on loopback), so
    the scalars of one dtype travel stacked in one vector.
    """
    import tensorflow as tf

    distributed = [isinstance(v, tf.distribute.DistributedValues) for v in scalars]
    if len(scalars) == 1 or len(set(distributed)) > 1:
        return [strategy.reduce("MEAN", v, axis=None) for v in scalars]
    if distributed[0]:
        stacked = strategy.run(lambda *values: tf.stack(values), args=tuple(scalars))
    else:
        # One local replica per worker: plain tensors, reduced across workers.
        stacked = tf.stack(scalars)
    return tf.unstack(strategy.reduce("MEAN", stacked, axis=None))


def _make_scalar_logs(original: Callable[..., Any]) -> Callable[..., Any]:
    def reduce_per_replica(values, strategy, reduction):
        if reduction not in ("auto", "mean") or not _in_multi_worker_mode(strategy):
            return original(values, strategy, reduction)
        from keras.src import tree

        flat = tree.flatten(values)
        out = list(flat)
        by_dtype: dict[Any, list[int]] = {}
        for i, v in enumerate(flat):
            if _rank(strategy, v) == 0:
                # The mean over replicas of a scalar: axis=None, not axis=0.
                by_dtype.setdefault(_local_first(strategy, v).dtype, []).append(i)
            else:
                out[i] = original(v, strategy, "mean")
        for indices in by_dtype.values():
            means = _mean_of_scalars(strategy, [flat[i] for i in indices])
            for i, mean in zip(indices, means):
                out[i] = mean
        return tree.pack_sequence_as(values, out)

    return reduce_per_replica


FIXES: dict[str, Fix] = {fix.name: fix for fix in (
    Fix("symbolic-build", "keras#20585",
        "fit/evaluate reduce a PerReplica data batch across workers to build the model, "
        "which fails in multi-worker mode.",
        "Attempt to convert a value (PerReplica",
        (_TRAINER, "_maybe_symbolic_build", "TensorFlowTrainer"),
        "self.distribute_strategy.reduce(", _make_symbolic_build),
    Fix("scalar-logs", "tensorflow#72388",
        "the multi-worker branch of reduce_per_replica reduces scalar logs on axis 0.",
        "Invalid reduction dimension 0 for input with 0 dimensions",
        (_TRAINER, "reduce_per_replica", None), 'strategy.reduce("MEAN",v,axis=0)',
        _make_scalar_logs),
    Fix("multi-step", "keras#19246",
        "steps_per_execution > 1 fails in fit/evaluate under a strategy with 2+ replicas "
        "(the step runs inside a tf.cond in a while loop).",
        "You must feed a value for placeholder tensor",
        (_TRAINER, "_make_function", "TensorFlowTrainer"),
        "one_step_on_data(next_optional_inputs.get_value())", _multistep.make),
)}


def _check_names(names: Iterable[str], where: str) -> set[str]:
    chosen = {n.strip() for n in names if n and n.strip()}
    if "all" in chosen:
        return set(FIXES)
    unknown = sorted(chosen - set(FIXES))
    if unknown:
        raise ValueError(
            f"Unknown compat fix in {where}. Received: {', '.join(unknown)}; "
            f"accepted: all, {', '.join(FIXES)}"
        )
    return chosen


def _disabled_from_env() -> set[str]:
    if not _env.compat_enabled():
        return set(FIXES)
    return _check_names(_env.compat_disabled(), _env.COMPAT_DISABLE)


def _keras_is_tensorflow() -> bool:
    import keras

    return keras.backend.backend() == "tensorflow"


def apply(*, disable: Iterable[str] | None = None) -> dict[str, str]:
    """Apply every needed fix for Keras 3 under MultiWorkerMirroredStrategy.

    Safe to call many times and under any strategy: a patched function
    behaves exactly like the original unless batches are split across
    replicas (``symbolic-build``: 2+ replicas or multi-worker mode;
    ``scalar-logs``: a ``MultiWorkerMirroredStrategy`` in multi-worker mode;
    ``multi-step``: ``steps_per_execution > 1`` with 2+ replicas).

    Args:
        disable: fix names to leave out (``"all"`` for every fix). Defaults to
            ``MIRRORKIT_COMPAT=off`` (all) / ``MIRRORKIT_COMPAT_DISABLE``
            (comma-separated names), else none. A disabled fix that was
            applied earlier in this process is reverted.

    Returns:
        Fix name -> ``"applied"``, ``"not-needed"`` or ``"disabled"``.

    Raises:
        ValueError: for an unknown fix name.

    Example:
        >>> from mirrorkit import compat
        >>> compat.apply(disable=["scalar-logs"])            # doctest: +SKIP
        {'symbolic-build': 'applied', 'scalar-logs': 'disabled'}
    """
    skip = _disabled_from_env() if disable is None else _check_names(
        [disable] if isinstance(disable, str) else disable, "disable")
    if not _keras_is_tensorflow():
        # Other backends never reach the TF trainer; nothing to patch.
        return {name: NOT_NEEDED for name in FIXES}
    result: dict[str, str] = {}
    for name, fix in FIXES.items():
        if name in skip:
            fix._revert()
            result[name] = DISABLED
        elif fix.needed():
            fix._apply()
            result[name] = APPLIED
        else:
            result[name] = NOT_NEEDED
    logger.info("mirrorkit.compat: %s", ", ".join(f"{k}={v}" for k, v in result.items()))
    return result


def status() -> dict[str, str]:
    """Report each fix as ``"applied"``, ``"not-needed"`` or ``"not-applied"``.

    Example:
        >>> from mirrorkit import compat
        >>> compat.status()                                  # doctest: +SKIP
        {'symbolic-build': 'not-applied', 'scalar-logs': 'not-applied'}
    """
    out = {}
    for name, fix in FIXES.items():
        if fix.is_applied():
            out[name] = APPLIED
        else:
            out[name] = NOT_APPLIED if fix.needed() else NOT_NEEDED
    return out


# Defaults of the failure-detection bounds (seconds). The heartbeat timeout is
# TensorFlow's own default; the join timeout replaces TF's one-hour wait for
# workers that never start with something a person notices.
DEFAULT_PEER_TIMEOUT = 10.0
DEFAULT_JOIN_TIMEOUT = 300.0
# Documented bound: a surviving worker exits within peer_timeout + this many
# seconds of losing a peer (detection <= peer_timeout plus ~1-3 s to unwind
# fit and shut TensorFlow down; the rest is headroom for a loaded machine).
EXIT_MARGIN = 10.0


def configure_failure_detection(
    *,
    peer_timeout: float | None = None,
    join_timeout: float | None = None,
) -> dict[str, float]:
    """Bound how long a multi-worker process can wait for a lost peer.

    Configures TensorFlow's coordination service (the one
    ``MultiWorkerMirroredStrategy`` would start with defaults) before the
    strategy is created:

    * A peer whose process ends (crash, ``kill -9``, machine reboot) makes
      every other worker raise ``tf.errors.UnavailableError`` from the
      current collective, measured 0.1-2.5 s on loopback, and at most
      ``peer_timeout``.
    * A peer that is alive but frozen (``SIGSTOP``, swapped out, network cut)
      stops sending heartbeats: the others raise ``UnavailableError`` /
      ``DeadlineExceededError`` after about ``peer_timeout`` (measured 7-10 s
      at the default 10 s).
    * A worker that never starts: the others fail at strategy creation after
      ``join_timeout`` (TensorFlow alone was still waiting after 90 s; its
      default registration timeout is an hour).

    The documented bound: a surviving worker whose ``fit`` is interrupted
    exits non-zero within ``peer_timeout + EXIT_MARGIN`` (10 + 10 = 20 s by
    default) of losing a peer; measured 2.8-7.7 s with ``peer_timeout=5``.

    No per-collective deadline is set
    (``CommunicationOptions(timeout_seconds=...)``): TensorFlow implements it
    with one thread per collective and it would abort legitimately slow
    steps (the chief writing a large checkpoint while the others wait);
    heartbeats detect lost peers without that cost. Pass your own
    ``communication_options`` to the strategy if you want it.

    Uses TensorFlow's private ``context.configure_coordination_service``
    (there is no public API for these settings); when that is unavailable it
    logs a warning and TensorFlow's defaults apply. Does nothing outside a
    chief/worker TF_CONFIG cluster, or when a coordination service is already
    configured (idempotent).

    Args:
        peer_timeout: seconds without heartbeats before a peer counts as
            lost. Defaults to ``MIRRORKIT_COLLECTIVE_TIMEOUT``, else 10.
        join_timeout: seconds to wait at start-up for every worker to join.
            Defaults to ``MIRRORKIT_JOIN_TIMEOUT``, else 300.

    Returns:
        The settings applied, ``{"peer_timeout": ..., "join_timeout": ...}``,
        or ``{}`` when nothing was configured.

    Example:
        >>> from mirrorkit import compat
        >>> compat.configure_failure_detection(peer_timeout=20)   # doctest: +SKIP
        {'peer_timeout': 20.0, 'join_timeout': 300.0}
        >>> strategy = tf.distribute.MultiWorkerMirroredStrategy()  # doctest: +SKIP
    """
    peer = _seconds(peer_timeout, "peer_timeout", _env.collective_timeout, DEFAULT_PEER_TIMEOUT)
    join = _seconds(join_timeout, "join_timeout", _env.join_timeout, DEFAULT_JOIN_TIMEOUT)
    import tensorflow as tf

    try:
        from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
        from tensorflow.python.distribute import multi_worker_util
        from tensorflow.python.eager import context
    except ImportError as err:  # pragma: no cover - depends on TF internals
        logger.warning("mirrorkit: cannot bound peer-failure waits (%s); "
                       "TensorFlow defaults apply.", err)
        return {}
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    cluster = resolver.cluster_spec()
    if resolver.task_type not in ("chief", "worker") or not cluster.jobs:
        return {}
    ctx = context.context()
    if ctx.coordination_service is not None or ctx._context_handle is not None:
        # Already configured (idempotent), or too late: the runtime started and
        # creating the strategy will raise its own clear error.
        return {}
    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster.num_tasks(job))
            for job in ("chief", "worker") if job in cluster.jobs]
    try:
        ctx.configure_coordination_service(
            service_type="standalone",
            service_leader=multi_worker_util.coordination_leader(cluster),
            coordinated_jobs=jobs,
            heartbeat_timeout_in_ms=int(peer * 1000),
            cluster_register_timeout_in_ms=int(join * 1000),
        )
        # Without the barrier, registration returns at once and the wait for
        # absent peers happens later with no deadline at all.
        ctx.coordination_service.cluster_register_with_barrier = True
    except (AttributeError, TypeError, ValueError) as err:  # pragma: no cover
        logger.warning("mirrorkit: cannot bound peer-failure waits (%s); "
                       "TensorFlow defaults apply.", err)
        return {}
    return {"peer_timeout": peer, "join_timeout": join}


def _seconds(value: float | None, name: str, from_env: Callable[[], float | None],
             default: float) -> float:
    if value is None:
        value = from_env()
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            f"{name} must be a positive number of seconds. Received: {name}={value!r}")
    return float(value)


def revert() -> None:
    """Undo every applied fix (restores Keras's own functions; for tests).

    Example:
        >>> from mirrorkit import compat
        >>> compat.revert()                                  # doctest: +SKIP
    """
    for fix in FIXES.values():
        fix._revert()
