"""What each worker reported about its speed, for the launcher's final summary.

``mirrorkit launch`` gives its workers a private folder
(``MIRRORKIT_STATUS_DIR``); ``mirrorkit train`` leaves ``worker-<rank>.json``
there at every epoch end (:class:`mirrorkit.training.monitoring.WorkerMonitor`,
in the schema of :func:`mirrorkit.protocol.write_status`):
its images/s (its share of the global batch over the wall step time) and its
local step time (its own share of the work, timed without communication,
which is where a straggler shows). The launcher reads them back at the end;
programs that write nothing there simply get no per-worker lines.

Example:
    >>> lines([{"rank": 0, "epoch": 2, "images_per_second": 812.4, "step_ms": 39.4,
    ...         "local_step_ms": 10.9},
    ...        {"rank": 1, "epoch": 2, "images_per_second": 812.4, "step_ms": 39.4,
    ...         "local_step_ms": 37.1}])
    ['worker 0: 812 images/s (epoch 2), local step 10.9 ms', 'worker 1: 812 images/s (epoch 2), local step 37.1 ms (3.4x worker 0: the straggler)']
"""

from __future__ import annotations

import logging
import os
import statistics
from pathlib import Path
from typing import Any

from mirrorkit import protocol

logger = logging.getLogger(__name__)


# Beyond these a value is not a measurement (a file edited or from a broken
# clock): times over a day per step, images/s beyond any accelerator.
_MAX_MS = 86_400_000.0
_MAX_IMAGES_PER_SECOND = 1e9
# A status file is one short JSON line; anything much larger is not one.
_MAX_BYTES = 64 * 1024


def _check_ranges(status: dict[str, Any], path: Path) -> dict[str, Any]:
    for name, high in (("step_ms", _MAX_MS), ("local_step_ms", _MAX_MS),
                       ("images_per_second", _MAX_IMAGES_PER_SECOND)):
        value = status[name]
        if value is not None and value > high:
            raise ValueError(f"worker status file {str(path)!r}: `{name}` must be at most "
                             f"{high:g}. Received: {name}={value!r}")
    if status["epoch"] < 1:   # written at an epoch's end, counted from 1
        raise ValueError(f"worker status file {str(path)!r}: `epoch` must be at least 1. "
                         f"Received: epoch={status['epoch']!r}")
    return status


def _read_one(path: Path) -> dict[str, Any]:
    """One file, validated (protocol's schema, then plausible ranges); ValueError names it."""
    size = path.stat().st_size
    if size > _MAX_BYTES:
        raise ValueError(f"worker status file {str(path)!r} is {size:,} bytes; a status is "
                         f"one short JSON line (at most {_MAX_BYTES:,})")
    try:
        status = protocol.read_status(path)
    except UnicodeDecodeError as err:
        raise ValueError(f"worker status file {str(path)!r} is not UTF-8 text ({err.reason} "
                         f"at byte {err.start})") from err
    except RecursionError as err:
        raise ValueError(f"worker status file {str(path)!r} is not a worker status: JSON "
                         "nested too deeply to read") from err
    return _check_ranges(status, path)


def read(folder: str | os.PathLike | None) -> list[dict[str, Any]]:
    """The workers' last reports in ``folder``, by rank.

    A file that cannot be read, does not match the status schema (another
    mirrorkit version's, for one) or holds an implausible value (a step over
    a day, images/s beyond 1e9) is skipped with one warning line naming the
    file, the field and the value: the summary then lacks that worker's
    line, the job and its outcome go on unchanged. Two files for one rank
    (``worker-7.json`` and ``worker-07.json``) keep the first by name.

    Example:
        >>> read("/surely/not/a/folder")
        []
    """
    if folder is None or not Path(folder).is_dir():
        return []
    found: dict[int, dict[str, Any]] = {}
    for path in sorted(Path(folder).glob(protocol.STATUS_GLOB)):
        try:
            status = _read_one(path)
        except (OSError, ValueError) as err:
            logger.warning("skipping a worker's status: %s", " ".join(str(err).split()))
            continue
        if status["rank"] in found:
            logger.warning("skipping a worker's status: %r is a second file for rank %d",
                           str(path), status["rank"])
            continue
        found[status["rank"]] = status
    return [found[rank] for rank in sorted(found)]


def lines(statuses: list[dict[str, Any]]) -> list[str]:
    """One line per worker: throughput and local step time, the slowest marked.

    Example:
        >>> lines([])
        []
    """
    # Under a microsecond is no step time (0: not measured); a ratio against it would be inf.
    local = [t if isinstance(t, (int, float)) and t >= 1e-3 else None
             for t in (s.get("local_step_ms") for s in statuses)]
    out = []
    for i, (status, t) in enumerate(zip(statuses, local)):
        rate = status.get("images_per_second")
        line = (f"worker {status['rank']}: "
                f"{f'{rate:,.0f}' if isinstance(rate, (int, float)) else '-'} images/s "
                f"(epoch {status.get('epoch')})")
        if t is not None:
            line += f", local step {t:.1f} ms"
            others = [o for j, o in enumerate(local) if j != i and o is not None]
            if others and t / statistics.median(others) >= 1.5:
                fastest = min(range(len(local)), key=lambda i: local[i] or float("inf"))
                line += (f" ({t / local[fastest]:.1f}x worker {statuses[fastest]['rank']}: "
                         "the straggler)")
        out.append(line)
    return out
