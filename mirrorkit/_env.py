"""The only module that reads ``os.environ``.

Everything mirrorkit takes from the environment passes through here, so the
data flow stays one way: CLI flags -> config -> environment -> library. The
launcher writes ``TF_CONFIG`` and ``MIRRORKIT_*`` into a child's environment
(their names are :mod:`mirrorkit.protocol`'s); the child reads them back
through these functions.

Example:
    >>> from mirrorkit import _env
    >>> _env.simulate_cpus() is None or _env.simulate_cpus() >= 1
    True
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, Mapping

from mirrorkit.errors import UserInputError

# The names `mirrorkit launch` sets for its workers are the launcher-to-worker
# protocol's (mirrorkit.protocol), so the launcher and this reader cannot drift.
from mirrorkit.protocol import (  # noqa: F401 (re-exported: _env.RESTART_COUNT, ...)
    CUDA_VISIBLE_DEVICES,
    ELASTIC_BATCH,
    ELASTIC_BATCH_CHOICES,
    JOB_START,
    JOIN_TIMEOUT,
    NETWORK,
    ORIGINAL_RANK,
    RESTART_COUNT,
    RESTART_REASON,
    RUN_ID,
    SCRATCH_DIR,
    STATUS_DIR,
    TF_CONFIG,
    TF_INTRA_OP_THREADS,
)

# The names of the other variables mirrorkit reads or writes, in one place.
SIMULATE_CPUS = "MIRRORKIT_SIMULATE_CPUS"
STRATEGY = "MIRRORKIT_STRATEGY"
SCALE_BATCH = "MIRRORKIT_SCALE_BATCH"
COLLECTIVE_TIMEOUT = "MIRRORKIT_COLLECTIVE_TIMEOUT"
# Slurm: opt-out switch, first port per node, GPUs per local task.
SLURM_ENABLE = "MIRRORKIT_SLURM"
SLURM_PORT = "MIRRORKIT_SLURM_PORT"
SLURM_GPUS_PER_TASK = "MIRRORKIT_SLURM_GPUS_PER_TASK"
# Set with the TF_CONFIG derived from Slurm, so a later read knows its source.
SLURM_DERIVED = "MIRRORKIT_SLURM_TF_CONFIG"
COMPAT = "MIRRORKIT_COMPAT"
COMPAT_DISABLE = "MIRRORKIT_COMPAT_DISABLE"
# off: mirrorkit train writes its run folder without the one-writer lock (training.run_lock).
RUN_LOCK = "MIRRORKIT_RUN_LOCK"
# Set to 1 by Ray Train's TensorFlow backend (tf_keras); mirrorkit's workers run Keras 3.
TF_USE_LEGACY_KERAS = "TF_USE_LEGACY_KERAS"
# TensorFlow's own inter-op thread count (read by its C++ runtime).
TF_INTER_OP_THREADS = "TF_NUM_INTEROP_THREADS"


def get(name: str, default: str | None = None) -> str | None:
    """Return environment variable ``name`` or ``default``.

    Example:
        >>> get("MIRRORKIT_SURELY_UNSET", "x")
        'x'
    """
    return os.environ.get(name, default)


def snapshot() -> dict[str, str]:
    """Return a copy of the whole environment (for building a child's env).

    Example:
        >>> isinstance(snapshot(), dict)
        True
    """
    return dict(os.environ)


def tf_config_text() -> str | None:
    """Return the raw ``TF_CONFIG`` text, or None when it is unset or blank."""
    text = os.environ.get(TF_CONFIG)
    if text is None or not text.strip():
        return None
    return text


def _positive(name: str, cast: type, what: str) -> Any:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = cast(raw)
    except ValueError:
        value = 0
    if not value > 0:
        raise UserInputError(f"{name} must be {what}. Received: {name}={raw!r}")
    return value


def _positive_int(name: str) -> int | None:
    return _positive(name, int, "a positive integer")


def _positive_seconds(name: str) -> float | None:
    return _positive(name, float, "a positive number of seconds")


def simulate_cpus() -> int | None:
    """Return ``MIRRORKIT_SIMULATE_CPUS`` as an int, or None when unset.

    Raises:
        UserInputError: if it is set to something other than a positive integer.
    """
    return _positive_int(SIMULATE_CPUS)


def strategy_kind() -> str | None:
    """Return ``MIRRORKIT_STRATEGY`` (a strategy kind name) or None."""
    value = os.environ.get(STRATEGY)
    return value.strip() if value and value.strip() else None


def restart_count() -> int:
    """Return ``MIRRORKIT_RESTART_COUNT`` set by ``mirrorkit launch`` (0 if unset)."""
    raw = os.environ.get(RESTART_COUNT, "0")
    try:
        return max(int(raw), 0)
    except ValueError:
        return 0


def restart_reason() -> str | None:
    """Return ``MIRRORKIT_RESTART_REASON``: why ``mirrorkit launch`` restarted the group, or None."""
    value = os.environ.get(RESTART_REASON, "").strip()
    return value or None


def original_rank() -> int | None:
    """Return ``MIRRORKIT_ORIGINAL_RANK``: a launched worker's rank in the job's first
    attempt (an elastic job renumbers survivors; this stays), or None when unset.

    Example:
        >>> with patch({"MIRRORKIT_ORIGINAL_RANK": "2"}):
        ...     original_rank()
        2
    """
    raw = os.environ.get(ORIGINAL_RANK, "").strip()
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def elastic_batch() -> str | None:
    """Return ``MIRRORKIT_ELASTIC_BATCH`` (``global`` or ``per-replica``), or None when unset."""
    value = os.environ.get(ELASTIC_BATCH, "").strip().lower()
    return value if value in ELASTIC_BATCH_CHOICES else None


def status_dir() -> str | None:
    """Return ``MIRRORKIT_STATUS_DIR``, where a launched worker reports its throughput, or None."""
    value = os.environ.get(STATUS_DIR, "").strip()
    return value or None


def scratch_dir() -> str | None:
    """Return ``MIRRORKIT_SCRATCH_DIR``: the launched job's scratch root, which the
    launcher removes when the job ends, or None (not launched, or set to a folder
    that does not exist).

    Example:
        >>> with patch({"MIRRORKIT_SCRATCH_DIR": "/surely/not/a/folder"}):
        ...     scratch_dir() is None
        True
    """
    value = os.environ.get(SCRATCH_DIR, "").strip()
    return value if value and os.path.isdir(value) else None


def run_id() -> str | None:
    """Return ``MIRRORKIT_RUN_ID``: one name for a launched job, shared by its
    workers and kept across restarts (so default run folders agree), or None."""
    value = os.environ.get(RUN_ID, "").strip()
    return value or None


def job_start() -> float | None:
    """Return ``MIRRORKIT_JOB_START``: when ``mirrorkit launch`` started this job
    (Unix seconds, the same on every worker and across restarts), or None."""
    try:
        value = float(os.environ.get(JOB_START, "").strip())
    except ValueError:
        return None
    return value if 0 < value < float("inf") else None


def scale_batch() -> bool:
    """Return True when ``MIRRORKIT_SCALE_BATCH`` asks for per-replica batches."""
    return os.environ.get(SCALE_BATCH, "").strip().lower() in {"1", "true", "yes"}


def collective_timeout() -> float | None:
    """Return ``MIRRORKIT_COLLECTIVE_TIMEOUT`` in seconds, or None when unset.

    It bounds how long a multi-worker process waits for a peer that stopped
    answering (see :func:`mirrorkit.configure_failure_detection`).
    """
    return _positive_seconds(COLLECTIVE_TIMEOUT)


def join_timeout() -> float | None:
    """Return ``MIRRORKIT_JOIN_TIMEOUT`` in seconds (wait for all workers to start), or None."""
    return _positive_seconds(JOIN_TIMEOUT)


def compat_enabled() -> bool:
    """Return False when ``MIRRORKIT_COMPAT`` is ``off``/``0``/``false``/``no``.

    Example:
        >>> with patch({"MIRRORKIT_COMPAT": "off"}):
        ...     compat_enabled()
        False
    """
    raw = os.environ.get(COMPAT, "").strip().lower()
    return raw not in {"off", "0", "false", "no", "none"}


def run_lock() -> bool:
    """Return False when ``MIRRORKIT_RUN_LOCK`` is ``off``/``0``/``false``/``no``.

    Example:
        >>> with patch({"MIRRORKIT_RUN_LOCK": "off"}):
        ...     run_lock()
        False
    """
    return os.environ.get(RUN_LOCK, "").strip().lower() not in {"off", "0", "false", "no"}


def compat_disabled() -> list[str]:
    """Return the fix names listed in ``MIRRORKIT_COMPAT_DISABLE`` (comma-separated).

    Example:
        >>> with patch({"MIRRORKIT_COMPAT_DISABLE": "scalar-logs, symbolic-build"}):
        ...     compat_disabled()
        ['scalar-logs', 'symbolic-build']
    """
    raw = os.environ.get(COMPAT_DISABLE, "")
    return [n.strip() for n in raw.split(",") if n.strip()]


def slurm() -> dict[str, str]:
    """Return every ``SLURM_*`` (and ``SLURMD_NODENAME``) variable; empty outside Slurm."""
    return {k: v for k, v in os.environ.items() if k.startswith(("SLURM_", "SLURMD_"))}


def slurm_enabled() -> bool:
    """Return False when ``MIRRORKIT_SLURM`` is ``0``/``off``/``false``/``no``.

    The escape hatch for running a single process inside a multi-task step.

    Example:
        >>> with patch({"MIRRORKIT_SLURM": "off"}):
        ...     slurm_enabled()
        False
    """
    raw = os.environ.get(SLURM_ENABLE, "").strip().lower()
    return raw not in {"off", "0", "false", "no"}


def slurm_port() -> int | None:
    """Return ``MIRRORKIT_SLURM_PORT`` (the first port of each node), or None.

    Raises:
        UserInputError: if it is not a port number from 1 to 65535.

    Example:
        >>> with patch({"MIRRORKIT_SLURM_PORT": "8888"}):
        ...     slurm_port()
        8888
    """
    value = _positive_int(SLURM_PORT)
    if value is not None and value > 65535:
        raise UserInputError(
            f"{SLURM_PORT} must be a port from 1 to 65535. "
            f"Received: {SLURM_PORT}={value}"
        )
    return value


def slurm_gpus_per_task() -> int | None:
    """Return ``MIRRORKIT_SLURM_GPUS_PER_TASK`` (GPUs to give each local task), or None.

    Raises:
        UserInputError: if it is set to something other than a positive integer.
    """
    return _positive_int(SLURM_GPUS_PER_TASK)


def export(values: Mapping[str, str]) -> None:
    """Set variables in this process for good (no restore), e.g. a derived ``TF_CONFIG``.

    For values that code outside mirrorkit reads straight from the
    environment (TensorFlow reads ``TF_CONFIG`` and ``CUDA_VISIBLE_DEVICES``
    itself). Use :func:`patch` for anything temporary.

    Example:
        >>> with patch({"MIRRORKIT_EXAMPLE": None}):  # restores it afterwards
        ...     export({"MIRRORKIT_EXAMPLE": "1"})
        ...     get("MIRRORKIT_EXAMPLE")
        '1'
    """
    for key, value in values.items():
        os.environ[key] = value


def hide_from_children(name: str) -> bool:
    """Keep ``name`` in ``os.environ`` but out of the processes this one starts.

    Only the C environment, which ``subprocess``, ``os.system`` and
    ``multiprocessing`` spawn inherit, loses it (``os.unsetenv``); code of
    this process that reads ``os.environ`` still sees it.

    Returns:
        True when it was set and is now hidden.

    Example:
        >>> with patch({"MIRRORKIT_EXAMPLE": None}):
        ...     hide_from_children("MIRRORKIT_EXAMPLE")
        False
    """
    if os.environ.get(name) is None or not hasattr(os, "unsetenv"):
        return False
    os.unsetenv(name)
    return True


def replace_path_list(name: str, keep: Callable[[str], bool]) -> bool:
    """Drop the entries of a path-list variable (``PYTHONPATH``) that ``keep`` rejects.

    Returns:
        True when something was removed (the variable is removed when empty).

    Example:
        >>> with patch({"MIRRORKIT_EXAMPLE": "a:b"}):
        ...     replace_path_list("MIRRORKIT_EXAMPLE", lambda e: e != "b"), get("MIRRORKIT_EXAMPLE")
        (True, 'a')
    """
    value = os.environ.get(name)
    if value is None:
        return False
    entries = value.split(os.pathsep)
    kept = [e for e in entries if keep(e)]
    if kept == entries:
        return False
    _set({name: os.pathsep.join(kept) if any(kept) else None})
    return True


def cuda_visible_devices() -> str | None:
    """Return ``CUDA_VISIBLE_DEVICES`` as set, or None."""
    return os.environ.get(CUDA_VISIBLE_DEVICES)


def quiet_tensorflow() -> None:
    """Lower TensorFlow's C++ start-up chatter unless the user chose a level.

    Called before TensorFlow is first imported, so the CLI's output is ours.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@contextlib.contextmanager
def patch(values: Mapping[str, str | None]) -> Iterator[None]:
    """Temporarily set (or, with None, remove) variables; restore on exit.

    Example:
        >>> with patch({"MIRRORKIT_SIMULATE_CPUS": "2"}):
        ...     simulate_cpus()
        2
    """
    saved = {k: os.environ.get(k) for k in values}
    try:
        _set(values)
        yield
    finally:
        _set(saved)


def _set(values: Mapping[str, str | None]) -> None:
    for key, value in values.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
