"""Start N workers with their ``TF_CONFIG``, stream their output, restart the group on failure.

The structure follows torchrun's elastic agent: a frozen
:class:`~mirrorkit.launcher.spec.LaunchSpec` says what to run,
:class:`~mirrorkit.launcher.state.WorkerState` names where each worker is,
one monitor loop in :func:`launch` watches the group, a failure stops and
restarts the *whole* group (MultiWorkerMirroredStrategy cannot replace one
member of a running cluster), the restart count reaches workers as
``MIRRORKIT_RESTART_COUNT``, and the run ends in a
:class:`~mirrorkit.launcher.state.RunResult` whose root cause names the
worker that failed first.

The launcher talks to workers only through what :mod:`mirrorkit.protocol`
defines (environment variables, exit codes, output lines, status files) and
never imports TensorFlow, so it starts in well under a second.

Example:
    >>> spec = LaunchSpec(command=("python", "train.py"), nproc=2, max_restarts=1)
    >>> result = launch(spec)                       # doctest: +SKIP
    >>> result.state, result.exit_code              # doctest: +SKIP
    (<WorkerState.SUCCEEDED: 'SUCCEEDED'>, 0)
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable

from mirrorkit import _env, protocol
from mirrorkit.errors import RunError, UserInputError
from mirrorkit.launcher import capacity, worker_status
from mirrorkit.launcher.group import WorkerGroup
from mirrorkit.launcher.hosts import check_hosts
from mirrorkit.launcher.isolation import IsolationUnavailable, NetworkIsolation
from mirrorkit.launcher.membership import LocalAgreement
from mirrorkit.launcher.rendezvous import RendezvousClient
from mirrorkit.launcher.scratch import job_root
from mirrorkit.launcher.spec import LaunchSpec
from mirrorkit.launcher.state import RunResult, WorkerFailure, WorkerState

logger = logging.getLogger(__name__)

# Signals that stop the launcher (and with it every worker).
_STOP_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in
                                  ("SIGINT", "SIGTERM", "SIGHUP")) if s is not None)


def _resolve_program(program: str, path: str | None) -> str:
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise UserInputError(f"Command not found or not executable: {program!r}")
        return program
    # Next to the launcher's interpreter first: `python` and `mirrorkit` then
    # mean the launcher's own (virtual) environment even when it is not on PATH.
    sibling = Path(sys.executable).parent / program
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    found = shutil.which(program, path=path)
    if found is None:
        raise UserInputError(
            f"Command not found: {program!r} (looked in {sibling.parent} and on PATH)."
        )
    return found


class _Signals:
    """While active, SIGINT/SIGTERM/SIGHUP are recorded and wake the monitor loop."""

    def __init__(self, wake: threading.Event) -> None:
        self.wake = wake
        self.received: list[int] = []
        self._saved: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        self.received.append(signum)
        self.wake.set()

    def __enter__(self) -> "_Signals":
        # Python only lets the main thread install handlers; from another
        # thread the caller keeps its own signal handling.
        if threading.current_thread() is threading.main_thread():
            for sig in _STOP_SIGNALS:
                self._saved[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._saved.items():
            signal.signal(sig, handler)


def _isolate(scratch: str) -> NetworkIsolation | None:
    """The private network for a single-machine launch, or None (said once) when impossible."""
    try:
        isolation = NetworkIsolation.start(parent=scratch)
    except IsolationUnavailable as err:
        logger.warning("cannot isolate the workers' network here (%s): their TensorFlow "
                       "servers listen on every interface, as plain TensorFlow's do", err)
        return None
    logger.debug("workers run in a private network namespace: their servers listen on its "
                 "loopback only; HTTP(S) goes out through the launcher")
    return isolation


def launch(spec: LaunchSpec, *, stdout: IO[str] | None = None,
           stderr: IO[str] | None = None) -> RunResult:
    """Run ``spec.nproc`` workers as one ``TF_CONFIG`` cluster until they finish.

    Each worker gets ``TF_CONFIG`` (rank 0 is the chief), the restart count
    in ``MIRRORKIT_RESTART_COUNT``, one ``MIRRORKIT_RUN_ID`` and
    ``MIRRORKIT_JOB_START`` for the job, ``PYTHONUNBUFFERED=1``, mirrorkit's
    Keras fixes for Python programs that never import mirrorkit
    (:mod:`mirrorkit.launcher.autofix`, via ``PYTHONPATH``) and, with
    ``gpus_per_worker``, its own ``CUDA_VISIBLE_DEVICES``. Every output line
    is forwarded with a ``[rank] `` prefix. When a worker fails, the others
    are stopped (SIGTERM, SIGKILL after ``grace_period``) and, while restarts
    remain, the whole group starts again. SIGINT/SIGTERM/SIGHUP to the
    launcher stop every worker. Workers run in their own sessions and die
    with the launcher even if it is SIGKILLed, so none is ever left behind.
    Every private folder of the job (workers' stand-ins for the chief's
    paths, status files, the download relay's socket) lives under one scratch
    root, ``MIRRORKIT_SCRATCH_DIR``, removed once the workers are gone, on
    any end (after the launcher's own SIGKILL: by the next launch,
    :mod:`mirrorkit.launcher.scratch`).

    Args:
        spec: what to run.
        stdout: where workers' stdout lines go. Defaults to ``sys.stdout``.
        stderr: where workers' stderr lines go. Defaults to ``sys.stderr``.

    Returns:
        A :class:`RunResult`; ``summary()`` explains a failure.

    Raises:
        UserInputError: command not found, a fixed port in use, too few GPUs, a
            host that does not resolve, a ``node_rank`` whose host is not
            this machine, or more workers than this machine holds usefully
            (:mod:`mirrorkit.launcher.capacity`) without ``oversubscribe``.
        RuntimeError: a restart could not start the new group.

    Example:
        >>> result = launch(LaunchSpec(command=("python", "-c", "print(1)"),
        ...                            nproc=2))    # doctest: +SKIP
        [0] 1
        [1] 1
        >>> result.exit_code                          # doctest: +SKIP
        0
    """
    streams = (stdout or sys.stdout, stderr or sys.stderr)
    capacity.check(spec.nproc, oversubscribe=spec.oversubscribe)
    if spec.hosts is not None:
        # A name that does not resolve, or a node rank that is not this
        # machine, would otherwise surface only at the join timeout.
        check_hosts(spec.node_addresses()[::spec.nproc], spec.node_rank)
        ports = spec.fixed_ports()
        logger.warning("workers listen on every interface of this machine, port(s) %s, and "
                       "TensorFlow's traffic is unauthenticated and unencrypted: keep the "
                       "nodes on a private network or VPN and firewall these ports (README: "
                       "Security)", f"{ports[0]}-{ports[-1]}" if len(ports) > 1 else ports[0])
    # One run id for every worker and every restart, so programs that name
    # their output after it (mirrorkit train's default folder) agree.
    run_id = spec.env.get(protocol.RUN_ID) or _env.run_id() or time.strftime("%Y%m%d-%H%M%S")
    # Taken before the rendezvous, so on every node it precedes every worker's
    # start; kept across restarts: a directory made after it is the job's own
    # (a launched script's mkdir of it succeeds, mirrorkit.runner.job_dirs).
    job_start = spec.env.get(protocol.JOB_START) or f"{time.time():.6f}"
    spec = dataclasses.replace(spec, env={**spec.env, protocol.RUN_ID: run_id,
                                          protocol.JOB_START: job_start})
    worker_path = spec.env.get("PATH", _env.get("PATH"))
    argv = [_resolve_program(spec.command[0], worker_path), *spec.command[1:]]
    start = time.monotonic()
    wake = threading.Event()
    failures: list[WorkerFailure] = []
    with _Signals(wake) as signals, contextlib.ExitStack() as stack:
        # The job's one scratch root: workers put every private folder under it
        # (mirrorkit.training.chief.Scratch), so removing it, the stack's last
        # step, after every worker is reaped, cleans up after SIGKILLed workers
        # too, however the job ends (signals are only recorded while in here).
        scratch = stack.enter_context(job_root())
        # Where workers leave their speed for the final summary (worker_status).
        status = os.path.join(scratch, "status")
        os.mkdir(status)
        spec = dataclasses.replace(spec, env={**spec.env, protocol.STATUS_DIR: status,
                                              protocol.SCRATCH_DIR: scratch})
        try:
            agreement = _agreement(spec, wake, lambda: bool(signals.received))
            stack.callback(agreement.close)
            view = agreement.first_view()
        except RuntimeError:
            if not signals.received:
                raise
            name = signal.Signals(signals.received[0]).name
            return RunResult(WorkerState.STOPPED, protocol.signal_exit_code(signals.received[0]),
                             0, (), {}, name, time.monotonic() - start)
        isolation = (None if spec.hosts is not None or spec.expose_network
                     else _isolate(scratch))
        if isolation is not None:
            stack.callback(isolation.close)
        group = WorkerGroup(spec, view, argv, streams, wake, isolation)
        # Whatever happens below (even a bug or KeyboardInterrupt from a
        # non-main thread), no worker outlives the launcher.
        stack.callback(lambda: group.stop(0.0))

        def result(state: WorkerState, code: int, name: str | None = None,
                   note: str | None = None) -> RunResult:
            return RunResult(state, code, view.attempt, tuple(failures), group.states(), name,
                             time.monotonic() - start, note,
                             tuple(worker_status.lines(worker_status.read(status))))

        # The one monitor loop: sleep until a worker exits, a signal or the
        # rendezvous's stop arrives (or a tick passes), then decide for the whole group.
        while True:
            wake.wait(1.0)
            wake.clear()
            if signals.received:
                name = signal.Signals(signals.received[0]).name
                logger.warning("received %s: stopping %d worker(s)", name, len(group.workers))
                # A second signal means "now": skip the grace period.
                group.stop(spec.grace_period, urgent=lambda: len(signals.received) > 1)
                return result(WorkerState.STOPPED, protocol.signal_exit_code(signals.received[0]),
                              name)
            state = group.observe()
            if state is WorkerState.SUCCEEDED:
                group.stop(0.0)
                agreement.finished()
                code = (protocol.ExitCode.TARGET_MISSED if group.targets_missed
                        else protocol.ExitCode.OK)
                return result(WorkerState.SUCCEEDED, int(code))
            told = agreement.stop_requested(view.attempt)
            if state is not WorkerState.FAILED and not told:
                continue
            failure = group.first_failure() if state is WorkerState.FAILED else None
            if failure is not None:
                failures.append(failure)
                logger.warning("%s; stopping the other worker(s)", failure.describe())
            else:
                logger.warning("the rendezvous reports a failed attempt on another node; stopping "
                               "the worker(s) here")
            group.stop(spec.grace_period, urgent=lambda: bool(signals.received))
            if signals.received:
                continue  # interrupted while stopping: report it as such above
            decision = agreement.after_failure(
                view, group.blame(failure) if failure else None,
                bool(failure and failure.lost_peer))
            if signals.received:
                continue  # interrupted while waiting for the rendezvous
            code = failure.exit_code if failure else int(protocol.ExitCode.FAILED)
            if decision.view is None:
                return result(WorkerState.FAILED, code, note=decision.failed)
            if view.attempt >= spec.max_restarts:
                return result(WorkerState.FAILED, code, note=decision.line and (
                    f"{decision.line}; but no restart is left "
                    f"(--max-restarts {spec.max_restarts})"))
            if decision.line:
                logger.warning("%s", decision.line)
            if not set(decision.view.members) & set(spec.local_ranks):
                return result(WorkerState.FAILED, code, note=(
                    f"{decision.line or 'mirrorkit: this node lost its workers'}; "
                    "none of them runs on this node any more"))
            view = decision.view
            logger.warning("restarting the whole group (restart %d of %d)",
                           view.attempt, spec.max_restarts)
            try:
                group = WorkerGroup(spec, view, argv, streams, wake, isolation)
            except (OSError, ValueError) as err:
                raise RunError(
                    f"Cannot restart the workers: {err} (the previous attempt "
                    f"failed because {decision.view.reason})"
                ) from err


def _agreement(spec: LaunchSpec, wake: threading.Event,
               interrupted: Callable[[], bool]) -> LocalAgreement | RendezvousClient:
    """Who decides the next attempt's members: the rendezvous for multi-node elastic jobs."""
    if spec.hosts is not None and spec.min_workers is not None:
        return RendezvousClient(spec, wake, interrupted)
    return LocalAgreement(spec.world_size, spec.min_workers)
