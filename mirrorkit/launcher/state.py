"""Where workers and runs are: the state enum, a worker's failure, a run's result.

Example:
    >>> WorkerState.FAILED == "FAILED"
    True
"""

from __future__ import annotations

import dataclasses
import enum
import signal
from typing import Mapping

from mirrorkit.protocol import ExitCode, parse_lost_peer, signal_exit_code


class WorkerState(str, enum.Enum):
    """Where a worker (or, for :attr:`RunResult.state`, the whole run) is.

    Attributes:
        INIT: being created: ports chosen, process not started yet.
        HEALTHY: the process is running.
        SUCCEEDED: exited with code 0 (a run: every worker did).
        FAILED: exited non-zero or was killed by a signal the launcher did not
            send (a run: a worker failed and no restart was left).
        STOPPED: stopped by the launcher, because a peer failed or the
            launcher itself was interrupted (a run: interrupted by a signal).

    Example:
        >>> WorkerState.FAILED == "FAILED"
        True
    """

    INIT = "INIT"
    HEALTHY = "HEALTHY"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"


@dataclasses.dataclass(frozen=True)
class WorkerFailure:
    """The first worker to fail in one attempt.

    Attributes:
        rank: the worker's global rank (its ``TF_CONFIG`` task index).
        pid: its process id.
        returncode: as :class:`subprocess.Popen` reports it (``-9``: SIGKILL).
        restart: the restart count of its attempt (0 for the first).
        tail: its last output lines (stdout and stderr interleaved).

    Example:
        >>> WorkerFailure(rank=1, pid=42, returncode=-9, restart=0, tail=()).describe()
        'worker 1 (pid 42) was killed by SIGKILL'
    """

    rank: int
    pid: int
    returncode: int
    restart: int
    tail: tuple[str, ...]

    @property
    def signal_name(self) -> str | None:
        """``"SIGKILL"`` style name when a signal ended it, else None."""
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    @property
    def exit_code(self) -> int:
        """Shell-style status: the exit code, or 128 + N for signal N."""
        return self.returncode if self.returncode >= 0 else signal_exit_code(-self.returncode)

    @property
    def lost_peer(self) -> str | None:
        """The worker's one-line account of a lost peer, when it died of one.

        The line is :func:`mirrorkit.protocol.format_lost_peer`'s, found by
        :func:`~mirrorkit.protocol.parse_lost_peer`: the worker's last such line.
        """
        found = [peer.line for peer in map(parse_lost_peer, self.tail) if peer is not None]
        return found[-1] if found else None

    @property
    def how(self) -> str:
        """How it ended, without the verb: ``"killed by SIGKILL"``, ``"exited with code 1"``."""
        return (f"killed by {self.signal_name}" if self.signal_name
                else f"exited with code {self.returncode}")

    def describe(self) -> str:
        """One phrase: who failed and how."""
        verb = "was " if self.signal_name else ""
        return f"worker {self.rank} (pid {self.pid}) {verb}{self.how}"


@dataclasses.dataclass(frozen=True)
class RunResult:
    """How a launch ended, with the root cause when it failed.

    Attributes:
        state: ``SUCCEEDED``, ``FAILED`` (out of restarts) or ``STOPPED``
            (the launcher was interrupted).
        exit_code: what ``mirrorkit launch`` exits with: 0; the failed
            worker's status (128 + N for signal N); or 128 + the signal that
            stopped the launcher (130 for Ctrl-C, 143 for SIGTERM).
        restarts: whole-group restarts performed.
        failures: the first failure of every failed attempt, in order.
        worker_states: final state of each worker of the last attempt, by rank.
        signal: name of the signal that stopped the launcher, if any.
        elapsed: seconds from start to end.
        note: a line that leads a failure's summary when the attempts alone do
            not explain it: too few workers left for ``--min-workers``, or
            another node's failure (multi-node elastic). Defaults to None.
        workers: one line per worker of this node on its speed (throughput,
            local step time), from what the workers reported
            (:mod:`mirrorkit.launcher.worker_status`). Defaults to none.

    Example:
        >>> RunResult(WorkerState.SUCCEEDED, 0, 0, (), {0: WorkerState.SUCCEEDED},
        ...           None, 1.0).summary()
        'all 1 worker(s) succeeded in 1.0 s (0 restarts)'
    """

    state: WorkerState
    exit_code: int
    restarts: int
    failures: tuple[WorkerFailure, ...]
    worker_states: Mapping[int, WorkerState]
    signal: str | None
    elapsed: float
    note: str | None = None
    workers: tuple[str, ...] = ()

    @property
    def root_cause(self) -> WorkerFailure | None:
        """The failure that ended the run (the last attempt's first failure)."""
        return self.failures[-1] if self.state is WorkerState.FAILED and self.failures else None

    def summary(self) -> str:
        """A human-readable account: outcome, root cause and its last output lines."""
        speeds = "".join(f"\n  {line}" for line in self.workers)
        if self.state is WorkerState.SUCCEEDED:
            missed = (f"; target(s) missed, exit code {int(ExitCode.TARGET_MISSED)}"
                      if self.exit_code == ExitCode.TARGET_MISSED else "")
            return (f"all {len(self.worker_states)} worker(s) succeeded in "
                    f"{self.elapsed:.1f} s ({self.restarts} restarts){missed}{speeds}")
        if self.state is WorkerState.STOPPED:
            return (f"stopped by {self.signal} after {self.elapsed:.1f} s; every worker "
                    f"was stopped ({self.restarts} restarts)")
        cause = self.root_cause
        # A lost peer is the real cause of its survivors' failure: lead with it.
        lost = [f"worker {cause.rank} reports: {cause.lost_peer}"] if (
            cause is not None and cause.lost_peer) else []
        lines = [*([self.note] if self.note else []), *lost,
                 f"FAILED after {self.restarts} restart(s) in {self.elapsed:.1f} s.",
                 f"Root cause: {cause.describe()}, the first worker to fail in "
                 f"attempt {cause.restart + 1}." if cause else "Root cause: unknown."]
        for earlier in self.failures[:-1]:
            lines.append(f"Earlier: attempt {earlier.restart + 1}: {earlier.describe()}.")
        if cause is not None:
            lines.append(f"Last {len(cause.tail)} output line(s) of worker {cause.rank}:")
            lines.extend(f"  {line}" for line in cause.tail)
        return "\n".join(lines) + speeds
