"""``mirrorkit launch --ray``: the driver of a job whose workers Ray Train places on a cluster.

:func:`trainer` builds a Ray Train trainer for a command line
(``mirrorkit train ...``, ``mirrorkit run script.py``, ``python script.py``):
``ScalingConfig(num_workers, resources_per_worker, use_gpu)`` from the worker
count and resources, ``FailureConfig(max_failures)`` from the restarts,
``RunConfig(storage_path)`` for Ray's records and the final checkpoint, and
:func:`mirrorkit.launcher.ray_worker.train_loop` as every worker's loop (the
command as a child process with mirrorkit's worker environment and fixes).
:func:`run` is the driver ``mirrorkit launch --ray`` calls: it connects to the
cluster, prints the workers' lines as ``[rank] ...`` while Ray runs them and
ends in the same :class:`~mirrorkit.launcher.state.RunResult` as a local
launch. Ray is imported only here and only when asked for; without it
:func:`import_ray` raises :class:`~mirrorkit.errors.MissingDependency`.

Example:
    >>> spec = RayJobSpec(command=("mirrorkit", "train", "--epochs", "2"), nproc=2)
    >>> spec.address, spec.scaling()
    ('auto', {'num_workers': 2, 'resources_per_worker': {'CPU': 1.0}, 'use_gpu': False})
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import socket
import sys
import threading
import time
from typing import IO, Any, Mapping, Sequence

from mirrorkit import _env, protocol
from mirrorkit.errors import MissingDependency, RunError, UserInputError
from mirrorkit.launcher.agent import _resolve_program
from mirrorkit.launcher.ray_journal import Journal, stopped
from mirrorkit.launcher.state import RunResult

logger = logging.getLogger(__name__)

# What to install for --ray (the extra pins the Ray versions mirrorkit is tested with).
INSTALL = 'pip install "mirrorkit[ray]"'
# The driver's variables every worker's program also gets, as on a local launch.
_FORWARDED = ("MIRRORKIT_", "TF_CPP_", "TF_NUM_", "TF_ENABLE_", "KERAS_")
# How often the driver prints the lines the workers sent.
_PRINT_SECONDS = 0.2


def import_ray() -> Any:
    """``ray`` with Ray Train, or :class:`MissingDependency` naming the pip command.

    Example:
        >>> import_ray().__name__            # doctest: +SKIP
        'ray'
    """
    try:
        import ray
        import ray.train  # noqa: F401 (Ray Train is part of the extra, not of plain ray)
    except ImportError as err:
        raise MissingDependency(
            f"--ray needs Ray Train, which is not installed ({err}): {INSTALL}") from err
    return ray


@dataclasses.dataclass(frozen=True)
class RayJobSpec:
    """What to run on the Ray cluster, validated on construction.

    Args:
        command: program and arguments every worker runs, as for a local launch.
        nproc: workers (Ray Train's ``num_workers``).
        address: the cluster (``ray.init(address=...)``): ``"auto"`` (``RAY_ADDRESS``,
            else the cluster started on this machine) or ``HOST:PORT``. Defaults to ``"auto"``.
        cpus_per_worker: Ray CPUs each worker reserves; also its
            ``TF_NUM_INTRAOP_THREADS`` (rounded, at least 1). Defaults to 1.
        gpus_per_worker: Ray GPUs each worker reserves (``use_gpu`` when > 0).
            Defaults to 0.
        max_restarts: Ray Train's ``FailureConfig(max_failures)``. Defaults to 0.
        min_workers: an elastic job: Ray Train's worker range ``(min_workers, nproc)``.
            Defaults to None (a fixed size).
        elastic_batch: with ``min_workers``: ``MIRRORKIT_ELASTIC_BATCH``
            (``"global"`` or ``"per-replica"``). Defaults to ``"global"`` then.
        storage: Ray Train's ``RunConfig(storage_path)``, a folder every node
            sees (or a cloud URI). Defaults to None (Ray's ``~/ray_results``).
        env: extra variables for every worker's program.

    Raises:
        UserInputError: a field out of range, naming it and the value.

    Example:
        >>> RayJobSpec(command=("python", "t.py"), nproc=3, min_workers=2,
        ...            max_restarts=1).scaling()["num_workers"]
        (2, 3)
    """

    command: tuple[str, ...]
    nproc: int
    address: str = "auto"
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    max_restarts: int = 0
    min_workers: int | None = None
    elastic_batch: str | None = None
    storage: str | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "command", tuple(self.command or ()))
        object.__setattr__(self, "env", dict(self.env or {}))
        if not self.command or not self.command[0].strip():
            raise UserInputError("`command` must name the program every worker runs, e.g. "
                                 "'mirrorkit launch --ray -n 2 -- mirrorkit train'. "
                                 f"Received: command={self.command!r}")
        for name, minimum in (("nproc", 1), ("max_restarts", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise UserInputError(f"`{name}` must be an integer >= {minimum}. "
                                     f"Received: {name}={value!r}")
        if not (isinstance(self.cpus_per_worker, (int, float)) and self.cpus_per_worker > 0):
            raise UserInputError("`cpus_per_worker` (--cpus-per-worker) must be a positive number. "
                                 f"Received: cpus_per_worker={self.cpus_per_worker!r}")
        if not (isinstance(self.gpus_per_worker, (int, float)) and self.gpus_per_worker >= 0):
            raise UserInputError("`gpus_per_worker` (--gpus-per-worker) must be a number >= 0. "
                                 f"Received: gpus_per_worker={self.gpus_per_worker!r}")
        if self.min_workers is not None and not 1 <= self.min_workers <= self.nproc:
            raise UserInputError("`min_workers` (--min-workers) must be from 1 to the number "
                                 f"of workers ({self.nproc}). "
                                 f"Received: min_workers={self.min_workers!r}")
        if self.elastic_batch not in (None, *protocol.ELASTIC_BATCH_CHOICES):
            raise UserInputError("`elastic_batch` (--elastic-batch) must be one of "
                                 f"{', '.join(protocol.ELASTIC_BATCH_CHOICES)}. "
                                 f"Received: elastic_batch={self.elastic_batch!r}")
        if self.min_workers is not None and self.elastic_batch is None:
            object.__setattr__(self, "elastic_batch", "global")

    def scaling(self) -> dict[str, Any]:
        """Ray Train's ``ScalingConfig`` arguments.

        Example:
            >>> RayJobSpec(command=("x",), nproc=2, gpus_per_worker=1).scaling()["use_gpu"]
            True
        """
        resources = {"CPU": float(self.cpus_per_worker)}
        if self.gpus_per_worker:
            resources["GPU"] = float(self.gpus_per_worker)
        workers = self.nproc if self.min_workers is None else (self.min_workers, self.nproc)
        return {"num_workers": workers, "resources_per_worker": resources,
                "use_gpu": bool(self.gpus_per_worker)}

    def worker_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The variables every worker's program gets from the driver (Ray does not pass them).

        Example:
            >>> RayJobSpec(command=("x",), nproc=1).worker_env(
            ...     {"MIRRORKIT_RUN_ID": "r", "HOME": "/h", "TF_CONFIG": "{}"})
            {'MIRRORKIT_RUN_ID': 'r'}
        """
        env = {k: v for k, v in environ.items()
               if k.startswith(_FORWARDED) and k not in protocol.WORKER_ENV}
        env[protocol.RUN_ID] = environ.get(protocol.RUN_ID) or time.strftime("%Y%m%d-%H%M%S")
        if environ.get(protocol.JOB_START):
            env[protocol.JOB_START] = environ[protocol.JOB_START]
        if self.elastic_batch:
            env[protocol.ELASTIC_BATCH] = self.elastic_batch
        env.update(self.env)
        return env


def _build(spec: RayJobSpec, *, echo: bool) -> tuple[Any, Any]:
    """The configured Ray Train trainer and the job's journal actor."""
    import_ray()
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    from mirrorkit.launcher.ray_backend import TFConfigBackend, trainer_class
    from mirrorkit.launcher.ray_worker import train_loop

    environ = _env.snapshot()
    env = spec.worker_env({**environ, protocol.JOB_START: f"{time.time():.6f}"})
    # Owned by the driver: it goes when the driver does, with the job.
    journal = ray.remote(num_cpus=0)(Journal).remote()
    config = {"command": list(spec.command), "journal": journal, "env": env,
              "cwd": os.getcwd(), "echo": echo,
              "threads": max(1, round(spec.cpus_per_worker))}
    run_config = RunConfig(name=f"mirrorkit-{env[protocol.RUN_ID]}", storage_path=spec.storage,
                           failure_config=FailureConfig(max_failures=spec.max_restarts))
    # What TensorflowTrainer is, minus its TensorFlow import in Ray's processes.
    made = trainer_class()(train_loop, train_loop_config=config,
                           backend_config=TFConfigBackend(),
                           scaling_config=ScalingConfig(**spec.scaling()),
                           run_config=run_config)
    return made, journal


def trainer(command: Sequence[str], *, num_workers: int = 2, cpus_per_worker: float = 1.0,
            gpus_per_worker: float = 0.0, max_restarts: int = 0,
            min_workers: int | None = None, storage_path: str | None = None,
            env: Mapping[str, str] | None = None) -> Any:
    """A Ray Train trainer that runs ``command`` as mirrorkit workers.

    For a driver of your own: every worker runs ``command`` (``mirrorkit train
    ...`` with its flags, ``mirrorkit run script.py`` or ``python script.py``)
    with the ``TF_CONFIG`` Ray gives it and mirrorkit's Keras fixes applied,
    its output through Ray's log forwarding, a failure restarting the worker
    group (``max_restarts``; ``mirrorkit train`` resumes from its epoch backup
    in ``--output``, which must be on storage every node sees), and the
    chief's metrics and final model (``mirrorkit train --output``) reported
    through ``ray.train.report``, so ``result.metrics`` and
    ``result.checkpoint`` hold them. Call it after ``ray.init(...)``.

    Args:
        command: the program and arguments every worker runs.
        num_workers: workers. Defaults to 2.
        cpus_per_worker: Ray CPUs per worker (also its intra-op threads). Defaults to 1.
        gpus_per_worker: Ray GPUs per worker. Defaults to 0.
        max_restarts: ``FailureConfig(max_failures)``. Defaults to 0.
        min_workers: an elastic worker range ``(min_workers, num_workers)``.
            Defaults to None.
        storage_path: ``RunConfig(storage_path)``. Defaults to Ray's.
        env: extra variables for every worker's program.

    Returns:
        A Ray Train ``DataParallelTrainer`` that sets each worker's
        ``TF_CONFIG`` as ``TensorflowTrainer`` does (without loading TensorFlow
        into Ray's own processes: :mod:`mirrorkit.launcher.ray_backend`); call
        ``fit()``.

    Raises:
        MissingDependency: Ray Train is not installed.
        UserInputError: an argument out of range.

    Example:
        >>> import ray, mirrorkit                                      # doctest: +SKIP
        >>> ray.init()                                                 # doctest: +SKIP
        >>> result = mirrorkit.ray_trainer(                            # doctest: +SKIP
        ...     ["mirrorkit", "train", "--epochs", "2", "--output", "/shared/run"],
        ...     num_workers=2, max_restarts=2).fit()
        >>> result.metrics["val_accuracy"]                             # doctest: +SKIP
        0.93
    """
    spec = RayJobSpec(command=tuple(command), nproc=num_workers, cpus_per_worker=cpus_per_worker,
                      gpus_per_worker=gpus_per_worker, max_restarts=max_restarts,
                      min_workers=min_workers, storage=storage_path, env=env or {})
    return _build(spec, echo=True)[0]


# The public name: ``mirrorkit.ray_trainer``.
ray_trainer = trainer


def _printer(ray: Any, journal: Any, streams: tuple[IO[str], IO[str]],
             done: threading.Event) -> threading.Thread:
    def pump() -> None:
        while True:
            finished = done.wait(_PRINT_SECONDS)
            try:
                lines = ray.get(journal.take.remote())
            except Exception:  # the cluster went away: the driver reports that
                return
            for stream, text in lines:
                out = streams[0] if stream == "out" else streams[1]
                out.write(text + "\n")
            for out in streams:
                out.flush()
            if finished:
                return

    thread = threading.Thread(target=pump, name="mirrorkit-ray-print", daemon=True)
    thread.start()
    return thread


def _reachable(address: str, timeout: float = 5.0) -> str | None:
    """Why ``HOST:PORT`` takes no TCP connection, or None (``auto`` is Ray's to resolve).

    Ray itself retries an unreachable head for minutes; a wrong address should be one line.
    """
    if address == "auto" or address.startswith(("ray://", "local")) or ":" not in address:
        return None
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except (OSError, ValueError) as err:
        return f"{type(err).__name__}: {err}"


def _connect(ray: Any, address: str) -> None:
    why = _reachable(address)
    if why is not None:
        raise RunError(f"Cannot connect to the Ray cluster at {address!r} ({why}): start one "
                       "with `ray start --head`, or pass --ray HOST:PORT of its head node.")
    try:
        # The workers' lines come through the journal with their rank; Ray's own
        # forwarding would print each twice, under Ray's prefix.
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING,
                 configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RunError(f"Cannot connect to the Ray cluster at {address!r}: {first} "
                       "(start one with `ray start --head`, or pass --ray HOST:PORT of "
                       "its head node)") from err


def run(spec: RayJobSpec, *, stdout: IO[str] | None = None,
        stderr: IO[str] | None = None) -> RunResult:
    """Run ``spec`` on the Ray cluster until it finishes, printing the workers' lines.

    Returns:
        The job's :class:`RunResult`: exit code 0, the first failed worker's
        status (128 + N for signal N), 3 when ``mirrorkit train`` missed its
        targets, 130 on Ctrl-C.

    Raises:
        MissingDependency: Ray Train is not installed.
        RunError: no cluster at ``spec.address``.
        UserInputError: the command's program is not found on this machine.

    Example:
        >>> run(RayJobSpec(command=("mirrorkit", "train"), nproc=2)).exit_code  # doctest: +SKIP
        0
    """
    ray = import_ray()
    # A typo in the program is one line here, not a failure per worker and restart.
    _resolve_program(spec.command[0], _env.get("PATH"))
    streams = (stdout or sys.stdout, stderr or sys.stderr)
    start = time.monotonic()
    _connect(ray, spec.address)
    try:
        nodes = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive"))
        logger.info("%d worker(s) through Ray Train on the cluster at %s (%d node(s): %s), "
                    "each %g CPU(s)%s; Ray places them, each says where", spec.nproc,
                    spec.address, len(nodes), ", ".join(nodes), spec.cpus_per_worker,
                    f" {spec.gpus_per_worker:g} GPU(s)" if spec.gpus_per_worker else "")
        logger.warning("the workers' TensorFlow servers listen on their nodes' addresses, "
                       "unauthenticated, like Ray's own ports: keep the cluster on a private "
                       "network (README: On a Ray cluster)")
        made, journal = _build(spec, echo=False)
        done = threading.Event()
        printer = _printer(ray, journal, streams, done)
        try:
            made.fit()
            ok, note = True, None
        except KeyboardInterrupt:
            done.set()
            return stopped(signal.SIGINT, time.monotonic() - start)
        except ray.train.TrainingFailedError as err:
            ok = False
            note = "Ray Train: " + " ".join(str(err).split())[:300]
        finally:
            done.set()
            printer.join(5.0)
        return ray.get(journal.result.remote(ok, note))
    finally:
        ray.shutdown()
