"""Create this process's ``tf.distribute`` strategy once, and describe it.

:func:`get_strategy` gathers the facts (environment, GPUs, the cluster from
TF_CONFIG or Slurm), asks :func:`mirrorkit.distribute.selection.select` what
to use, configures devices and creates the strategy once per process;
:func:`describe` turns any strategy into a :class:`Runtime`.

Example:
    >>> resolve("default").kind
    'default'
"""

from __future__ import annotations

import logging
from typing import Any

from mirrorkit import _env
from mirrorkit.distribute import devices, slurm
from mirrorkit.distribute.cluster import ClusterSpec, parse_tf_config
from mirrorkit.distribute.runtime import Runtime
from mirrorkit.distribute.selection import KINDS, Selection, check_kind, select
from mirrorkit.errors import RunError, UserInputError

logger = logging.getLogger(__name__)


# The strategy this process created, and the selection behind it. Devices and
# collectives can be configured only once per process, so it is created once.
_STATE: dict[str, Any] = {"selection": None, "strategy": None}


def _cluster_from_env() -> tuple[ClusterSpec | None, str]:
    # TF_CONFIG wins (explicit, and what `mirrorkit launch` and Kubeflow set);
    # else an `srun` step with 2+ tasks derives the same cluster on every task.
    text = _env.tf_config_text()
    if text is not None:
        spec = parse_tf_config(text)
        # A TF_CONFIG this process exported from Slurm (below) is still Slurm's.
        source = "slurm" if _env.get(_env.SLURM_DERIVED) == spec.to_json() else "TF_CONFIG"
        return spec, source
    task = slurm.current()
    if task is None or task.cluster.num_workers < 2:
        return None, "TF_CONFIG"
    # TensorFlow's MultiWorkerMirroredStrategy (and user code) read TF_CONFIG
    # and CUDA_VISIBLE_DEVICES themselves, so the derived values are exported
    # before any strategy or device exists.
    _env.export({**task.environ(), _env.SLURM_DERIVED: task.cluster.to_json()})
    return task.cluster, "slurm"


def _create(tf: Any, sel: Selection) -> Any:
    if sel.kind == "default":
        # No fix applies without a strategy, but a misspelt name in
        # MIRRORKIT_COMPAT_DISABLE gets the same one-line error as elsewhere.
        from mirrorkit.compat import registry

        registry.disabled_by_environment()
        return tf.distribute.get_strategy()
    if sel.kind == "mirrored":
        if sel.gpus:
            strategy = tf.distribute.MirroredStrategy()
        else:
            n = sel.simulate_cpus or 1
            if sel.simulate_cpus:
                devices.configure_cpus(tf, n)
            strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
        # Keras 3 fails under any strategy in places (gradient accumulation,
        # keras#20582) and under 2+ replicas in more (keras#20585); each fix
        # is a no-op where its bug cannot show.
        from mirrorkit.distribute.fixes import apply_fixes

        apply_fixes(strategy=strategy)
        return strategy
    return _create_multi_worker(tf)


def _create_multi_worker(tf: Any) -> Any:
    # Lazy: the fixes import Keras, which only multi-worker runs need here.
    from mirrorkit.distribute.failure_detection import (
        DEFAULT_JOIN_TIMEOUT,
        configure_failure_detection,
    )
    from mirrorkit.distribute.fixes import apply_fixes

    # Bounded waits for lost peers must be configured before the runtime
    # starts, i.e. before the strategy exists (MIRRORKIT_COLLECTIVE_TIMEOUT,
    # MIRRORKIT_JOIN_TIMEOUT; see distribute.failure_detection).
    configure_failure_detection()
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    except (RuntimeError, ValueError) as err:
        raise RunError(
            "Cannot create MultiWorkerMirroredStrategy: "
            f"{str(err).splitlines()[0] if str(err) else type(err).__name__}. "
            "It must be created before any other TensorFlow op: call "
            "mirrorkit.get_strategy() first thing in your script."
        ) from err
    except tf.errors.OpError as err:
        # Typically DeadlineExceeded: not every worker joined in time.
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        missing = [ln for ln in lines if ln.startswith("/job:")]
        raise RunError(
            "Cannot form the multi-worker cluster: "
            f"{lines[0] if lines else type(err).__name__}"
            + (f" Missing: {', '.join(missing)}." if missing else "")
            + " Every task in TF_CONFIG must start within MIRRORKIT_JOIN_TIMEOUT "
            f"seconds (default {DEFAULT_JOIN_TIMEOUT:.0f}) and reach the "
            "others' host:port."
        ) from err
    # Keras 3 fit/evaluate fail under MWMS without these (keras#20585);
    # MIRRORKIT_COMPAT=off leaves Keras untouched.
    apply_fixes(strategy=strategy)
    return strategy


def resolve(kind: str | None = None, *, simulate_cpus: int | None = None) -> Selection:
    """Gather the facts (environment, GPUs) and return :func:`select`'s decision.

    Explicit arguments win, then ``MIRRORKIT_STRATEGY`` /
    ``MIRRORKIT_SIMULATE_CPUS``, then ``"auto"`` / no simulation. Listing
    physical GPUs does not initialise TensorFlow's runtime.

    Example:
        >>> resolve("default").kind
        'default'
    """
    if kind is None and _env.strategy_kind() is not None:
        kind = _env.strategy_kind()
        if kind not in KINDS:
            raise UserInputError(
                f"Unknown strategy kind in {_env.STRATEGY}. Received: "
                f"{_env.STRATEGY}={kind!r}; accepted: {', '.join(KINDS)}")
    kind = kind or "auto"
    check_kind(kind)
    env_simulate = _env.simulate_cpus()
    if simulate_cpus is None:
        simulate_cpus = env_simulate
    # Name the source the user actually set, so the reason points at it.
    source = _env.SIMULATE_CPUS if simulate_cpus == env_simulate else "simulate_cpus"
    cluster, cluster_source = _cluster_from_env()
    _env.quiet_tensorflow()
    import tensorflow as tf

    gpus = len(tf.config.list_physical_devices("GPU"))
    return select(kind, gpus=gpus, simulate_cpus=simulate_cpus, cluster=cluster,
                  cluster_source=cluster_source, simulate_source=source)


def get_strategy(kind: str | None = None, *, simulate_cpus: int | None = None) -> Any:
    """Return the ``tf.distribute.Strategy`` for this process, creating it once.

    Call it before any other TensorFlow op: simulated devices and
    multi-worker collectives can only be configured before TensorFlow's
    runtime starts.

    Args:
        kind: ``"auto"`` (default), ``"default"``, ``"mirrored"`` or
            ``"multi_worker"``. Falls back to ``MIRRORKIT_STRATEGY``, then auto.
        simulate_cpus: split a GPU-less CPU into this many logical devices.
            Falls back to ``MIRRORKIT_SIMULATE_CPUS``, then none.

    Returns:
        The strategy. Never None: on a plain CPU it is the default strategy.

    Raises:
        UserInputError: for a bad kind, simulate count or ``TF_CONFIG``.
        RuntimeError: when it is too late to configure devices, or a different
            strategy was already created in this process.

    Example:
        >>> import mirrorkit
        >>> strategy = mirrorkit.get_strategy()          # doctest: +SKIP
        >>> strategy.num_replicas_in_sync                # doctest: +SKIP
        1
    """
    sel = resolve(kind, simulate_cpus=simulate_cpus)
    prior = _STATE["selection"]
    if prior is not None:
        if (prior.kind, prior.simulate_cpus, prior.cluster) == (sel.kind, sel.simulate_cpus, sel.cluster):
            return _STATE["strategy"]
        raise RunError(
            f"This process already created a {prior.kind!r} strategy "
            f"({prior.reason}); it cannot switch to {sel.kind!r} "
            f"({sel.reason}). Start a new process to change strategies."
        )
    import tensorflow as tf

    strategy = _create(tf, sel)
    _STATE["selection"], _STATE["strategy"] = sel, strategy
    logger.info("mirrorkit: %s", describe(strategy).summary())
    return strategy


def created_strategy() -> Any | None:
    """Return the strategy :func:`get_strategy` created in this process, or None.

    Unlike :func:`get_strategy` it never creates one, so it is safe to call
    from code that must not initialise TensorFlow devices.

    Example:
        >>> created_strategy() is None or hasattr(created_strategy(), "scope")
        True
    """
    return _STATE["strategy"]


def _strategy_name(strategy: Any) -> str:
    name = type(strategy).__name__
    if "MultiWorker" in name or "CollectiveAll" in name:
        return "multi_worker"
    if "Mirrored" in name:
        return "mirrored"
    if "OneDevice" in name:
        return "one_device"
    return "default"


def describe(strategy: Any | None = None) -> Runtime:
    """Describe ``strategy`` (default: the one mirrorkit created) as a :class:`Runtime`.

    Works for strategies mirrorkit did not create too (the reason then says so).

    Example:
        >>> import mirrorkit
        >>> mirrorkit.describe(mirrorkit.get_strategy()).replicas  # doctest: +SKIP
        1
    """
    import tensorflow as tf

    sel = _STATE["selection"]
    if strategy is None:
        strategy = _STATE["strategy"] or tf.distribute.get_strategy()
    ours = strategy is _STATE["strategy"] and sel is not None
    name = _strategy_name(strategy)
    try:
        devices = tuple(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy has no worker_devices
        devices = ()
    if not devices:
        devices = tuple(d.name for d in tf.config.list_logical_devices()
                        if d.device_type in ("CPU", "GPU"))[:1]
    resolver = getattr(strategy, "cluster_resolver", None)
    task_type, task_index, workers, is_chief = None, 0, 1, True
    source = None
    if ours and sel.cluster is not None and name == "multi_worker":
        spec = sel.cluster
        task_type, task_index, workers, is_chief = (
            spec.task_type, spec.task_index, spec.num_workers, spec.is_chief)
        source = sel.cluster_source
    elif resolver is not None and getattr(resolver, "task_type", None):
        task_type, task_index = resolver.task_type, int(resolver.task_id or 0)
        workers = max(1, int(getattr(strategy.extended, "_num_workers", 1)))
        is_chief = bool(strategy.extended.should_checkpoint)
    reason = sel.reason if ours else f"{type(strategy).__name__} created outside mirrorkit"
    return Runtime(
        strategy=name,
        replicas=int(strategy.num_replicas_in_sync),
        workers=workers,
        task_type=task_type,
        task_index=task_index,
        is_chief=is_chief,
        devices=devices,
        reason=reason,
        cluster_source=source,
    )


def _reset() -> None:
    """Forget the created strategy (tests only; devices stay configured)."""
    _STATE["selection"], _STATE["strategy"] = None, None
