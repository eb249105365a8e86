"""Start N real worker processes of one script as a TF_CONFIG cluster on loopback.

Multi-worker behaviour (collectives, chief logic, dead peers) cannot be faked in
one process: each MultiWorkerMirroredStrategy worker is its own process with
its own ``TF_CONFIG``. This helper starts them on free loopback ports, waits
with a deadline and always reaps them -- on success, on timeout and when the
test body raises -- so a failing test never leaves a worker holding a port or a
CPU core.

Each worker's stdout/stderr go to files (not pipes): a chatty worker can never
block on a full pipe while the test waits for it.

Example:
    from workers import WorkerGroup

    with WorkerGroup("train.py", 2, args=["--epochs", "1"]) as group:
        results = group.wait(timeout=120)
    assert all(r.returncode == 0 for r in results), group.report()
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from conftest import clean_env, free_ports

from mirrorkit.distribute.cluster import build_tf_config


@dataclasses.dataclass(frozen=True)
class WorkerResult:
    """How one worker ended.

    Attributes:
        index: the worker's ``task.index``.
        returncode: exit status (negative: killed by that signal).
        stdout: everything it printed.
        stderr: everything it logged.
        elapsed: seconds from the group's start to this worker's exit.
        ended_at: ``time.monotonic()`` when its exit was seen (-1 if running);
            compare with the value :meth:`WorkerGroup.kill` returns.
    """

    index: int
    returncode: int
    stdout: str
    stderr: str
    elapsed: float
    ended_at: float = -1.0


class WorkerGroup:
    """N processes of ``script``, worker ``i`` with ``TF_CONFIG`` task index ``i``.

    Args:
        script: the Python file each worker runs.
        n: number of workers.
        args: command-line arguments for every worker; a callable gets the
            worker index and returns that worker's arguments.
        env: extra environment variables for every worker (on top of
            :func:`tests.conftest.clean_env`).
        cwd: working directory; defaults to a fresh temporary directory.
        ports: loopback ports to use (default: ``n`` free ones).

    Example:
        with WorkerGroup("w.py", 3) as group:
            group.wait(timeout=60)
    """

    def __init__(
        self,
        script: str | os.PathLike,
        n: int,
        *,
        args: Sequence[str] | Callable[[int], Sequence[str]] = (),
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        ports: Sequence[int] | None = None,
    ) -> None:
        if n < 1:
            raise ValueError(f"n must be a positive integer. Received: n={n}")
        self.script = str(script)
        self.n = n
        self._args = args
        self._env = dict(env or {})
        self._cwd = str(cwd) if cwd is not None else None
        self.ports = list(ports) if ports is not None else free_ports(n)
        self.addresses = [f"localhost:{p}" for p in self.ports]
        self.procs: list[subprocess.Popen] = []
        self._logdir = tempfile.mkdtemp(prefix="mirrorkit-workers-")
        self._files: list[tuple[Path, Path]] = []
        self._t0 = 0.0
        self._ended: dict[int, float] = {}

    def tf_config(self, index: int) -> str:
        """The ``TF_CONFIG`` JSON worker ``index`` gets."""
        return build_tf_config(self.addresses, index)

    def start(self) -> "WorkerGroup":
        """Start every worker (idempotent)."""
        if self.procs:
            return self
        cwd = self._cwd or self._logdir
        self._t0 = time.monotonic()
        for i in range(self.n):
            args = self._args(i) if callable(self._args) else self._args
            out = Path(self._logdir, f"worker{i}.out")
            err = Path(self._logdir, f"worker{i}.err")
            self._files.append((out, err))
            env = clean_env(TF_CONFIG=self.tf_config(i), **self._env)
            with open(out, "wb") as fout, open(err, "wb") as ferr:
                # Own session: the group can be signalled as a whole without
                # touching the test runner's process group.
                proc = subprocess.Popen(
                    [sys.executable, self.script, *map(str, args)],
                    stdout=fout, stderr=ferr, env=env, cwd=cwd,
                    start_new_session=True,
                )
            self.procs.append(proc)
        return self

    def __enter__(self) -> "WorkerGroup":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.reap()

    def _poll(self) -> None:
        for i, proc in enumerate(self.procs):
            if i not in self._ended and proc.poll() is not None:
                self._ended[i] = time.monotonic() - self._t0

    def wait_for_output(self, index: int, text: str, *, timeout: float) -> float:
        """Block until worker ``index`` prints ``text``; return seconds since start.

        Raises:
            TimeoutError: when it does not appear in time (workers keep running).
            RuntimeError: when the worker exits first.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self._files[index][0].read_text(errors="replace"):
                return time.monotonic() - self._t0
            if self.procs[index].poll() is not None:
                raise RuntimeError(
                    f"worker {index} exited ({self.procs[index].returncode}) before "
                    f"printing {text!r}\n{self.report()}")
            time.sleep(0.05)
        raise TimeoutError(f"worker {index} did not print {text!r} in {timeout}s\n"
                           f"{self.report()}")

    def kill(self, index: int, sig: int = signal.SIGKILL) -> float:
        """Send ``sig`` to worker ``index``; return the time it was sent (monotonic)."""
        proc = self.procs[index]
        with _suppress_lookup():
            os.killpg(proc.pid, sig)
        return time.monotonic()

    def wait(self, timeout: float, *, indices: Sequence[int] | None = None) -> list[WorkerResult]:
        """Wait for the workers (default: all) to exit, at most ``timeout`` seconds.

        Returns:
            One :class:`WorkerResult` per worker of the whole group.

        Raises:
            TimeoutError: when any awaited worker is still running at the
                deadline; every worker is killed first, so nothing leaks.
        """
        wanted = list(range(self.n)) if indices is None else list(indices)
        deadline = time.monotonic() + timeout
        while True:
            self._poll()
            if all(i in self._ended for i in wanted):
                return self.results()
            if time.monotonic() > deadline:
                running = [i for i in wanted if i not in self._ended]
                self.reap()
                raise TimeoutError(
                    f"workers {running} still running after {timeout}s; killed.\n"
                    f"{self.report()}")
            time.sleep(0.05)

    def results(self) -> list[WorkerResult]:
        """What every worker has produced so far (returncode -999 if running)."""
        self._poll()
        out = []
        for i, proc in enumerate(self.procs):
            fout, ferr = self._files[i]
            out.append(WorkerResult(
                index=i,
                returncode=proc.returncode if proc.returncode is not None else -999,
                stdout=fout.read_text(errors="replace"),
                stderr=ferr.read_text(errors="replace"),
                elapsed=self._ended.get(i, -1.0),
                ended_at=self._t0 + self._ended[i] if i in self._ended else -1.0,
            ))
        return out

    def report(self, tail: int = 3000) -> str:
        """Every worker's exit status and the tail of its output, for assertion messages."""
        parts = []
        for r in self.results():
            parts.append(f"--- worker {r.index} rc={r.returncode} t={r.elapsed:.1f}s\n"
                         f"[stdout]\n{r.stdout[-tail:]}\n[stderr]\n{r.stderr[-tail:]}")
        return "\n".join(parts)

    def reap(self) -> None:
        """Kill whatever still runs (SIGKILL to each worker's own group) and wait for it."""
        for proc in self.procs:
            if proc.poll() is None:
                with _suppress_lookup():
                    os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # pragma: no cover - kernel stuck
                pass
        self._poll()


class _suppress_lookup:
    """Ignore 'no such process' when a worker already exited."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        return exc_type is not None and issubclass(exc_type, ProcessLookupError)


def run_workers(
    script: str | os.PathLike,
    n: int,
    *,
    timeout: float,
    args: Sequence[str] | Callable[[int], Sequence[str]] = (),
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
) -> tuple[list[WorkerResult], str]:
    """Run ``n`` workers of ``script`` to completion; return results and a report.

    Example:
        results, report = run_workers("w.py", 2, timeout=120)
        assert all(r.returncode == 0 for r in results), report
    """
    with WorkerGroup(script, n, args=args, env=env, cwd=cwd) as group:
        results = group.wait(timeout)
        return results, group.report()
