"""The run's event log: ``events.jsonl``, one JSON object per line, appended by the chief.

What happened in a run, in order, in a form both people (``tail -f``) and
programs (``mirrorkit report``, a dashboard, ``jq``) read: ``run_start``
(the whole config, versions, strategy), ``restart`` (a group restarted by
``mirrorkit launch``, with its reason), ``epoch_end`` (metrics, throughput,
per-worker step times), ``straggler``, ``rollback``, ``membership`` (an
elastic job's worker count changed) and ``run_end`` (result, or why it
failed). Every line has ``time`` (UTC, ISO 8601) and ``event``.

Appending one short line per event, flushed and closed each time, keeps the
log readable while the run goes on and intact if the process is killed:
at worst the last line is cut, and :func:`read_events` skips a cut line.
Only the chief writes (an :class:`EventLog` built with ``path=None`` writes
nothing), so the file never has two writers.

Example:
    >>> import tempfile, pathlib
    >>> log = EventLog(pathlib.Path(tempfile.mkdtemp()) / "events.jsonl")
    >>> log.write("epoch_end", epoch=1, loss=0.5)
    >>> [e["event"] for e in read_events(log.path)]
    ['epoch_end']
"""

from __future__ import annotations

import datetime
import json
import math
import os
from pathlib import Path
from typing import Any

EVENTS_FILE = "events.jsonl"


def _plain(value: Any) -> Any:
    """JSON-safe copy: NumPy scalars become numbers, NaN/inf become strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class EventLog:
    """Append events to ``path`` (one JSON object per line); ``path=None`` writes nothing.

    Args:
        path: the log file, normally ``RUN_DIR/events.jsonl``; None on
            workers other than the chief.

    Example:
        >>> EventLog(None).write("run_start")   # a non-chief worker: nothing happens
    """

    def __init__(self, path: str | os.PathLike | None) -> None:
        self.path = Path(path) if path is not None else None

    def write(self, event: str, **fields: Any) -> None:
        """Append one event with the current UTC time.

        Example:
            >>> EventLog(None).write("rollback", epoch=2, step=14, cause="nan")
        """
        if self.path is None:
            return
        now = datetime.datetime.now(datetime.timezone.utc)
        record = {"time": now.isoformat(timespec="milliseconds"), "event": event,
                  **_plain(fields)}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, allow_nan=False) + "\n")


def read_events(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The events of a log, oldest first; a line cut by a killed writer is skipped.

    Example:
        >>> read_events("/nonexistent/events.jsonl")
        []
    """
    events = []
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "event" in record:
            events.append(record)
    return events
