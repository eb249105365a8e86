"""The contract between ``mirrorkit launch`` and the workers it starts, in one place.

The launcher never imports a worker's code and a worker never imports the
launcher: they meet only through what this module defines, so both sides
import it and neither can drift from the other.

* **Environment variables** the launcher sets for every worker (names only;
  :mod:`mirrorkit._env` reads them): :data:`WORKER_ENV`.
* **Exit codes** the launcher interprets: :class:`ExitCode`, and
  :func:`signal_exit_code` for a worker killed by a signal.
* **Output lines** the launcher looks for in a worker's stdout/stderr: the
  lost-peer line (:func:`format_lost_peer` / :func:`parse_lost_peer`) and
  the missed-target line (:func:`format_target_missed` /
  :func:`parse_target_missed`).
* **The status file** ``worker-RANK.json`` a worker leaves in
  ``MIRRORKIT_STATUS_DIR`` for the launcher's final summary, versioned:
  :func:`write_status` / :func:`read_status`.
* **Timeouts** both sides wait by: :data:`DEFAULT_PEER_TIMEOUT`,
  :data:`DEFAULT_JOIN_TIMEOUT`, :data:`EXIT_MARGIN`.

It sits at the bottom layer and imports only the standard library, so the
launcher's process (which never loads TensorFlow) and any worker can use it.

Example:
    >>> line = format_lost_peer("worker 1 at b:2", "connection refused",
    ...                         "no training step finished for 2.0 s")
    >>> parse_lost_peer(line).lost
    'worker 1 at b:2'
    >>> ExitCode.TARGET_MISSED == 3
    True
"""

from __future__ import annotations

import enum
import json
import math
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "TF_CONFIG", "RESTART_COUNT", "RUN_ID", "JOB_START", "ORIGINAL_RANK", "RESTART_REASON",
    "ELASTIC_BATCH", "ELASTIC_BATCH_CHOICES", "STATUS_DIR", "NETWORK", "NETWORK_ISOLATED", "JOIN_TIMEOUT",
    "SCRATCH_DIR", "TF_INTRA_OP_THREADS", "CUDA_VISIBLE_DEVICES", "WORKER_ENV",
    "ExitCode", "SIGNAL_EXIT_BASE", "signal_exit_code",
    "LOST_PEER_MARKER", "LostPeer", "format_lost_peer", "parse_lost_peer",
    "TARGET_MISSED_PREFIX", "TargetMissed", "format_target_missed", "parse_target_missed",
    "STATUS_VERSION", "STATUS_FIELDS", "STATUS_GLOB", "status_file_name", "encode_status",
    "decode_status", "write_status", "read_status",
    "DEFAULT_PEER_TIMEOUT", "DEFAULT_JOIN_TIMEOUT", "EXIT_MARGIN",
]

# --- Environment variables the launcher sets for each worker ---------------------------------

TF_CONFIG = "TF_CONFIG"
# The attempt: 0 for the first, +1 per whole-group restart (torchrun's TORCHELASTIC_RESTART_COUNT).
RESTART_COUNT = "MIRRORKIT_RESTART_COUNT"
# One name for the job, the same on every worker and across restarts, so
# default run folders agree.
RUN_ID = "MIRRORKIT_RUN_ID"
# When the job began (Unix seconds), taken by each node's launcher before its
# rendezvous (so before any worker starts) and kept across restarts: a
# directory made after it was made by the job (mirrorkit.runner.job_dirs).
JOB_START = "MIRRORKIT_JOB_START"
# A worker's rank in the first attempt, which stays its name when an elastic
# job renumbers the survivors of a loss.
ORIGINAL_RANK = "MIRRORKIT_ORIGINAL_RANK"
# From the second attempt on: why the group restarted (one line), for the run's event log.
RESTART_REASON = "MIRRORKIT_RESTART_REASON"
# With --min-workers: what a resumed run keeps when the worker count changed.
ELASTIC_BATCH = "MIRRORKIT_ELASTIC_BATCH"
ELASTIC_BATCH_CHOICES = ("global", "per-replica")
# Private folders: worker-RANK.json's (write_status), the job's scratch root (removed at its end).
STATUS_DIR = "MIRRORKIT_STATUS_DIR"
SCRATCH_DIR = "MIRRORKIT_SCRATCH_DIR"
# Set to NETWORK_ISOLATED for workers in the launcher's private network namespace.
NETWORK = "MIRRORKIT_NETWORK"
NETWORK_ISOLATED = "isolated"
# Read on both sides: the workers' coordination service and the launchers' rendezvous.
JOIN_TIMEOUT = "MIRRORKIT_JOIN_TIMEOUT"
# Read by TensorFlow's runtime, not by mirrorkit: the launcher splits the cores
# and the GPUs between the workers of one machine.
TF_INTRA_OP_THREADS = "TF_NUM_INTRAOP_THREADS"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"

# Every variable above that the launcher may set in a worker's environment.
WORKER_ENV = (TF_CONFIG, RESTART_COUNT, RUN_ID, JOB_START, ORIGINAL_RANK, RESTART_REASON, NETWORK,
              ELASTIC_BATCH, STATUS_DIR, SCRATCH_DIR, TF_INTRA_OP_THREADS, CUDA_VISIBLE_DEVICES)

# --- Exit codes ---------------------------------------------------------------------------------


class ExitCode(enum.IntEnum):
    """What a worker's (and ``mirrorkit launch``'s own) exit status means to the launcher.

    Attributes:
        OK: finished; the launcher counts the worker as succeeded.
        FAILED: an error; the launcher stops the group and restarts it while
            restarts remain.
        USAGE: a bad flag or value (click's usage error); also a failure to the launcher.
        TARGET_MISSED: ``mirrorkit train --target`` finished but missed a
            target. Counted as finished (no restart) only when the worker
            also printed a :func:`format_target_missed` line; the launcher
            then exits with it too, so a CI job can gate on it.

    A worker killed by signal N is reported as :func:`signal_exit_code`
    (128 + N), as a shell does.

    Example:
        >>> ExitCode.TARGET_MISSED == 3, int(ExitCode.FAILED)
        (True, 1)
    """

    OK = 0
    FAILED = 1
    USAGE = 2
    TARGET_MISSED = 3


SIGNAL_EXIT_BASE = 128


def signal_exit_code(signum: int) -> int:
    """The shell-style exit status of a process ended by signal ``signum``: 128 + N.

    Example:
        >>> signal_exit_code(9), signal_exit_code(2)
        (137, 130)
    """
    return SIGNAL_EXIT_BASE + int(signum)


# --- Output lines the launcher scrapes ----------------------------------------------------------

# The lost-peer line, printed by a surviving worker as its last line; the
# launcher leads a failure's summary with it and treats the worker as a
# witness, not a culprit.
LOST_PEER_MARKER = "mirrorkit: lost peer "


class LostPeer(NamedTuple):
    """A lost-peer line read back (see :func:`parse_lost_peer`).

    Attributes:
        lost: who was lost, ``"worker 1 at hostb:23400"`` (several comma-separated).
        what: what the worker observed, ``"stopped sending heartbeats"``.
        wait: how long it had been waiting, ``"no training step finished for 6.1 s"``.
        line: the whole line, stripped.
    """

    lost: str
    what: str
    wait: str
    line: str


def format_lost_peer(lost: str, what: str, wait: str) -> str:
    """The one line a worker prints when a peer is lost: ``MARKER LOST (WHAT); WAIT``.

    Args:
        lost: who was lost (may itself hold parentheses).
        what: what was observed; no parentheses, so the line parses back.
        wait: how long this worker waited; no ``"); "``.

    Raises:
        ValueError: a part holds a line break, or ``what``/``wait`` the separators.

    Example:
        >>> format_lost_peer("worker 1 at b:2", "connection refused", "heartbeat timeout 10 s")
        'mirrorkit: lost peer worker 1 at b:2 (connection refused); heartbeat timeout 10 s'
    """
    parts = {"lost": lost, "what": what, "wait": wait}
    for name, value in parts.items():
        if not isinstance(value, str) or not value or "\n" in value or "\r" in value:
            raise ValueError(f"`{name}` must be a non-empty single-line string. "
                             f"Received: {name}={value!r}")
    if "(" in what or ")" in what or "); " in wait:
        raise ValueError("`what` must hold no parentheses and `wait` no '); ', or the line "
                         f"cannot be read back. Received: what={what!r}, wait={wait!r}")
    return f"{LOST_PEER_MARKER}{lost} ({what}); {wait}"


def parse_lost_peer(line: str) -> LostPeer | None:
    """Read a :func:`format_lost_peer` line back, or None when ``line`` is not one.

    Example:
        >>> parse_lost_peer("[1] mirrorkit: lost peer x") is None
        True
        >>> parse_lost_peer("mirrorkit: lost peer chief 0 at c:1 (connection reset); "
        ...                 "heartbeat timeout 5 s").what
        'connection reset'
    """
    line = line.strip()
    if not line.startswith(LOST_PEER_MARKER):
        return None
    head, sep, wait = line[len(LOST_PEER_MARKER):].rpartition("); ")
    lost, sep2, what = head.rpartition(" (")
    if not (sep and sep2 and lost and what and wait) or "(" in what or ")" in what:
        return None
    return LostPeer(lost, what, wait, line)


# The missed-target line `mirrorkit train` prints before exiting with TARGET_MISSED.
TARGET_MISSED_PREFIX = "target missed: "


class TargetMissed(NamedTuple):
    """A missed-target line read back: the target as written and the value measured (or None)."""

    target: str
    measured: float | None


def format_target_missed(target: str, value: float | None) -> str:
    """The line for one missed target (the value to 6 significant digits, or ``nothing``).

    Example:
        >>> format_target_missed("val_loss<0.2", 0.25)
        'target missed: val_loss<0.2 (measured 0.25)'
    """
    measured = "nothing" if value is None else format(value, ".6g")
    return f"{TARGET_MISSED_PREFIX}{target} (measured {measured})"


def parse_target_missed(line: str) -> TargetMissed | None:
    """Read a :func:`format_target_missed` line back, or None when ``line`` is not one.

    Example:
        >>> parse_target_missed("target missed: val_loss<0.2 (measured nothing)")
        TargetMissed(target='val_loss<0.2', measured=None)
    """
    line = line.strip()
    if not line.startswith(TARGET_MISSED_PREFIX) or not line.endswith(")"):
        return None
    target, sep, measured = line[len(TARGET_MISSED_PREFIX):-1].rpartition(" (measured ")
    if not sep or not target:
        return None
    if measured == "nothing":
        return TargetMissed(target, None)
    try:
        return TargetMissed(target, float(measured))
    except ValueError:
        return None


# --- The status file ----------------------------------------------------------------------------

# Version 1 added the "version" field itself; files without it predate this module.
STATUS_VERSION = 1
# Each field and the JSON types it may hold (None: null).
STATUS_FIELDS: dict[str, tuple[type, ...]] = {
    "rank": (int,),                       # the worker's rank when it wrote the file
    "epoch": (int,),                      # epochs finished (1-based)
    "step_ms": (int, float),              # wall time per step, the same on every worker
    "images_per_second": (int, float, type(None)),  # its share of the global batch / step time
    "local_step_ms": (int, float, type(None)),      # its own share of the work, no communication
}
STATUS_GLOB = "worker-*.json"
_STATUS_NAME = re.compile(r"^worker-(\d+)\.json$")


def status_file_name(rank: int) -> str:
    """The status file's name for ``rank``: ``worker-RANK.json``.

    Raises:
        ValueError: ``rank`` is not a non-negative integer.

    Example:
        >>> status_file_name(3)
        'worker-3.json'
    """
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ValueError(f"`rank` must be a non-negative integer. Received: rank={rank!r}")
    return f"worker-{rank}.json"


def _check_status(status: Any, source: str) -> dict[str, Any]:
    if not isinstance(status, dict):
        raise ValueError(f"{source} is not a worker status: expected a JSON object. "
                         f"Received: {type(status).__name__}")
    version = status.get("version")
    if version != STATUS_VERSION:
        age = ("an older mirrorkit (no version)" if version is None else
               f"another mirrorkit (version {version!r})")
        raise ValueError(f"{source} was written by {age}; this one reads version "
                         f"{STATUS_VERSION}. Use the same mirrorkit on the launcher and workers.")
    unknown = sorted(set(status) - set(STATUS_FIELDS) - {"version"})
    missing = [name for name in STATUS_FIELDS if name not in status]
    if unknown or missing:
        raise ValueError(f"{source} does not match worker status version {STATUS_VERSION}: "
                         f"missing {missing}, unknown {unknown}")
    for name, types in STATUS_FIELDS.items():
        value = status[name]
        if isinstance(value, bool) or not isinstance(value, types) or (
                isinstance(value, float) and not math.isfinite(value)) or (
                isinstance(value, (int, float)) and value < 0):
            kinds = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise ValueError(f"{source}: `{name}` must be a non-negative {kinds}. "
                             f"Received: {name}={value!r}")
    return {name: status[name] for name in STATUS_FIELDS}


def encode_status(*, rank: int, epoch: int, step_ms: float, images_per_second: float | None,
                  local_step_ms: float | None) -> str:
    """One worker's status as the file's text (one JSON line), validated.

    Raises:
        ValueError: a field of the wrong type or negative.

    Example:
        >>> encode_status(rank=0, epoch=1, step_ms=20.0, images_per_second=1600.0,
        ...               local_step_ms=8.5)
        '{"version": 1, "rank": 0, "epoch": 1, "step_ms": 20.0, "images_per_second": 1600.0, "local_step_ms": 8.5}\\n'
    """
    status = {"version": STATUS_VERSION, "rank": rank, "epoch": epoch, "step_ms": step_ms,
              "images_per_second": images_per_second, "local_step_ms": local_step_ms}
    _check_status(status, "a worker status")
    return json.dumps(status) + "\n"


def decode_status(text: str, source: str = "a worker status") -> dict[str, Any]:
    """The fields of a status file's text, validated (``version`` checked, then dropped).

    Args:
        text: the file's contents.
        source: how errors name it. Defaults to ``"a worker status"``.

    Raises:
        ValueError: not JSON, another version, or a field missing, unknown or of the wrong type.

    Example:
        >>> decode_status('{"version": 1, "rank": 1, "epoch": 2, "step_ms": 9.0, '
        ...               '"images_per_second": null, "local_step_ms": null}')["rank"]
        1
    """
    try:
        status = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{source} is not valid JSON: {err}") from err
    return _check_status(status, source)


def write_status(path: str | os.PathLike, **fields: Any) -> None:
    """Write one worker's status to ``path``, atomically (the launcher may read at any time).

    Args:
        path: ``<MIRRORKIT_STATUS_DIR>/worker-RANK.json`` (:func:`status_file_name`).
        **fields: the keyword arguments of :func:`encode_status`.

    Raises:
        ValueError: see :func:`encode_status`.

    Example:
        >>> write_status(Path(status_dir) / status_file_name(0), rank=0, epoch=1,
        ...              step_ms=20.0, images_per_second=None,
        ...              local_step_ms=None)                       # doctest: +SKIP
    """
    text = encode_status(**fields)
    path = Path(path)
    # Replace, never half-write: a reader sees the old file or the new one.
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_status(path: str | os.PathLike) -> dict[str, Any]:
    """Read and validate one ``worker-RANK.json`` (its name must match its ``rank``).

    Raises:
        OSError: the file cannot be read.
        ValueError: see :func:`decode_status`; or the name and the rank disagree.

    Example:
        >>> read_status(Path(status_dir) / "worker-0.json")["epoch"]   # doctest: +SKIP
        1
    """
    path = Path(path)
    status = decode_status(path.read_text(), source=f"worker status file {str(path)!r}")
    named = _STATUS_NAME.match(path.name)
    if named is None or int(named.group(1)) != status["rank"]:
        raise ValueError(f"worker status file {str(path)!r} holds rank {status['rank']}; "
                         f"it must be named {status_file_name(status['rank'])!r}")
    return status


# --- Timeouts (seconds) -------------------------------------------------------------------------

# A peer without heartbeats for this long is lost (TensorFlow's own default);
# MIRRORKIT_COLLECTIVE_TIMEOUT overrides it.
DEFAULT_PEER_TIMEOUT = 10.0
# How long workers wait at start-up for each other, and the launchers of a
# multi-node elastic job for each other at the rendezvous (MIRRORKIT_JOIN_TIMEOUT
# overrides both): TensorFlow's own wait is an hour, too long to notice.
DEFAULT_JOIN_TIMEOUT = 300.0
# Documented bound: a surviving worker exits within peer_timeout + this many
# seconds of losing a peer (detection <= peer_timeout plus ~1-3 s to unwind
# fit and shut TensorFlow down; the rest is headroom for a loaded machine).
EXIT_MARGIN = 10.0
