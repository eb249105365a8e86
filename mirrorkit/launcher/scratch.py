"""The job's one scratch root: made at the start, removed at the end, swept if orphaned.

Every private folder of a launched job (workers' stand-ins for the chief's
paths, status files, the download relay's socket) goes under one
``mirrorkit-job-*`` folder in the temp dir, given to workers as
``MIRRORKIT_SCRATCH_DIR``. The launcher removes it once its workers are
gone. A launcher that is itself SIGKILLed cannot; it holds an ``flock`` on
``ROOT/owner.lock`` for its whole life, so the next launch on this machine
finds roots whose lock is free (their owner is dead, whatever its process
id now means) and removes them.

Example:
    >>> with job_root() as root:                        # doctest: +SKIP
    ...     os.path.basename(root).startswith("mirrorkit-job-")
    True
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import tempfile
from typing import Iterator

logger = logging.getLogger(__name__)

PREFIX = "mirrorkit-job-"
_LOCK = "owner.lock"


def _held(path: str) -> bool:
    """True while another process holds the root's owner lock (or it cannot be tested)."""
    import fcntl

    try:
        handle = os.open(os.path.join(path, _LOCK), os.O_RDWR)
    except FileNotFoundError:
        # Made this instant, before its lock file, or not a root of ours: leave it.
        return True
    except OSError:
        return True
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(handle)
    return False


def sweep_orphans(parent: str | None = None) -> list[str]:
    """Remove scratch roots in ``parent`` whose launcher is gone; return them.

    Args:
        parent: where to look. Defaults to the temp dir.

    Example:
        >>> sweep_orphans("/surely/not/a/folder")
        []
    """
    removed = []
    for path in glob.glob(os.path.join(parent or tempfile.gettempdir(), PREFIX + "*")):
        if os.path.isdir(path) and not os.path.islink(path) and not _held(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if removed:
        logger.info("removed %d scratch folder(s) of earlier launches that were killed",
                    len(removed))
    return removed


@contextlib.contextmanager
def job_root() -> Iterator[str]:
    """A fresh private root for one launch, removed when the block ends.

    Sweeps orphaned roots first (:func:`sweep_orphans`). Remove it only after
    every worker is reaped: a live worker may still write there.

    Example:
        >>> with job_root() as root:
        ...     os.path.isdir(root)
        True
    """
    import fcntl

    sweep_orphans()
    root = tempfile.mkdtemp(prefix=PREFIX)   # 0700: only this user
    lock = None
    try:
        lock = os.open(os.path.join(root, _LOCK), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if lock is not None:
            os.close(lock)
