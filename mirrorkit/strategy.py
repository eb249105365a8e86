"""Choose and create the ``tf.distribute`` strategy, and say why.

Selection is split in two so it can be tested without a cluster:
:func:`select` is a pure decision from facts (TF_CONFIG, GPU count, simulated
CPUs); :func:`get_strategy` gathers the facts, configures devices and creates
the strategy once per process.

Example:
    >>> sel = select("auto", gpus=0, simulate_cpus=4)
    >>> sel.kind, sel.replicas
    ('mirrored', 4)
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from mirrorkit import _env
from mirrorkit.cluster import ClusterSpec, parse_tf_config
from mirrorkit.runtime import Runtime

logger = logging.getLogger(__name__)

KINDS = ("auto", "default", "mirrored", "multi_worker")


@dataclasses.dataclass(frozen=True)
class Selection:
    """The decision :func:`select` makes.

    Attributes:
        kind: ``"default"``, ``"mirrored"`` or ``"multi_worker"``.
        reason: why, in one sentence.
        simulate_cpus: logical CPU devices to create, or None.
        gpus: physical GPUs visible.
        cluster: the parsed cluster under TF_CONFIG/Slurm, else None.
        cluster_source: ``"TF_CONFIG"`` or ``"slurm"`` when ``cluster`` is set.
    """

    kind: str
    reason: str
    simulate_cpus: int | None = None
    gpus: int = 0
    cluster: ClusterSpec | None = None
    cluster_source: str | None = None

    @property
    def replicas(self) -> int:
        """Replicas this process will hold (multi-worker: 1 per CPU worker)."""
        if self.kind == "mirrored":
            return self.gpus or self.simulate_cpus or 1
        if self.kind == "multi_worker":
            return max(self.gpus, 1)
        return 1


def _check_kind(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(
            f"Unknown strategy kind. Received: strategy={kind!r}; accepted: "
            f"{', '.join(KINDS)}"
        )
    return kind


def _check_simulate(simulate_cpus: Any) -> int | None:
    if simulate_cpus is None:
        return None
    if isinstance(simulate_cpus, bool) or not isinstance(simulate_cpus, int) or simulate_cpus < 1:
        raise ValueError(
            "simulate_cpus must be a positive integer. "
            f"Received: simulate_cpus={simulate_cpus!r}"
        )
    return simulate_cpus


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def select(
    kind: str = "auto",
    *,
    gpus: int,
    simulate_cpus: int | None = None,
    cluster: ClusterSpec | None = None,
    cluster_source: str = "TF_CONFIG",
    simulate_source: str = "simulate_cpus",
) -> Selection:
    """Decide which strategy to use from the facts, without touching TensorFlow.

    Rules for ``kind="auto"``: a cluster with more than one training task ->
    ``multi_worker``; else 2+ GPUs -> ``mirrored`` over all of them; else one
    GPU -> ``mirrored`` over that GPU; else on CPU -> ``mirrored`` over
    ``simulate_cpus`` logical devices when asked, otherwise ``default``.

    Args:
        kind: one of ``auto``, ``default``, ``mirrored``, ``multi_worker``.
        gpus: number of physical GPUs visible.
        simulate_cpus: split the CPU into this many logical devices when no GPU
            is present.
        cluster: the parsed TF_CONFIG (or Slurm-derived) cluster, if any.
        cluster_source: where ``cluster`` came from, for the reason text.
        simulate_source: where ``simulate_cpus`` came from, for the reason.

    Returns:
        A :class:`Selection`.

    Raises:
        ValueError: for an unknown kind, a bad ``simulate_cpus``, or a cluster
            task mirrorkit cannot train as (``ps``).

    Example:
        >>> select("auto", gpus=2).reason
        '2 GPUs visible'
    """
    _check_kind(kind)
    simulate_cpus = _check_simulate(simulate_cpus)
    if cluster is not None and cluster.task_type == "ps":
        raise ValueError(
            "TF_CONFIG makes this process a parameter server ('ps'); mirrorkit "
            "trains with synchronous all-reduce and has no ps role. Received: "
            "task.type='ps'; accepted: chief, worker"
        )
    sim = simulate_cpus if (simulate_cpus and not gpus) else None
    ignored = ""
    if simulate_cpus and gpus:
        ignored = f"; {simulate_source}={simulate_cpus} ignored because GPUs are present"
    if gpus:
        local = f"{_plural(gpus, 'GPU')} visible"
    elif sim:
        local = f"{simulate_source}={sim} on a CPU-only machine"
    else:
        local = "no GPU visible and no simulated CPUs requested"

    # "slurm names 2 workers" reads oddly; say what the user would say.
    where = {"slurm": "the Slurm step"}.get(cluster_source, cluster_source)
    n_workers = cluster.num_workers if cluster is not None else 0
    multi = cluster is not None and n_workers > 1 and cluster.task_type in ("chief", "worker")
    if kind == "multi_worker" or (kind == "auto" and multi):
        if cluster is None:
            reason = "strategy 'multi_worker' requested without a cluster; one local worker"
            return Selection("multi_worker", reason + ignored, None, gpus)
        reason = (f"{where} names {_plural(n_workers, 'worker')}, "
                  f"this is {cluster.task_type} {cluster.task_index}")
        if sim:
            reason += f"; {simulate_source}={sim} ignored: each CPU worker holds one replica"
        return Selection("multi_worker", reason, None, gpus, cluster, cluster_source)

    if cluster is not None and n_workers <= 1:
        local += f"; {where} names a single worker, training locally"
    elif cluster is not None and cluster.task_type == "evaluator":
        local += f"; {where} makes this the evaluator, which does not join training"
    if kind == "default":
        return Selection("default", f"strategy 'default' requested; {local}{ignored}", None, gpus)
    if kind == "mirrored":
        return Selection("mirrored", f"strategy 'mirrored' requested; {local}{ignored}", sim, gpus)
    if gpus or sim:
        return Selection("mirrored", local + ignored, sim, gpus)
    return Selection("default", local + "; using the default strategy", None, gpus)


# The strategy this process created, and the selection behind it. Devices and
# collectives can be configured only once per process, so it is created once.
_STATE: dict[str, Any] = {"selection": None, "strategy": None}


def _cluster_from_env() -> tuple[ClusterSpec | None, str]:
    # TF_CONFIG wins (explicit, and what `mirrorkit launch` and Kubeflow set);
    # else an `srun` step with 2+ tasks derives the same cluster on every task.
    from mirrorkit import slurm

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


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else all cores).

    Example:
        >>> usable_cores() >= 1
        True
    """
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def cores_each(parts: int) -> int:
    """Cores per part when ``parts`` replicas or workers share this machine (at least 1).

    Example:
        >>> cores_each(10_000)
        1
    """
    return max(1, usable_cores() // parts)


def share_cores(tf: Any, parts: int) -> int | None:
    """Give each TensorFlow op ``usable_cores() // parts`` threads (at least 1).

    For ``parts`` device replicas (or worker processes) that run their ops at
    the same time on one machine's CPU. TensorFlow sizes every op's intra-op
    pool to all cores, so N concurrent replicas ask for N x cores threads:
    they preempt each other and small ops pay Eigen's split-and-join for
    nothing (measured: +50-60 % cnn, +38 % resnet20 throughput at 2 simulated
    replicas on 2 cores; benchmarks/RESULTS.md, P1). Leaves a choice the user
    made alone (``tf.config.threading`` or ``TF_NUM_INTRAOP_THREADS``), and
    does nothing once the runtime has started.

    Returns:
        The thread count set, or None when nothing was changed.

    Example:
        >>> import tensorflow as tf                     # doctest: +SKIP
        >>> share_cores(tf, 2)                          # doctest: +SKIP
        1
    """
    if parts <= 1 or _env.get(_env.TF_INTRA_OP_THREADS):
        return None
    if tf.config.threading.get_intra_op_parallelism_threads():
        return None
    threads = cores_each(parts)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    except RuntimeError:  # the runtime already started: too late, keep TF's choice
        return None
    logger.info("mirrorkit: %d intra-op thread(s) per op for %d replicas on %d cores",
                threads, parts, usable_cores())
    return threads


def _configure_cpus(tf: Any, n: int) -> None:
    cpus = tf.config.list_physical_devices("CPU")
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        )
        # The n simulated devices share the same cores (see share_cores).
        share_cores(tf, n)
    except RuntimeError as err:
        have = len(tf.config.list_logical_devices("CPU"))
        if have == n:
            return
        raise RuntimeError(
            f"Cannot split the CPU into {n} logical devices: TensorFlow's runtime "
            f"is already initialised with {have}. Call mirrorkit.get_strategy() "
            "(or set MIRRORKIT_SIMULATE_CPUS) before any other TensorFlow op, "
            "e.g. first thing in your script."
        ) from err


def _create(tf: Any, sel: Selection) -> Any:
    if sel.kind == "default":
        return tf.distribute.get_strategy()
    if sel.kind == "mirrored":
        if sel.gpus:
            strategy = tf.distribute.MirroredStrategy()
        else:
            n = sel.simulate_cpus or 1
            if sel.simulate_cpus:
                _configure_cpus(tf, n)
            strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
        if strategy.num_replicas_in_sync > 1:
            # Keras 3 fit fails when a global batch splits unevenly over the
            # replicas (keras#20585, symbolic-build); the fix is a no-op otherwise.
            from mirrorkit import compat

            compat.apply()
        return strategy
    return _create_multi_worker(tf)


def _create_multi_worker(tf: Any) -> Any:
    # Lazy: compat imports Keras, which only multi-worker runs need here.
    from mirrorkit import compat

    # Bounded waits for lost peers must be configured before the runtime
    # starts, i.e. before the strategy exists (MIRRORKIT_COLLECTIVE_TIMEOUT,
    # MIRRORKIT_JOIN_TIMEOUT; see compat.configure_failure_detection).
    compat.configure_failure_detection()
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    except (RuntimeError, ValueError) as err:
        raise RuntimeError(
            "Cannot create MultiWorkerMirroredStrategy: "
            f"{str(err).splitlines()[0] if str(err) else type(err).__name__}. "
            "It must be created before any other TensorFlow op: call "
            "mirrorkit.get_strategy() first thing in your script."
        ) from err
    except tf.errors.OpError as err:
        # Typically DeadlineExceeded: not every worker joined in time.
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        missing = [ln for ln in lines if ln.startswith("/job:")]
        raise RuntimeError(
            "Cannot form the multi-worker cluster: "
            f"{lines[0] if lines else type(err).__name__}"
            + (f" Missing: {', '.join(missing)}." if missing else "")
            + " Every task in TF_CONFIG must start within MIRRORKIT_JOIN_TIMEOUT "
            f"seconds (default {compat.DEFAULT_JOIN_TIMEOUT:.0f}) and reach the "
            "others' host:port."
        ) from err
    # Keras 3 fit/evaluate fail under MWMS without these (keras#20585);
    # MIRRORKIT_COMPAT=off leaves Keras untouched.
    compat.apply()
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
            raise ValueError(
                f"Unknown strategy kind in {_env.STRATEGY}. Received: "
                f"{_env.STRATEGY}={kind!r}; accepted: {', '.join(KINDS)}")
    kind = kind or "auto"
    _check_kind(kind)
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
        ValueError: for a bad kind, simulate count or ``TF_CONFIG``.
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
        raise RuntimeError(
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
