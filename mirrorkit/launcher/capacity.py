"""How many workers this machine can hold usefully, and the one line when ``-n`` exceeds it.

Two limits, either of which refuses a launch unless ``--oversubscribe``:

* **Cores**: at most :data:`WORKERS_PER_CORE` workers per usable core. Each
  TensorFlow worker costs about 4 s of CPU just to start, and a worker that
  does not get a turn to answer its peers' heartbeats within 10 s
  (:data:`mirrorkit.protocol.DEFAULT_PEER_TIMEOUT`) is declared lost; 4 per
  core keeps start-up within seconds and still lets a 2-core laptop or CI box
  test 3-8 workers of multi-worker logic (the test suite runs 3 on 2 cores).
* **Memory**: ``N x`` :data:`WORKER_MEMORY` must fit in the memory the system
  reports available; past it the kernel's OOM killer ends workers at random.

Example:
    >>> oversubscription(3, cores=2, available=8 * 2**30) is None
    True
    >>> oversubscription(1000, cores=2, available=None).split(":")[0]
    '-n 1000 is more workers than this machine can hold usefully'
"""

from __future__ import annotations

import os

from mirrorkit.distribute.devices import usable_cores
from mirrorkit.errors import UserInputError

# A worker per this many cores at most (see the module docstring).
WORKERS_PER_CORE = 4
# Estimated resident memory of one TensorFlow worker: the peak resident size of
# the smallest `mirrorkit train` run measured on TF 2.21 (720 MB; importing
# TensorFlow alone: 640 MB). Shared libraries count in it, so this errs high.
WORKER_MEMORY = 700 * 2**20

__all__ = ["WORKERS_PER_CORE", "WORKER_MEMORY", "available_memory", "check", "oversubscription"]


def available_memory() -> int | None:
    """Bytes of memory the system reports available now, or None when it cannot tell.

    Linux's ``MemAvailable`` (what can be allocated without swapping, page
    cache included), else the free physical pages.

    Example:
        >>> available_memory() is None or available_memory() > 0
        True
    """
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        pages = os.sysconf("SC_AVPHYS_PAGES")
        size = os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def _gb(size: int) -> str:
    return f"{size / 2**30:.1f} GB"


def oversubscription(nproc: int, *, cores: int, available: int | None,
                     per_worker: int = WORKER_MEMORY) -> str | None:
    """The one line refusing ``nproc`` workers on ``cores`` and ``available`` bytes, or None.

    Args:
        nproc: workers to start on this machine.
        cores: usable cores.
        available: bytes of available memory; None skips the memory limit.
        per_worker: estimated bytes per worker. Defaults to :data:`WORKER_MEMORY`.

    Returns:
        None when ``nproc`` fits both limits, else what was wrong (cores,
        memory, the per-worker estimate, the largest ``-n`` that fits) and
        what to do.

    Example:
        >>> oversubscription(8, cores=2, available=None) is None
        True
        >>> "at most 8 (4 per core)" in oversubscription(9, cores=2, available=None)
        True
    """
    by_cores = WORKERS_PER_CORE * max(cores, 1)
    by_memory = None if available is None else max(available // per_worker, 1)
    fits = min(by_cores, by_memory or by_cores)
    if nproc <= fits:
        return None
    memory = ("" if available is None else
              f", {_gb(available)} of available memory at about {_gb(per_worker)} per "
              f"TensorFlow worker allows {by_memory}")
    return (f"-n {nproc} is more workers than this machine can hold usefully: {cores} "
            f"core(s) allow at most {by_cores} ({WORKERS_PER_CORE} per core){memory}. "
            f"Use -n {fits} or fewer, or add --oversubscribe to start them anyway.")


def check(nproc: int, *, oversubscribe: bool = False) -> None:
    """Raise when ``nproc`` workers do not fit this machine, unless ``oversubscribe``.

    Raises:
        UserInputError: with :func:`oversubscription`'s line.

    Example:
        >>> check(1)
        >>> check(10_000, oversubscribe=True)
    """
    if oversubscribe:
        return
    line = oversubscription(nproc, cores=usable_cores(), available=available_memory())
    if line is not None:
        raise UserInputError(line)
