"""This machine's compute devices: cores, simulated CPU replicas, GPU slices.

Pure helpers shared by the strategy (simulated replicas split the cores), the
launcher (local workers split the cores and the GPUs) and Slurm (a task's
GPUs). Nothing here imports TensorFlow; functions that configure it take the
``tf`` module as an argument.

Example:
    >>> cores_each(1) == usable_cores()
    True
    >>> visible_devices(1, 2)
    '2,3'
"""

from __future__ import annotations

import logging
import os
from typing import Any

from mirrorkit import _env
from mirrorkit.errors import RunError, UserInputError

logger = logging.getLogger(__name__)


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


def configure_cpus(tf: Any, n: int) -> None:
    """Split the first physical CPU into ``n`` logical devices and share its cores.

    Raises:
        RuntimeError: when TensorFlow's runtime already started with another count.

    Example:
        >>> import tensorflow as tf            # doctest: +SKIP
        >>> configure_cpus(tf, 2)              # doctest: +SKIP
    """
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
        raise RunError(
            f"Cannot split the CPU into {n} logical devices: TensorFlow's runtime "
            f"is already initialised with {have}. Call mirrorkit.get_strategy() "
            "(or set MIRRORKIT_SIMULATE_CPUS) before any other TensorFlow op, "
            "e.g. first thing in your script."
        ) from err


def visible_devices(index: int, per_worker: int, visible: str | None = None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` value for local worker ``index``.

    Args:
        index: the worker's position on this machine (0-based).
        per_worker: GPUs each worker gets.
        visible: the parent's ``CUDA_VISIBLE_DEVICES``; its entries are
            sliced. None means all of the machine's devices, numbered from 0.

    Returns:
        A comma-separated device list, disjoint from every other worker's.

    Raises:
        UserInputError: when ``visible`` lists too few devices.

    Example:
        >>> visible_devices(1, 2), visible_devices(1, 1, "3,5")
        ('2,3', '5')
    """
    first, end = index * per_worker, (index + 1) * per_worker
    if visible is None:
        return ",".join(str(i) for i in range(first, end))
    listed = [d.strip() for d in visible.split(",") if d.strip()]
    if len(listed) < end:
        raise UserInputError(
            f"Worker {index} needs GPUs {first}..{end - 1} ({per_worker} per worker) "
            f"but CUDA_VISIBLE_DEVICES lists {len(listed)}. "
            f"Received: CUDA_VISIBLE_DEVICES={visible!r}"
        )
    return ",".join(listed[first:end])
