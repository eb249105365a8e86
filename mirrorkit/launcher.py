"""Start N workers with their ``TF_CONFIG``, stream their output, restart the group on failure.

The structure follows torchrun's elastic agent: a frozen :class:`LaunchSpec`
says what to run, :class:`WorkerState` names where each worker is, one monitor
loop in :func:`launch` watches the group, a failure stops and restarts the
*whole* group (MultiWorkerMirroredStrategy cannot replace one member of a
running cluster), the restart count reaches workers as
``MIRRORKIT_RESTART_COUNT``, and the run ends in a :class:`RunResult` whose
root cause names the worker that failed first.

The launcher talks to workers only through environment variables and never
imports TensorFlow, so it starts in well under a second.

Example:
    >>> spec = LaunchSpec(command=("python", "train.py"), nproc=2, max_restarts=1)
    >>> result = launch(spec)                       # doctest: +SKIP
    >>> result.state, result.exit_code              # doctest: +SKIP
    (<WorkerState.SUCCEEDED: 'SUCCEEDED'>, 0)
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence

from mirrorkit import _env
from mirrorkit.autofix import SITE_DIR
from mirrorkit.cluster import build_tf_config, parse_address

logger = logging.getLogger(__name__)

# Lines of a failed worker's output kept for the root-cause summary.
TAIL_LINES = 10
# Host of every worker when all run on this machine.
LOCAL_HOST = "localhost"
# Signals that stop the launcher (and with it every worker).
_STOP_SIGNALS = tuple(s for s in (getattr(signal, n, None) for n in
                                  ("SIGINT", "SIGTERM", "SIGHUP")) if s is not None)
# Bound on waiting for a SIGKILLed process to be reaped; only a stuck kernel exceeds it.
_REAP_TIMEOUT = 30.0
# How long to let a finished worker's reader threads drain its last lines.
_DRAIN_TIMEOUT = 2.0


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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: Any, minimum: int, *, flag: str = "", hint: str = "") -> None:
    if not _is_int(value) or value < minimum:
        kind = "a positive integer" if minimum == 1 else "a non-negative integer"
        raise ValueError(f"`{name}`{flag} must be {kind}{hint}. Received: {name}={value!r}")


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """What to launch: the command, how many workers, restarts, ports, devices.

    Args:
        command: program and arguments every worker runs, e.g.
            ``("python", "train.py", "--epochs", "3")``. The program is looked
            up next to the launcher's own Python first (so ``python`` and
            ``mirrorkit`` mean the launcher's environment), then on ``PATH``.
        nproc: workers on this machine.
        max_restarts: whole-group restarts allowed after a failure. Defaults to 0.
        log_dir: also append each worker's output to ``log_dir/worker-<rank>.log``.
            Defaults to None (terminal only).
        port: first of ``nproc`` consecutive ports. If any of them is in use,
            :func:`launch` raises ``ValueError`` naming the port (a fixed port
            is a promise to the user and to other nodes, so it is never
            silently moved). Defaults to None: free ports, new on each restart.
        gpus_per_worker: give worker ``j`` (local index) GPUs ``j*G..j*G+G-1``
            through ``CUDA_VISIBLE_DEVICES`` (indices into the launcher's own
            ``CUDA_VISIBLE_DEVICES`` when that is set). Defaults to None:
            every worker sees every device.
        grace_period: seconds between SIGTERM and SIGKILL when stopping
            workers. TensorFlow's multi-worker runtime catches SIGTERM (its
            preemption notifier) and keeps running, so for MWMS workers this
            is how long every stop and restart waits; 0 restarts fastest.
            Defaults to 3.
        hosts: multi-node: every node's host, in node-rank order, each
            ``HOST`` (ports from ``port``) or ``HOST:PORT`` (that node's first
            port). All nodes run the same ``nproc``; node ``R`` runs global
            ranks ``R*nproc .. R*nproc+nproc-1``. Defaults to None: one node.
        node_rank: this node's position in ``hosts``. Defaults to 0.
        env: extra environment variables for every worker.

    Raises:
        ValueError: for any invalid field, naming it and the value received.

    Example:
        >>> LaunchSpec(command=("python", "t.py"), nproc=2).world_size
        2
        >>> LaunchSpec(command=("python", "t.py"), nproc=2, hosts=("a", "b"),
        ...            node_rank=1, port=2222).local_ranks
        (2, 3)
    """

    command: tuple[str, ...]
    nproc: int
    max_restarts: int = 0
    log_dir: str | None = None
    port: int | None = None
    gpus_per_worker: int | None = None
    grace_period: float = 3.0
    hosts: tuple[str, ...] | None = None
    node_rank: int = 0
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # Normalise containers so the frozen spec is really immutable.
        object.__setattr__(self, "command", tuple(self.command or ()))
        if self.hosts is not None:
            object.__setattr__(self, "hosts", tuple(self.hosts))
        object.__setattr__(self, "env", dict(self.env or {}))
        if self.log_dir is not None:
            object.__setattr__(self, "log_dir", str(self.log_dir))
        self._validate()

    def _validate(self) -> None:
        if not self.command or not all(isinstance(a, str) for a in self.command) \
                or not self.command[0].strip():
            raise ValueError(
                "`command` must name the program every worker runs, e.g. "
                f"'mirrorkit launch -n 2 -- python train.py'. Received: command={self.command!r}"
            )
        _check_int("nproc", self.nproc, 1, flag=" (-n)",
                   hint=": the number of workers to start")
        _check_int("max_restarts", self.max_restarts, 0)
        if self.port is not None and (not _is_int(self.port) or not
                                      1 <= self.port <= 65536 - self.nproc):
            raise ValueError(
                f"`port` must leave room for {self.nproc} consecutive ports within "
                f"1..65535. Received: port={self.port!r}"
            )
        if self.gpus_per_worker is not None:
            _check_int("gpus_per_worker", self.gpus_per_worker, 1)
        if isinstance(self.grace_period, bool) or not isinstance(
                self.grace_period, (int, float)) or not self.grace_period >= 0:
            raise ValueError(
                "`grace_period` must be a non-negative number of seconds. "
                f"Received: grace_period={self.grace_period!r}"
            )
        _check_int("node_rank", self.node_rank, 0)
        if self.hosts is None:
            if self.node_rank != 0:
                raise ValueError(
                    "`node_rank` needs `hosts` (every node's host) to place this "
                    f"node. Received: node_rank={self.node_rank}, hosts=None"
                )
            return
        if not self.hosts:
            raise ValueError("`hosts` must name at least one node. Received: hosts=()")
        if self.node_rank >= len(self.hosts):
            raise ValueError(
                f"`node_rank` must be below the number of hosts ({len(self.hosts)}). "
                f"Received: node_rank={self.node_rank}"
            )
        # Building the worker list checks every address and rejects duplicates.
        build_tf_config(self.node_addresses(), 0)

    @property
    def nnodes(self) -> int:
        """Number of machines (1 unless ``hosts`` is given)."""
        return len(self.hosts) if self.hosts else 1

    @property
    def world_size(self) -> int:
        """Workers across all nodes."""
        return self.nproc * self.nnodes

    @property
    def local_ranks(self) -> tuple[int, ...]:
        """Global ranks (``TF_CONFIG`` task indexes) of this node's workers."""
        first = self.node_rank * self.nproc
        return tuple(range(first, first + self.nproc))

    def _node_base(self, entry: str) -> tuple[str, int | None]:
        if ":" in entry:
            host, port = parse_address(entry, field="hosts entry")
            if port > 65536 - self.nproc:
                raise ValueError(
                    f"hosts entry {entry!r} leaves no room for {self.nproc} ports.")
            return host, port
        if not entry.strip() or any(c.isspace() for c in entry):
            raise ValueError(f"`hosts` entries must be HOST or HOST:PORT. Received: {entry!r}")
        return entry, self.port

    def node_addresses(self, ports: Sequence[int] | None = None) -> list[str]:
        """Every worker's ``host:port`` in rank order.

        Args:
            ports: this node's ports when the spec picks them (single node,
                no ``port``); ignored otherwise.

        Example:
            >>> LaunchSpec(command=("x",), nproc=2, hosts=("a:100", "b"),
            ...            port=200).node_addresses()
            ['a:100', 'a:101', 'b:200', 'b:201']
        """
        if self.hosts is None:
            if ports is None:
                if self.port is None:
                    raise ValueError("node_addresses() needs ports when `port` is unset.")
                ports = range(self.port, self.port + self.nproc)
            return [f"{LOCAL_HOST}:{p}" for p in ports]
        addresses = []
        for entry in self.hosts:
            host, base = self._node_base(entry)
            if base is None:
                raise ValueError(
                    f"hosts entry {entry!r} has no port and `port` (--port) is unset; "
                    "every node must know every worker's port."
                )
            shown = f"[{host}]" if ":" in host else host
            addresses.extend(f"{shown}:{base + j}" for j in range(self.nproc))
        return addresses

    def fixed_ports(self) -> list[int] | None:
        """This node's ports when they are fixed by ``port``/``hosts``; else None."""
        if self.hosts is None:
            return None if self.port is None else list(range(self.port, self.port + self.nproc))
        return [parse_address(a)[1] for a in self.node_addresses()[
            self.local_ranks[0]:self.local_ranks[-1] + 1]]


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
        return self.returncode if self.returncode >= 0 else 128 - self.returncode

    def describe(self) -> str:
        """One phrase: who failed and how."""
        how = (f"was killed by {self.signal_name}" if self.signal_name
               else f"exited with code {self.returncode}")
        return f"worker {self.rank} (pid {self.pid}) {how}"


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

    @property
    def root_cause(self) -> WorkerFailure | None:
        """The failure that ended the run (the last attempt's first failure)."""
        return self.failures[-1] if self.state is WorkerState.FAILED and self.failures else None

    def summary(self) -> str:
        """A human-readable account: outcome, root cause and its last output lines."""
        if self.state is WorkerState.SUCCEEDED:
            return (f"all {len(self.worker_states)} worker(s) succeeded in "
                    f"{self.elapsed:.1f} s ({self.restarts} restarts)")
        if self.state is WorkerState.STOPPED:
            return (f"stopped by {self.signal} after {self.elapsed:.1f} s; every worker "
                    f"was stopped ({self.restarts} restarts)")
        cause = self.root_cause
        lines = [f"FAILED after {self.restarts} restart(s) in {self.elapsed:.1f} s.",
                 f"Root cause: {cause.describe()}, the first worker to fail in "
                 f"attempt {cause.restart + 1}." if cause else "Root cause: unknown."]
        for earlier in self.failures[:-1]:
            lines.append(f"Earlier: attempt {earlier.restart + 1}: {earlier.describe()}.")
        if cause is not None:
            lines.append(f"Last {len(cause.tail)} output line(s) of worker {cause.rank}:")
            lines.extend(f"  {line}" for line in cause.tail)
        return "\n".join(lines)


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
        ValueError: when ``visible`` lists too few devices.

    Example:
        >>> visible_devices(1, 2), visible_devices(1, 1, "3,5")
        ('2,3', '5')
    """
    first, end = index * per_worker, (index + 1) * per_worker
    if visible is None:
        return ",".join(str(i) for i in range(first, end))
    listed = [d.strip() for d in visible.split(",") if d.strip()]
    if len(listed) < end:
        raise ValueError(
            f"Worker {index} needs GPUs {first}..{end - 1} ({per_worker} per worker) "
            f"but CUDA_VISIBLE_DEVICES lists {len(listed)}. "
            f"Received: CUDA_VISIBLE_DEVICES={visible!r}"
        )
    return ",".join(listed[first:end])


def _resolve_program(program: str, path: str | None) -> str:
    if os.sep in program:
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise ValueError(f"Command not found or not executable: {program!r}")
        return program
    # Next to the launcher's interpreter first: `python` and `mirrorkit` then
    # mean the launcher's own (virtual) environment even when it is not on PATH.
    sibling = Path(sys.executable).parent / program
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling)
    found = shutil.which(program, path=path)
    if found is None:
        raise ValueError(
            f"Command not found: {program!r} (looked in {sibling.parent} and on PATH)."
        )
    return found


def _free_ports(n: int) -> list[int]:
    # Hold all sockets until all are picked so the n ports are distinct.
    socks = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("", 0))
            socks.append(sock)
        return [s.getsockname()[1] for s in socks]
    finally:
        for sock in socks:
            sock.close()


def _check_ports_free(ports: Sequence[int]) -> None:
    # SO_REUSEADDR as gRPC sets it: a port left in TIME_WAIT by the previous
    # attempt counts as free, a port another process listens on does not.
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("", port))
        except OSError as err:
            raise ValueError(
                f"Port {port} is already in use on this machine ({err.strerror}); "
                f"workers here need ports {ports[0]}..{ports[-1]}. Choose another "
                "base port, or leave it unset (no --port) to pick free ports."
            ) from err
        finally:
            sock.close()


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


def _final_text(line: str) -> str:
    """What a terminal would finally show for one output line.

    Keras redraws its progress bar with ``\\b`` and ``\\r`` (it treats every
    POSIX process as a live display), so a piped epoch arrives as one line of
    redraws; after a prefix those would overwrite the ``[rank]`` tag. Keep the
    last redraw only.

    Example:
        >>> _final_text("1/8 loss: 2.3\\b\\b\\r8/8 loss: 2.1\\n")
        '8/8 loss: 2.1'
    """
    line = line.rstrip("\r\n")
    return line.rsplit("\r", 1)[-1].replace("\b", "")


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class _Worker:
    """One worker process, its reader threads and its exit watcher."""

    def __init__(self, rank: int, argv: list[str], env: dict[str, str], restart: int,
                 streams: tuple[IO[str], IO[str]], lock: threading.Lock,
                 wake: threading.Event, log_path: Path | None) -> None:
        self.rank = rank
        self.restart = restart
        self.state = WorkerState.INIT
        self.stopping = False
        self.exit_time: float | None = None
        self.exited = threading.Event()
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._log = None
        self._log_lock = threading.Lock()
        if log_path is not None:
            self._log = open(log_path, "a", encoding="utf-8")
        try:
            self.proc = subprocess.Popen(
                argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True,
                preexec_fn=_parent_death_hook(),
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
            line = _final_text(raw.decode("utf-8", "replace"))
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
            elif self.stopping:
                self.state = WorkerState.STOPPED
            else:
                self.state = WorkerState.FAILED
        return self.state

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


def worker_threads(nproc: int, env: Mapping[str, str]) -> int | None:
    """Intra-op threads per worker when ``nproc`` workers share this machine.

    TensorFlow gives each process an intra-op pool of all cores, so N local
    workers oversubscribe the CPU N times (the same reasoning as torchrun's
    ``OMP_NUM_THREADS=1``; see :func:`mirrorkit.strategy.share_cores`). The
    launcher exports ``TF_NUM_INTRAOP_THREADS`` = cores // N (at least 1),
    unless ``env`` already sets it or there is one worker.

    Example:
        >>> worker_threads(1, {}) is None, worker_threads(2, {"TF_NUM_INTRAOP_THREADS": "4"})
        (True, None)
        >>> worker_threads(2, {}) >= 1
        True
    """
    if nproc <= 1 or env.get(_env.TF_INTRA_OP_THREADS):
        return None
    from mirrorkit.strategy import cores_each

    return cores_each(nproc)


class _Group:
    """The workers of one attempt on this node."""

    def __init__(self, spec: LaunchSpec, restart: int, argv: list[str],
                 streams: tuple[IO[str], IO[str]], wake: threading.Event) -> None:
        self.restart = restart
        self.workers: list[_Worker] = []
        self._stopped = False
        fixed = spec.fixed_ports()
        ports = fixed if fixed is not None else _free_ports(spec.nproc)
        if fixed is not None:
            _check_ports_free(fixed)
        addresses = spec.node_addresses(ports)
        base_env = _env.snapshot()
        base_env.update(spec.env)
        parent_devices = base_env.get("CUDA_VISIBLE_DEVICES")
        log_dir = Path(spec.log_dir) if spec.log_dir else None
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        lock = threading.Lock()
        local = ", ".join(addresses[r] for r in spec.local_ranks)
        logger.info("starting %d worker(s), attempt %d of at most %d: %s",
                    spec.nproc, restart + 1, spec.max_restarts + 1, local)
        threads = worker_threads(spec.nproc, base_env)
        if threads and restart == 0:
            logger.info("each worker gets %d intra-op thread(s) (%s=%d: %d workers share this "
                        "machine's cores; set it yourself to override)",
                        threads, _env.TF_INTRA_OP_THREADS, threads, spec.nproc)
        try:
            for j, rank in enumerate(spec.local_ranks):
                env = dict(base_env)
                env[_env.TF_CONFIG] = build_tf_config(addresses, rank)
                env[_env.RESTART_COUNT] = str(restart)
                # Live output: Python workers must not block-buffer into the pipe.
                env["PYTHONUNBUFFERED"] = "1"
                if threads:
                    env[_env.TF_INTRA_OP_THREADS] = str(threads)
                # Python workers that never import mirrorkit still get its Keras
                # fixes (mirrorkit.autofix); MIRRORKIT_COMPAT=off turns them off.
                env["PYTHONPATH"] = os.pathsep.join(
                    filter(None, [str(SITE_DIR), base_env.get("PYTHONPATH")]))
                if spec.gpus_per_worker:
                    env["CUDA_VISIBLE_DEVICES"] = visible_devices(
                        j, spec.gpus_per_worker, parent_devices)
                log = log_dir / f"worker-{rank}.log" if log_dir else None
                self.workers.append(_Worker(rank, argv, env, restart, streams, lock,
                                            wake, log))
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

    def first_failure(self) -> WorkerFailure:
        failed = [w for w in self.workers if w.state is WorkerState.FAILED]
        return min(failed, key=lambda w: w.exit_time or 0.0).failure()

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
            _killpg(worker.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for worker in alive:
            while not urgent() and time.monotonic() < deadline:
                if worker.exited.wait(min(0.05, max(deadline - time.monotonic(), 0))):
                    break
        # Every worker's group, exited or not: nothing a worker started may outlive it.
        for worker in self.workers:
            _killpg(worker.proc.pid, signal.SIGKILL)
        for worker in self.workers:
            worker.exited.wait(_REAP_TIMEOUT)
            worker.observe()
            worker.drain()

    def states(self) -> dict[int, WorkerState]:
        return {w.rank: w.observe() for w in self.workers}


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


def launch(spec: LaunchSpec, *, stdout: IO[str] | None = None,
           stderr: IO[str] | None = None) -> RunResult:
    """Run ``spec.nproc`` workers as one ``TF_CONFIG`` cluster until they finish.

    Each worker gets ``TF_CONFIG`` (rank 0 is the chief), the restart count
    in ``MIRRORKIT_RESTART_COUNT``, one ``MIRRORKIT_RUN_ID`` for the job, ``PYTHONUNBUFFERED=1``, mirrorkit's
    Keras fixes for Python programs that never import mirrorkit
    (:mod:`mirrorkit.autofix`, via ``PYTHONPATH``) and, with
    ``gpus_per_worker``, its own ``CUDA_VISIBLE_DEVICES``. Every output line
    is forwarded with a ``[rank] `` prefix. When a worker fails, the others
    are stopped (SIGTERM, SIGKILL after ``grace_period``) and, while restarts
    remain, the whole group starts again. SIGINT/SIGTERM/SIGHUP to the
    launcher stop every worker. Workers run in their own sessions and die
    with the launcher even if it is SIGKILLed, so none is ever left behind.

    Args:
        spec: what to run.
        stdout: where workers' stdout lines go. Defaults to ``sys.stdout``.
        stderr: where workers' stderr lines go. Defaults to ``sys.stderr``.

    Returns:
        A :class:`RunResult`; ``summary()`` explains a failure.

    Raises:
        ValueError: command not found, a fixed port in use, too few GPUs.
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
    # One run id for every worker and every restart, so programs that name
    # their output after it (mirrorkit train's default folder) agree.
    run_id = spec.env.get(_env.RUN_ID) or _env.run_id() or time.strftime("%Y%m%d-%H%M%S")
    spec = dataclasses.replace(spec, env={**spec.env, _env.RUN_ID: run_id})
    worker_path = spec.env.get("PATH", _env.get("PATH"))
    argv = [_resolve_program(spec.command[0], worker_path), *spec.command[1:]]
    start = time.monotonic()
    wake = threading.Event()
    failures: list[WorkerFailure] = []
    restart = 0
    with _Signals(wake) as signals:
        group = _Group(spec, restart, argv, streams, wake)
        try:
            # The one monitor loop: sleep until a worker exits or a signal
            # arrives (or a tick passes), then decide for the whole group.
            while True:
                wake.wait(1.0)
                wake.clear()
                if signals.received:
                    name = signal.Signals(signals.received[0]).name
                    logger.warning("received %s: stopping %d worker(s)", name, spec.nproc)
                    # A second signal means "now": skip the grace period.
                    group.stop(spec.grace_period, urgent=lambda: len(signals.received) > 1)
                    return RunResult(WorkerState.STOPPED, 128 + signals.received[0],
                                     restart, tuple(failures), group.states(), name,
                                     time.monotonic() - start)
                state = group.observe()
                if state is WorkerState.SUCCEEDED:
                    group.stop(0.0)
                    return RunResult(WorkerState.SUCCEEDED, 0, restart, tuple(failures),
                                     group.states(), None, time.monotonic() - start)
                if state is not WorkerState.FAILED:
                    continue
                failure = group.first_failure()
                failures.append(failure)
                logger.warning("%s; stopping the other worker(s)", failure.describe())
                group.stop(spec.grace_period, urgent=lambda: bool(signals.received))
                if signals.received:
                    continue  # interrupted while stopping: report it as such above
                if restart >= spec.max_restarts:
                    return RunResult(WorkerState.FAILED, failure.exit_code, restart,
                                     tuple(failures), group.states(), None,
                                     time.monotonic() - start)
                restart += 1
                logger.warning("restarting the whole group (restart %d of %d)",
                               restart, spec.max_restarts)
                try:
                    group = _Group(spec, restart, argv, streams, wake)
                except (OSError, ValueError) as err:
                    raise RuntimeError(
                        f"Cannot restart the workers: {err} (the previous attempt "
                        f"failed because {failure.describe()})"
                    ) from err
        finally:
            # Whatever happened above (even a bug or KeyboardInterrupt from a
            # non-main thread), no worker outlives the launcher.
            group.stop(0.0)
