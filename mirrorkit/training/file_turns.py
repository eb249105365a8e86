"""Processes of one machine taking turns on a file lock (standard library only).

Example:
    >>> from pathlib import Path
    >>> with taking_turns(Path("/tmp/mirrorkit-example.lock")):   # doctest: +SKIP
    ...     pass
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def taking_turns(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` for the block, waiting for it.

    The processes of one machine that would all fetch the same file take
    turns: the first fetches it, the others then find it. Where ``fcntl`` is
    missing (not POSIX), nothing is held and each goes on at once.

    Example:
        >>> with taking_turns(Path("/tmp/mirrorkit-example.lock")):   # doctest: +SKIP
        ...     pass
    """
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
