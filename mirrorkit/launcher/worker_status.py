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


def read(folder: str | os.PathLike | None) -> list[dict[str, Any]]:
    """The workers' last reports in ``folder``, by rank.

    A file that cannot be read or does not match the status schema (another
    mirrorkit version's, for one) is skipped with a warning: the summary
    then lacks that worker's line, the run's outcome does not change.

    Example:
        >>> read("/surely/not/a/folder")
        []
    """
    if folder is None or not Path(folder).is_dir():
        return []
    found = []
    for path in sorted(Path(folder).glob(protocol.STATUS_GLOB)):
        try:
            found.append(protocol.read_status(path))
        except (OSError, ValueError) as err:
            logger.warning("skipping a worker's status: %s", err)
    return sorted(found, key=lambda s: s["rank"])


def lines(statuses: list[dict[str, Any]]) -> list[str]:
    """One line per worker: throughput and local step time, the slowest marked.

    Example:
        >>> lines([])
        []
    """
    local = [t if isinstance(t, (int, float)) and t > 0 else None
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
