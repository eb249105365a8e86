"""Under ``mirrorkit launch``, workers on one machine download a dataset one at a time.

Tutorials start with ``keras.utils.get_file`` (also behind
``keras.datasets.*.load_data()``): it writes straight into
``~/.keras/datasets/NAME`` and unpacks it there. N workers of one script on
one machine do that at once, into the same paths: one reads a file another
is still writing (a truncated archive, ``EOFError``, a failed hash) or
extracts over it. While a script runs under ``mirrorkit run`` in a
multi-worker group, ``get_file`` holds an exclusive lock per destination
(``fcntl.flock`` on a file in the temporary directory): the first worker
downloads and unpacks, the others wait, then find the file in place and use
it (Keras skips a download whose file exists). Workers on other machines
download their own copies, as before.

Example:
    >>> with installed(runtime):                             # doctest: +SKIP
    ...     runpy.run_path("train.py", run_name="__main__")
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from mirrorkit.patching import engine
from mirrorkit.training.file_turns import taking_turns

logger = logging.getLogger(__name__)

# Its record: mirrorkit.patching.catalogue.
NAME = "get-file-lock"


def lock_path(*args: Any, **kwargs: Any) -> Path:
    """The lock file of one ``get_file(*args, **kwargs)`` destination.

    Keyed by the arguments that choose where the file lands (name, origin,
    cache folders), so two different datasets never wait for each other.

    Example:
        >>> lock_path("mnist.npz", origin="https://x/mnist.npz").name
        'mirrorkit-get_file-b626441fcf3c6b53.lock'
    """
    # get_file(fname, origin, untar, md5_hash, file_hash, cache_subdir, ...)
    chosen = dict(zip(("fname", "origin", "untar", "md5_hash", "file_hash", "cache_subdir"),
                      args))
    chosen.update(kwargs)
    key = {k: str(chosen.get(k)) for k in ("fname", "origin", "cache_subdir", "cache_dir")}
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"mirrorkit-get_file-{digest}.lock"


def _one_at_a_time(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def get_file(*args: Any, **kwargs: Any) -> Any:
        with taking_turns(lock_path(*args, **kwargs)):
            return original(*args, **kwargs)

    return get_file


@contextlib.contextmanager
def installed(runtime: Any) -> Iterator[None]:
    """Serialise ``keras.utils.get_file`` per destination while the block runs.

    Args:
        runtime: the :class:`mirrorkit.Runtime` of this process; nothing
            changes unless ``runtime.is_multi_worker`` (or without ``fcntl``).
    """
    try:
        import fcntl  # noqa: F401 -- POSIX only; elsewhere Keras's own get_file runs

        from keras.src.utils import file_utils
    except ImportError:
        yield
        return
    if not getattr(runtime, "is_multi_worker", False):
        yield
        return
    original = file_utils.get_file
    patched = _one_at_a_time(original)
    # Keras's dataset modules bind get_file by name at import: replace every binding.
    changes = [(module, "get_file", lambda _f: patched) for module in list(sys.modules.values())
               if module is not None
               and getattr(module, "__dict__", {}).get("get_file") is original]
    logger.debug("mirrorkit: get_file locked per destination in %d modules (pid %d)",
                 len(changes), os.getpid())
    with engine.applied(NAME, changes):
        yield
