"""What the workers of a ``mirrorkit launch --ray`` job tell its driver, kept in one place.

Ray places the workers on nodes the driver cannot watch, so each worker sends
its news to one :class:`Journal` (a Ray actor, owned by the driver): its start
(which also counts the attempts: Ray Train's context has no restart count),
its output lines, the failure of its program, its result. The driver takes the
lines to print them as ``[rank] ...`` and, at the end, builds the same
:class:`~mirrorkit.launcher.state.RunResult` a local launch ends with. Plain
Python, no Ray: the actor is this class wrapped by ``ray.remote``.

Example:
    >>> journal = Journal()
    >>> journal.begin(0, "10.0.0.1", 11), journal.begin(1, "10.0.0.2", 12)
    ((0, None), (0, None))
    >>> journal.failed(dict(rank=1, pid=12, returncode=-9, restart=0, tail=[]))
    >>> journal.begin(0, "10.0.0.1", 13)
    (1, 'worker 1 (pid 12, node 10.0.0.2) was killed by SIGKILL')
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from mirrorkit.launcher import worker_status
from mirrorkit.launcher.state import RunResult, WorkerFailure, WorkerState
from mirrorkit.protocol import ExitCode, signal_exit_code


class Journal:
    """The job's record: attempts, where each worker runs, output lines, failures, results."""

    def __init__(self) -> None:
        self._starts: dict[int, int] = {}
        self._nodes: dict[int, str] = {}
        self._lines: list[tuple[str, str]] = []
        self._failures: dict[int, dict[str, Any]] = {}
        self._results: dict[int, dict[str, Any]] = {}
        self._begun = time.monotonic()

    def begin(self, rank: int, node: str, pid: int) -> tuple[int, str | None]:
        """A worker starts: returns its attempt (0 first) and why the previous one ended."""
        self._starts[rank] = self._starts.get(rank, 0) + 1
        self._nodes[rank] = node
        # Every rank of an attempt starts once: the highest count is the attempt's.
        attempt = max(self._starts.values()) - 1
        if attempt and attempt not in {r["attempt"] for r in self._results.values()}:
            # A new attempt's results replace the previous attempt's.
            self._results = {k: v for k, v in self._results.items() if v["attempt"] >= attempt}
        before = self._failures.get(attempt - 1)
        return attempt, self.describe(before) if before else None

    def node(self, rank: int) -> str:
        """Where worker ``rank`` runs (its node's address), ``"?"`` before it started."""
        return self._nodes.get(rank, "?")

    def describe(self, failure: dict[str, Any]) -> str:
        """One phrase naming the worker, its node (where it failed) and how its program ended."""
        text = _failure(failure).describe()
        node = failure.get("node") or self.node(failure["rank"])
        return text.replace(f"(pid {failure['pid']})", f"(pid {failure['pid']}, node {node})")

    def lines(self, batch: list[tuple[str, str]]) -> None:
        """Output lines, each ``(stream, text)`` with stream ``"out"`` or ``"err"``."""
        self._lines.extend(batch)

    def take(self) -> list[tuple[str, str]]:
        """The lines not taken yet, in arrival order."""
        taken, self._lines = self._lines, []
        return taken

    def failed(self, failure: dict[str, Any]) -> None:
        """A worker's program failed (``WorkerFailure`` fields); the first per attempt counts."""
        # The node now: a restart may place this rank elsewhere.
        self._failures.setdefault(failure["restart"],
                                  {**failure, "node": self.node(failure["rank"])})

    def finished(self, rank: int, attempt: int, targets_missed: bool,
                 status: dict[str, Any] | None) -> None:
        """A worker's program succeeded (or finished with missed targets, exit code 3)."""
        self._results[rank] = {"attempt": attempt, "targets_missed": targets_missed,
                               "status": status}

    def attempts(self) -> int:
        """Attempts started so far."""
        return max(self._starts.values(), default=0)

    def result(self, succeeded: bool, note: str | None = None) -> RunResult:
        """The job's :class:`RunResult`, the same account a local launch ends with.

        Args:
            succeeded: Ray Train reported the run finished.
            note: a line leading a failure's summary (Ray's own error, when no
                program failure explains it: a node lost with its workers).

        Example:
            >>> Journal().result(False, "ray: node lost").summary().splitlines()[0]
            'ray: node lost'
        """
        restarts = max(self.attempts() - 1, 0)
        elapsed = time.monotonic() - self._begun
        failures = tuple(_failure(f) for _, f in sorted(self._failures.items()))
        statuses = [r["status"] for _, r in sorted(self._results.items()) if r["status"]]
        speeds = tuple(worker_status.lines(statuses))
        if succeeded:
            missed = any(r["targets_missed"] for r in self._results.values())
            code = ExitCode.TARGET_MISSED if missed else ExitCode.OK
            states = {rank: WorkerState.SUCCEEDED for rank in sorted(self._results)}
            return RunResult(WorkerState.SUCCEEDED, int(code), restarts, failures, states,
                             None, elapsed, None, speeds)
        cause = failures[-1] if failures else None
        code = cause.exit_code if cause else int(ExitCode.FAILED)
        states = {rank: WorkerState.FAILED if cause and rank == cause.rank
                  else WorkerState.STOPPED for rank in sorted(self._nodes)}
        if cause is not None and cause.restart < restarts:
            # The last attempt lost a worker without its program failing (its Ray
            # worker or node died): Ray's error, not an older failure, is the cause.
            code = int(ExitCode.FAILED)
        elif cause is not None:
            note = None  # the failed program's own account says it all
        return RunResult(WorkerState.FAILED, code, restarts, failures, states, None,
                         elapsed, note, speeds)


def _failure(record: dict[str, Any]) -> WorkerFailure:
    fields = {f.name for f in dataclasses.fields(WorkerFailure)}
    return WorkerFailure(**{k: v for k, v in record.items() if k in fields - {"tail"}},
                         tail=tuple(record["tail"]))


def stopped(signum: int, elapsed: float) -> RunResult:
    """The result of a job the driver's user interrupted (Ctrl-C: exit 130).

    Example:
        >>> stopped(2, 1.0).exit_code
        130
    """
    import signal

    return RunResult(WorkerState.STOPPED, signal_exit_code(signum), 0, (), {},
                     signal.Signals(signum).name, elapsed)
