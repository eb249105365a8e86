"""What runs inside each Ray Train worker of ``mirrorkit launch --ray``: the user's command.

Ray Train starts one worker actor per rank on the cluster's nodes and
:mod:`mirrorkit.launcher.ray_backend` sets ``TF_CONFIG`` in it (the node's
address, a free port), as Ray's ``TensorflowTrainer`` does.
:func:`train_loop`, the trainer's ``train_loop_per_worker``, then does what a
local launch's :class:`~mirrorkit.launcher.group.WorkerGroup` does for one
worker: it starts the command line as a child process with the same
environment (``TF_CONFIG``, the ``MIRRORKIT_*`` protocol variables, the
``_site`` bootstrap that applies mirrorkit's Keras fixes), streams its output
as ``[rank] ...`` lines to the driver through the job's
:class:`~mirrorkit.launcher.ray_journal.Journal`, and maps its end to Ray's
terms: exit 0 (or 3 with missed targets) reports metrics, and worker 0 the
final model, through ``ray.train.report``; anything else raises, so Ray's
failure handling restarts the worker group while ``max_failures`` allow.

Example:
    >>> run_folder(("mirrorkit", "train", "--output", "runs/a"))
    'runs/a'
    >>> sorted(child_env({"TF_USE_LEGACY_KERAS": "1"}, tf_config="{}", rank=1,
    ...                  attempt=0, reason=None, job={}, status_dir="/s", scratch="/t",
    ...                  threads=None))[:3]
    ['MIRRORKIT_ORIGINAL_RANK', 'MIRRORKIT_RESTART_COUNT', 'MIRRORKIT_SCRATCH_DIR']
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

from mirrorkit import _env, protocol
from mirrorkit.launcher import worker_status
from mirrorkit.launcher.agent import _resolve_program
from mirrorkit.launcher.bootstrap import SITE_DIR
from mirrorkit.launcher.process import WorkerProcess
from mirrorkit.launcher.state import WorkerState

# How often a worker sends its buffered output lines to the driver.
_FLUSH_SECONDS = 0.2
# What a chief's run folder holds that Ray should keep as the final checkpoint.
_CHECKPOINT_FILES = ("model.keras", "metrics.json", "history.csv", "events.jsonl")


def run_folder(command: Sequence[str]) -> str | None:
    """The ``--output`` folder of a ``mirrorkit train`` command line, else None.

    Example:
        >>> run_folder(("python", "t.py")) is None, run_folder(("mirrorkit", "train", "--output=o"))
        (True, 'o')
    """
    for i, arg in enumerate(command):
        if arg == "--output" and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith("--output="):
            return arg.split("=", 1)[1]
    return None


def child_env(base: Mapping[str, str], *, tf_config: str, rank: int, attempt: int,
              reason: str | None, job: Mapping[str, str], status_dir: str, scratch: str,
              threads: int | None) -> dict[str, str]:
    """The environment of one worker's program: a local launch's, with Ray's ``TF_CONFIG``.

    Ray's own TensorFlow backend sets ``TF_USE_LEGACY_KERAS=1`` (for
    ``tf_keras``), and an actor can inherit it from the cluster's
    environment; mirrorkit runs Keras 3, so it is dropped unless ``job``
    (the driver's variables) sets it.

    Example:
        >>> env = child_env({}, tf_config="{}", rank=0, attempt=1, reason="worker 1 was "
        ...                 "killed", job={}, status_dir="/s", scratch="/t", threads=2)
        >>> env["MIRRORKIT_RESTART_COUNT"], env["TF_NUM_INTRAOP_THREADS"]
        ('1', '2')
    """
    env = {k: v for k, v in base.items() if k != _env.TF_USE_LEGACY_KERAS}
    env.update(job)
    env[protocol.TF_CONFIG] = tf_config
    env[protocol.RESTART_COUNT] = str(attempt)
    # Ray renumbers its workers on every attempt: the rank is the only identity.
    env[protocol.ORIGINAL_RANK] = str(rank)
    if reason:
        env[protocol.RESTART_REASON] = reason
    env[protocol.STATUS_DIR] = status_dir
    env[protocol.SCRATCH_DIR] = scratch
    env["PYTHONUNBUFFERED"] = "1"
    if threads and not job.get(protocol.TF_INTRA_OP_THREADS):
        env[protocol.TF_INTRA_OP_THREADS] = str(threads)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE_DIR), base.get("PYTHONPATH")]))
    return env


class _Lines:
    """A text stream whose lines go to the driver's journal in batches (and, echoing, here)."""

    def __init__(self, sink: "_Sink", name: str) -> None:
        self._sink, self._name = sink, name

    def write(self, text: str) -> None:
        self._sink.add(self._name, text.rstrip("\n"))

    def flush(self) -> None:
        """Lines leave on the sink's schedule."""


class _Sink:
    """Buffers output lines and sends them every :data:`_FLUSH_SECONDS` to the journal."""

    def __init__(self, journal: Any, echo: bool) -> None:
        self._journal, self._echo = journal, echo
        self._buffer: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.out, self.err = _Lines(self, "out"), _Lines(self, "err")
        self._thread = threading.Thread(target=self._run, name="mirrorkit-ray-lines",
                                        daemon=True)
        self._thread.start()

    def add(self, stream: str, line: str) -> None:
        with self._lock:
            self._buffer.append((stream, line))
        if self._echo:
            # A driver of the user's own sees these through Ray's log forwarding.
            print(line, file=sys.stdout if stream == "out" else sys.stderr, flush=True)

    def send(self) -> None:
        with self._lock:
            batch, self._buffer = self._buffer, []
        if batch:
            import ray

            ray.get(self._journal.lines.remote(batch))

    def _run(self) -> None:
        while not self._done.wait(_FLUSH_SECONDS):
            self.send()

    def close(self) -> None:
        self._done.set()
        self._thread.join()
        self.send()


def _final_checkpoint(folder: str | None, scratch: str) -> Any:
    """A Ray checkpoint of the chief's final model and records, when the run folder has them."""
    if folder is None or not (Path(folder) / "model.keras").is_file():
        return None
    from ray.train import Checkpoint

    keep = Path(scratch) / "checkpoint"
    keep.mkdir()
    for name in _CHECKPOINT_FILES:
        if (Path(folder) / name).is_file():
            shutil.copy2(Path(folder) / name, keep / name)
    return Checkpoint.from_directory(str(keep))


def _metrics(rank: int, attempt: int, status: dict[str, Any] | None,
             folder: str | None) -> dict[str, Any]:
    """What this worker reports to Ray: its speed, and the chief's run metrics."""
    metrics: dict[str, Any] = {"rank": rank, "attempt": attempt}
    if status:
        metrics.update({k: v for k, v in status.items()
                        if isinstance(v, (int, float)) and k != "version"})
    path = Path(folder) / "metrics.json" if folder else None
    if rank == 0 and path is not None and path.is_file():
        run = json.loads(path.read_text())
        metrics.update({k: v for k, v in run.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return metrics


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train's ``train_loop_per_worker``: run the job's command as this worker.

    Args:
        config: built by :func:`mirrorkit.launcher.ray_job.trainer`: ``command``,
            ``journal`` (the job's :class:`~mirrorkit.launcher.ray_journal.Journal`
            actor), ``env`` (the driver's ``MIRRORKIT_*``/``TF_*`` variables and
            the job's run id), ``cwd``, ``threads`` and ``echo``.

    Raises:
        RuntimeError: the command failed; Ray restarts the worker group while
            its ``FailureConfig(max_failures)`` allows.

    Example (what the Ray Train trainer calls on every worker):
        >>> train_loop({"command": ["mirrorkit", "train"], ...})   # doctest: +SKIP
    """
    import ray
    import ray.train

    rank = ray.train.get_context().get_world_rank()
    journal, node = config["journal"], ray.util.get_node_ip_address()
    attempt, reason = ray.get(journal.begin.remote(rank, node, os.getpid()))
    if config.get("cwd") and os.path.isdir(config["cwd"]):
        # Relative paths in the command mean the driver's folder, as in a local launch.
        os.chdir(config["cwd"])
    scratch = tempfile.mkdtemp(prefix="mirrorkit-ray-")
    status_dir = os.path.join(scratch, "status")
    os.mkdir(status_dir)
    sink = _Sink(journal, bool(config.get("echo")))
    try:
        tf_config = _env.get(protocol.TF_CONFIG) or ""
        address = json.loads(tf_config)["cluster"]["worker"][rank] if tf_config else "?"
        sink.add("err", f"[launch] worker {rank} runs on node {node} as {address} "
                 f"(attempt {attempt + 1})")
        env = child_env(_env.snapshot(), tf_config=tf_config, rank=rank, attempt=attempt,
                        reason=reason, job=config.get("env", {}), status_dir=status_dir,
                        scratch=scratch, threads=config.get("threads"))
        command = config["command"]
        argv = [_resolve_program(command[0], env.get("PATH")), *command[1:]]
        worker = WorkerProcess(rank, argv, env, attempt, (sink.out, sink.err),
                               threading.Lock(), threading.Event(), None)
        worker.exited.wait()
        state = worker.observe()
        worker.drain()
        statuses = worker_status.read(status_dir)
        status = statuses[0] if statuses else None
        if state is not WorkerState.SUCCEEDED:
            failure = worker.failure()
            ray.get(journal.failed.remote(dataclasses.asdict(failure)))
            lost = f"; it reports: {failure.lost_peer}" if failure.lost_peer else ""
            sink.add("err", f"[launch] {failure.describe()} on node {node}{lost}; Ray Train "
                     "stops the group and restarts it while --max-restarts allow")
            sink.close()
            raise RuntimeError(f"mirrorkit: {failure.describe()} on node {node}")
        ray.get(journal.finished.remote(rank, attempt, worker.targets_missed, status))
        sink.close()
        folder = run_folder(command)
        checkpoint = _final_checkpoint(folder, scratch) if rank == 0 else None
        # Every worker reports once (Ray's report is a barrier across the workers).
        ray.train.report(_metrics(rank, attempt, status, folder), checkpoint=checkpoint)
    finally:
        sink.close()
        shutil.rmtree(scratch, ignore_errors=True)
