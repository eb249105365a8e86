"""One clear line when a multi-worker peer is lost, instead of TensorFlow's traceback.

When a peer dies, freezes or drops off the network, each surviving worker
gets a long ``UnavailableError``/``DeadlineExceededError`` whose cause is
buried in gRPC text. :func:`explain` turns it into one line that names the
lost task, its ``host:port`` from ``TF_CONFIG``, what was observed and how
long this worker had been without progress::

    mirrorkit: lost peer worker 1 at hostb:23400 (stopped sending heartbeats); no training step finished for 6.1 s

:func:`install` makes the process end with that line (an ``sys.excepthook``
that replaces the traceback for these errors only) and starts the progress
clock (the time of the last finished Keras batch). ``mirrorkit launch``
finds the line in a failed worker's output and leads its summary with it.

What each observation means (measured on network-namespace hosts, 5 s
heartbeat timeout): ``stopped sending heartbeats`` is the coordination
leader's view of a frozen or cut-off peer; ``connection refused`` is a peer
whose process is gone while its machine is up (fastest, ~1-4 s);
``heartbeat deadline exceeded`` is the view from the other side of a cut:
the coordination leader itself is unreachable.

Example:
    >>> import tensorflow as tf
    >>> err = tf.errors.UnavailableError(None, None, "Collective ops is aborted by: The "
    ...     "following tasks are unhealthy (stopped sending heartbeats):\\n/job:worker/task:1")
    >>> explain(err, cluster={"worker": ["a:1", "b:2"]}, waited=6.0)
    'mirrorkit: lost peer worker 1 at b:2 (stopped sending heartbeats); no training step finished for 6.0 s'
"""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Mapping

from mirrorkit import _env
from mirrorkit.patching import engine
from mirrorkit.protocol import LOST_PEER_MARKER, format_lost_peer

# The prefix ``mirrorkit launch`` looks for in a failed worker's output.
# The patch that installs the excepthook and the progress clock (its record:
# mirrorkit.patching.catalogue).
NAME = "lost-peer-report"
MARKER = LOST_PEER_MARKER  # mirrorkit.protocol's, which the launcher parses back

_TASK = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")
_UNHEALTHY = re.compile(r"unhealthy \(stopped sending heartbeats\):\s*((?:/job:\S+\s*)+)")
_REFUSED = re.compile(r"(?:ipv4:|ipv6:)?(\[?[\w.:-]+?\]?:\d+): Failed to connect to remote host: "
                      r"Connection refused")
_PEER_ERRORS = ("UnavailableError", "DeadlineExceededError", "AbortedError",
                "CancelledError", "InternalError", "UnknownError")

_last_progress: float | None = None
_installed = False
_heartbeat_timeout: float | None = None  # seconds, as configured by install()


def note_progress() -> None:
    """Record that a training step (or epoch) just finished on this worker."""
    global _last_progress
    _last_progress = time.monotonic()


def seconds_without_progress() -> float | None:
    """Seconds since the last finished step, or None before the first one."""
    return None if _last_progress is None else time.monotonic() - _last_progress


def _tf_config() -> tuple[dict[str, list[str]], tuple[str, int] | None]:
    """This process's TF_CONFIG cluster and its own task."""
    try:
        config = json.loads(_env.tf_config_text() or "{}")
        task = config.get("task") or {}
        me = (str(task["type"]), int(task["index"])) if "type" in task else None
        return dict(config.get("cluster", {})), me
    except (ValueError, AttributeError, KeyError, TypeError):
        return {}, None


def _leader(cluster: Mapping[str, list[str]]) -> tuple[str, int]:
    # TensorFlow's coordination service runs on the chief, else on worker 0.
    return ("chief", 0) if cluster.get("chief") else ("worker", 0)


def _address(cluster: Mapping[str, list[str]], job: str, index: int) -> str:
    tasks = cluster.get(job) or []
    return tasks[index] if index < len(tasks) else "an address not in TF_CONFIG"


def _task_at(cluster: Mapping[str, list[str]], address: str) -> tuple[str, int] | None:
    """The task whose TF_CONFIG address is ``address`` (gRPC shows it resolved: IP:port)."""
    import socket

    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    for job, tasks in cluster.items():
        for index, task in enumerate(tasks):
            task_host, _, task_port = task.rpartition(":")
            if task_port != port:
                continue
            try:
                ips = {info[4][0] for info in socket.getaddrinfo(task_host.strip("[]"), None)}
            except (OSError, UnicodeError):
                ips = set()
            if task_host.strip("[]") == host or host in ips:
                return job, index
    return None


def _observe(text: str, cluster: Mapping[str, list[str]],
             me: tuple[str, int] | None) -> tuple[list[tuple[str, int]], str] | None:
    """(lost tasks, what was observed) read from a TensorFlow error text."""
    # gRPC names the task it called: "remote target /job:worker/replica:0/task:1".
    remote = [(j, int(i)) for j, i in re.findall(r"remote target " + _TASK.pattern, text)]
    found = _UNHEALTHY.search(text)
    if found:
        return ([(j, int(i)) for j, i in _TASK.findall(found.group(1))],
                "stopped sending heartbeats")
    found = _REFUSED.search(text)
    if found:
        # Else the resolved address it could not reach names the task.
        task = remote[0] if remote else _task_at(cluster, found.group(1))
        return ([task] if task else []), "connection refused"
    if "CoordinationService/Heartbeat" in text and "Deadline Exceeded" in text:
        return [_leader(cluster)], "heartbeat deadline exceeded: the coordination leader is unreachable"
    if "CoordinationService" in text and ("Socket closed" in text or "Connection reset" in text):
        return [_leader(cluster)], "connection to the coordination leader lost"
    for phrase, what in (("Connection reset by peer", "connection reset"),
                         ("Socket closed", "connection closed"),
                         ("Broken pipe", "connection broken"),
                         ("Deadline Exceeded", "deadline exceeded")):
        if phrase in text:
            # Other task names in the text may be this worker's own devices.
            tasks = remote or [(j, int(i)) for j, i in _TASK.findall(text) if (j, int(i)) != me]
            return list(dict.fromkeys(tasks)), what
    return None


def _errors(err: BaseException):
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def explain(err: BaseException, *, cluster: Mapping[str, list[str]] | None = None,
            waited: float | None = None) -> str | None:
    """The one-line account of a lost peer in ``err``, or None when it is not one.

    Args:
        err: the exception (its causes are searched too).
        cluster: ``TF_CONFIG``'s cluster. Defaults to this process's ``TF_CONFIG``.
        waited: seconds this worker went without progress. Defaults to the
            progress clock (:func:`note_progress`); without either, the line
            names the heartbeat timeout given to :func:`install` instead.

    Example:
        >>> explain(ValueError("bad")) is None
        True
    """
    env_cluster, me = _tf_config()
    cluster = env_cluster if cluster is None else cluster
    for each in _errors(err):
        if type(each).__name__ not in _PEER_ERRORS:
            continue
        seen = _observe(str(each), cluster, me)
        if seen is None:
            continue
        tasks, what = seen
        lost = ", ".join(f"{job} {index} at {_address(cluster, job, index)}"
                         for job, index in tasks) or "a peer (TensorFlow did not name it)"
        waited = seconds_without_progress() if waited is None else waited
        if waited is not None:
            wait = f"no training step finished for {waited:.1f} s"
        elif _heartbeat_timeout is not None:
            wait = f"heartbeat timeout {_heartbeat_timeout:g} s"
        else:
            wait = "TensorFlow's heartbeat timeout"
        return format_lost_peer(lost, what, wait)
    return None


def short_report(err: BaseException, line: str) -> str:
    """What a surviving worker prints instead of the traceback: the error's kind, then ``line``.

    Example:
        >>> short_report(RuntimeError("x\\ny"), "mirrorkit: lost peer worker 1")
        'RuntimeError: x\\nmirrorkit: lost peer worker 1\\n'
    """
    first = next((ln.strip() for ln in str(err).splitlines() if ln.strip()), "")
    return f"{type(err).__name__}: {first}\n{line}\n"


def _excepthook(previous):
    def hook(kind, value, tb):
        line = explain(value) if isinstance(value, Exception) else None
        if line is None:
            return previous(kind, value, tb)
        sys.stderr.write(short_report(value, line))
        sys.stderr.flush()
    return hook


def track_progress() -> bool:
    """Start the progress clock on Keras's callback list (once keras is imported).

    Returns True once the clock is on. Each ``fit``/``evaluate``/``predict``
    batch end (a ``steps_per_execution`` group) and epoch end notes progress.
    """
    if "keras" not in sys.modules:
        return False
    try:
        from keras.src.callbacks.callback_list import CallbackList
    except ImportError:  # pragma: no cover - depends on Keras internals
        return False
    for name in ("on_train_begin", "on_train_batch_end", "on_test_batch_end",
                 "on_predict_batch_end", "on_epoch_end"):
        if engine.patched_by(vars(CallbackList).get(name)) == NAME:
            continue
        if engine.replace(NAME, CallbackList, name, _noting_progress) is None:
            return False  # turned off by name
    return True


def _noting_progress(original):
    def wrapped(self, *args, **kwargs):
        note_progress()
        return original(self, *args, **kwargs)

    wrapped.__wrapped__ = original
    return wrapped


def installed() -> bool:
    """Whether :func:`install` ran in this process."""
    return _installed


def install(heartbeat_timeout: float | None = None) -> None:
    """End this process with the one-line account if it dies of a lost peer.

    Idempotent; called where mirrorkit configures a multi-worker process
    (:func:`mirrorkit.configure_failure_detection`, :func:`mirrorkit.distribute.fixes.apply_fixes`).
    Other exceptions keep Python's (or the program's own) hook.

    Args:
        heartbeat_timeout: the configured heartbeat timeout (seconds), quoted
            when no training step was seen. Defaults to None (not quoted).

    Example:
        >>> install(heartbeat_timeout=10)          # doctest: +SKIP
    """
    global _installed, _heartbeat_timeout
    if heartbeat_timeout is not None:
        _heartbeat_timeout = float(heartbeat_timeout)
    if not _installed:
        if engine.patched_by(sys.excepthook) != NAME:
            engine.replace(NAME, sys, "excepthook", _excepthook)
        _installed = True
    track_progress()
