"""One worker process: started in its own session, its output streamed with a ``[rank]`` tag.

Example:
    >>> final_text("1/8 loss: 2.3\\b\\b\\r8/8 loss: 2.1\\n")
    '8/8 loss: 2.1'
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Callable

from mirrorkit.launcher.state import WorkerFailure, WorkerState
from mirrorkit.protocol import ExitCode, parse_target_missed

# Lines of a failed worker's output kept for the root-cause summary.
TAIL_LINES = 10
# How long to let a finished worker's reader threads drain its last lines.
_DRAIN_TIMEOUT = 2.0


def _parent_death_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that SIGKILLs the worker if the launcher dies (Linux only).

    SIGINT/SIGTERM are handled by the launcher; this covers SIGKILL and crashes
    of the launcher itself, so not even those leave orphans training on.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, int(signal.SIGKILL))
        if os.getppid() != parent:  # the launcher died before prctl took effect
            os._exit(1)

    return hook


def _preexec(*hooks: Callable[[], None] | None) -> Callable[[], None] | None:
    """One ``preexec_fn`` running ``hooks`` in order (None when there are none)."""
    active = [hook for hook in hooks if hook is not None]
    if not active:
        return None

    def run() -> None:
        for hook in active:
            hook()

    return run


def final_text(line: str) -> str:
    """What a terminal would finally show for one output line.

    Keras redraws its progress bar with ``\\b`` and ``\\r`` (it treats every
    POSIX process as a live display), so a piped epoch arrives as one line of
    redraws; after a prefix those would overwrite the ``[rank]`` tag. Keep the
    last redraw only.

    Example:
        >>> final_text("1/8 loss: 2.3\\b\\b\\r8/8 loss: 2.1\\n")
        '8/8 loss: 2.1'
    """
    line = line.rstrip("\r\n")
    return line.rsplit("\r", 1)[-1].replace("\b", "")


def killpg(pid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pid``; a group that is already gone is no error."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class WorkerProcess:
    """One worker process, its reader threads and its exit watcher."""

    def __init__(self, rank: int, argv: list[str], env: dict[str, str], restart: int,
                 streams: tuple[IO[str], IO[str]], lock: threading.Lock,
                 wake: threading.Event, log_path: Path | None,
                 enter: Callable[[], None] | None = None) -> None:
        self.rank = rank
        self.restart = restart
        self.state = WorkerState.INIT
        self.stopping = False
        self.exit_time: float | None = None
        self.exited = threading.Event()
        self.targets_missed = False
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._log = None
        self._log_lock = threading.Lock()
        if log_path is not None:
            self._log = open(log_path, "a", encoding="utf-8")
        try:
            self.proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=_preexec(_parent_death_hook(), enter),
            )
        except BaseException:
            if self._log is not None:
                self._log.close()
            raise
        self.state = WorkerState.HEALTHY
        if self._log is not None:
            self._log.write(f"===== mirrorkit launch: attempt {restart + 1} (restart {restart}), "
                            f"worker {rank}, pid {self.proc.pid}, "
                            f"{time.strftime('%Y-%m-%d %H:%M:%S')} =====\n")
            self._log.flush()
        prefix = f"[{rank}] "
        self._readers = [
            threading.Thread(target=self._pump, args=(pipe, out, lock, prefix),
                             name=f"mirrorkit-worker{rank}-{name}", daemon=True)
            for pipe, out, name in ((self.proc.stdout, streams[0], "out"),
                                    (self.proc.stderr, streams[1], "err"))
        ]
        self._waiter = threading.Thread(target=self._wait, args=(wake,),
                                        name=f"mirrorkit-worker{rank}-wait", daemon=True)
        for thread in (*self._readers, self._waiter):
            thread.start()

    def _pump(self, pipe: IO[bytes], out: IO[str], lock: threading.Lock, prefix: str) -> None:
        for raw in iter(pipe.readline, b""):
            line = final_text(raw.decode("utf-8", "replace"))
            self.tail.append(line)
            with lock:
                try:
                    out.write(f"{prefix}{line}\n")
                    out.flush()
                except (OSError, ValueError):
                    # The launcher's own output is gone (closed pipe): keep
                    # draining so the worker never blocks on a full pipe.
                    pass
            with self._log_lock:
                # Checked under the lock: drain() may have closed the file.
                if self._log is not None:
                    self._log.write(line + "\n")
                    self._log.flush()
        pipe.close()

    def _wait(self, wake: threading.Event) -> None:
        self.proc.wait()
        self.exit_time = time.monotonic()
        self.exited.set()
        wake.set()

    def observe(self) -> WorkerState:
        """Update and return the state from the process's exit status."""
        if self.exited.is_set() and self.state is WorkerState.HEALTHY:
            if self.proc.returncode == 0:
                self.state = WorkerState.SUCCEEDED
            elif self.proc.returncode == ExitCode.TARGET_MISSED and self._reported_missed_targets():
                # `mirrorkit train --target`: the run finished; a restart would not help.
                self.state = WorkerState.SUCCEEDED
                self.targets_missed = True
            elif self.stopping:
                self.state = WorkerState.STOPPED
            else:
                self.state = WorkerState.FAILED
        return self.state

    def _reported_missed_targets(self) -> bool:
        for thread in self._readers:
            thread.join(_DRAIN_TIMEOUT)   # its last lines are the report
        return any(parse_target_missed(line) is not None for line in self.tail)

    def drain(self) -> None:
        """Wait briefly for the last output lines, then close the log file."""
        for thread in self._readers:
            thread.join(_DRAIN_TIMEOUT)
        if self._log is not None:
            with self._log_lock:
                self._log.close()
            self._log = None

    def failure(self) -> WorkerFailure:
        for thread in self._readers:
            thread.join(_DRAIN_TIMEOUT)
        return WorkerFailure(rank=self.rank, pid=self.proc.pid,
                             returncode=self.proc.returncode, restart=self.restart,
                             tail=tuple(self.tail))
