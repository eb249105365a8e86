"""The workers of one attempt on this machine: environment, start, stop.

Each worker gets its ``TF_CONFIG``, the restart count, its original rank,
why the group restarted, unbuffered output, its share of the cores and GPUs,
and mirrorkit's site hook on ``PYTHONPATH``; a stop sends SIGTERM, then
SIGKILL after a grace period, to every worker's process group. Which workers
run, and as which rank, is the attempt's
:class:`~mirrorkit.launcher.membership.View` (all of them, unless an elastic
job lost some).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import IO, Callable, Mapping

from mirrorkit import _env, protocol
from mirrorkit.distribute.cluster import build_tf_config
from mirrorkit.distribute.devices import cores_each, visible_devices
from mirrorkit.launcher.bootstrap import SITE_DIR
from mirrorkit.launcher.isolation import NetworkIsolation
from mirrorkit.launcher.membership import Blame, View
from mirrorkit.launcher.ports import check_ports_free, free_ports
from mirrorkit.launcher.process import WorkerProcess, killpg
from mirrorkit.launcher.spec import LaunchSpec
from mirrorkit.launcher.state import WorkerFailure, WorkerState

logger = logging.getLogger(__name__)

# Bound on waiting for a SIGKILLed process to be reaped; only a stuck kernel exceeds it.
_REAP_TIMEOUT = 30.0


def worker_threads(nproc: int, env: Mapping[str, str]) -> int | None:
    """Intra-op threads per worker when ``nproc`` workers share this machine.

    TensorFlow gives each process an intra-op pool of all cores, so N local
    workers oversubscribe the CPU N times (the same reasoning as torchrun's
    ``OMP_NUM_THREADS=1``; see :func:`mirrorkit.distribute.devices.share_cores`). The
    launcher exports ``TF_NUM_INTRAOP_THREADS`` = cores // N (at least 1),
    unless ``env`` already sets it or there is one worker.

    Example:
        >>> worker_threads(1, {}) is None, worker_threads(2, {"TF_NUM_INTRAOP_THREADS": "4"})
        (True, None)
        >>> worker_threads(2, {}) >= 1
        True
    """
    if nproc <= 1 or env.get(protocol.TF_INTRA_OP_THREADS):
        return None
    return cores_each(nproc)


class WorkerGroup:
    """The workers of one attempt on this node."""

    def __init__(self, spec: LaunchSpec, view: View, argv: list[str],
                 streams: tuple[IO[str], IO[str]], wake: threading.Event,
                 isolation: NetworkIsolation | None = None) -> None:
        restart = view.attempt
        self.restart = restart
        self.view = view
        self.workers: list[WorkerProcess] = []
        self._stopped = False
        # Survivors keep their original slot: a fixed port (and a host) is a
        # promise to the other nodes, which renumber to the same view.
        local_members = [m for m in view.members if m in spec.local_ranks]
        slots = [spec.local_ranks.index(m) for m in local_members]
        fixed = spec.fixed_ports()
        if fixed is not None:
            check_ports_free([fixed[j] for j in slots])
            everyone = spec.node_addresses()
            self.addresses = [everyone[m] for m in view.members]
        else:
            self.addresses = spec.node_addresses(free_ports(len(view.members)))
        addresses = self.addresses
        base_env = _env.snapshot()
        base_env.update(spec.env)
        if isolation is not None:
            base_env.update(isolation.env(base_env))
        parent_devices = base_env.get(protocol.CUDA_VISIBLE_DEVICES)
        log_dir = Path(spec.log_dir) if spec.log_dir else None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        lock = threading.Lock()
        local = ", ".join(addresses[view.rank_of(m)] for m in local_members)
        logger.info("starting %d worker(s), attempt %d of at most %d: %s",
                    len(local_members), restart + 1, spec.max_restarts + 1, local)
        threads = worker_threads(len(local_members), base_env)
        if threads and restart == 0:
            logger.info("each worker gets %d intra-op thread(s) (%s=%d: %d workers share this "
                        "machine's cores; set it yourself to override)",
                        threads, protocol.TF_INTRA_OP_THREADS, threads, len(local_members))
        try:
            for j, original in zip(slots, local_members):
                rank = view.rank_of(original)
                # The worker's side of mirrorkit.protocol: _env reads these back.
                env = dict(base_env)
                env[protocol.TF_CONFIG] = build_tf_config(addresses, rank)
                env[protocol.RESTART_COUNT] = str(restart)
                env[protocol.ORIGINAL_RANK] = str(original)
                if view.reason:
                    env[protocol.RESTART_REASON] = view.reason
                if spec.elastic_batch:
                    env[protocol.ELASTIC_BATCH] = spec.elastic_batch
                # Live output: Python workers must not block-buffer into the pipe.
                env["PYTHONUNBUFFERED"] = "1"
                if threads:
                    env[protocol.TF_INTRA_OP_THREADS] = str(threads)
                # Python workers that never import mirrorkit still get its Keras
                # fixes (mirrorkit.launcher.autofix); MIRRORKIT_COMPAT=off turns them off.
                env["PYTHONPATH"] = os.pathsep.join(
                    filter(None, [str(SITE_DIR), base_env.get("PYTHONPATH")]))
                if spec.gpus_per_worker:
                    env[protocol.CUDA_VISIBLE_DEVICES] = visible_devices(
                        j, spec.gpus_per_worker, parent_devices)
                # Named by original rank: one file per worker, whatever its rank now.
                log = log_dir / f"worker-{original}.log" if log_dir else None
                self.workers.append(WorkerProcess(
                    rank, argv, env, restart, streams, lock, wake, log,
                    enter=isolation.enter if isolation is not None else None))
        except BaseException:
            self.stop(0.0)
            raise

    def observe(self) -> WorkerState:
        """SUCCEEDED when all did, FAILED when any failed, else HEALTHY."""
        states = [w.observe() for w in self.workers]
        if all(s is WorkerState.SUCCEEDED for s in states):
            return WorkerState.SUCCEEDED
        if WorkerState.FAILED in states:
            return WorkerState.FAILED
        return WorkerState.HEALTHY

    @property
    def targets_missed(self) -> bool:
        """A worker finished and reported missed targets (``mirrorkit train --target``)."""
        return any(w.targets_missed for w in self.workers)

    def first_failure(self) -> WorkerFailure:
        """The failed worker that exited first (the attempt's root cause here)."""
        failed = [w for w in self.workers if w.state is WorkerState.FAILED]
        return min(failed, key=lambda w: w.exit_time or 0.0).failure()

    def blame(self, failure: WorkerFailure) -> Blame:
        """``failure`` in the job's terms: original rank, address and cause."""
        return Blame(self.view.members[failure.rank], failure.rank,
                     self.addresses[failure.rank], failure.how)

    def stop(self, grace: float, urgent: Callable[[], bool] = lambda: False) -> None:
        """SIGTERM every running worker's group, SIGKILL after ``grace``; reap all.

        Idempotent: a second call must not signal process groups whose ids
        the system may have handed out again.
        """
        if self._stopped:
            return
        self._stopped = True
        alive = [w for w in self.workers if not w.exited.is_set()]
        for worker in alive:
            worker.stopping = True
            killpg(worker.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for worker in alive:
            while not urgent() and time.monotonic() < deadline:
                if worker.exited.wait(min(0.05, max(deadline - time.monotonic(), 0))):
                    break
        # Every worker's group, exited or not: nothing a worker started may outlive it.
        for worker in self.workers:
            killpg(worker.proc.pid, signal.SIGKILL)
        for worker in self.workers:
            worker.exited.wait(_REAP_TIMEOUT)
            worker.observe()
            worker.drain()

    def states(self) -> dict[int, WorkerState]:
        return {w.rank: w.observe() for w in self.workers}
