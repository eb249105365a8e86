"""Bounded waits for lost peers in multi-worker training.

TensorFlow alone waits up to an hour for a worker that never starts and
notices a frozen peer only at its heartbeat timeout; this module configures
the coordination service before the strategy exists so both are bounded
(``MIRRORKIT_COLLECTIVE_TIMEOUT``, ``MIRRORKIT_JOIN_TIMEOUT``).

Example:
    >>> from mirrorkit.distribute.failure_detection import configure_failure_detection
    >>> configure_failure_detection(peer_timeout=20)   # doctest: +SKIP
    {'peer_timeout': 20.0, 'join_timeout': 300.0}
"""

from __future__ import annotations

import logging
from typing import Callable

from mirrorkit import _env
from mirrorkit.distribute import peer_loss
from mirrorkit.errors import UserInputError

# The defaults of the bounds (seconds) and the documented exit margin live in
# the launcher-to-worker protocol: the launcher's rendezvous waits by the same
# join timeout. Re-exported here, where they were first documented.
from mirrorkit.protocol import (  # noqa: F401
    DEFAULT_JOIN_TIMEOUT,
    DEFAULT_PEER_TIMEOUT,
    EXIT_MARGIN,
)

logger = logging.getLogger(__name__)


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
        >>> from mirrorkit.distribute.failure_detection import configure_failure_detection
        >>> configure_failure_detection(peer_timeout=20)   # doctest: +SKIP
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
    # A lost peer then ends this worker with one line, not a gRPC traceback.
    peer_loss.install(heartbeat_timeout=peer)
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
        raise UserInputError(
            f"{name} must be a positive number of seconds. Received: {name}={value!r}")
    return float(value)
