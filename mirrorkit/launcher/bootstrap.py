"""The bootstrap every launched Python worker runs first, and what it keeps to itself.

``mirrorkit launch`` puts :data:`SITE_DIR` first on each worker's
``PYTHONPATH``; Python then imports its ``sitecustomize``, which runs any
``sitecustomize`` it shadows, asks :mod:`mirrorkit.launcher.autofix` to apply
mirrorkit's Keras fixes once the program imports TensorFlow and Keras, and
calls :func:`keep_out_of_children`.

``TF_CONFIG`` and the bootstrap are for that worker only. Inherited by a
process the script starts -- a data-loading ``subprocess.run([sys.executable,
...])``, a ``multiprocessing`` spawn/forkserver worker, ``os.system`` -- they
would make a Python child that imports TensorFlow configure the coordination
service and join the cluster as a second copy of this worker's task (or its
own ``MultiWorkerMirroredStrategy()`` wait for peers that never come). So
:func:`keep_out_of_children`:

* removes the ``_site`` entry from ``PYTHONPATH`` (Python has already put it
  on ``sys.path``; children see the user's own value);
* unsets ``TF_CONFIG`` in the process environment children inherit while
  keeping it in ``os.environ``: TensorFlow's ``TFConfigClusterResolver``,
  mirrorkit and scripts that read ``os.environ["TF_CONFIG"]`` (the
  TensorFlow multi-worker tutorial does) still see it, whenever they read it.

A child given an explicit ``env=dict(os.environ)`` still receives
``TF_CONFIG`` (the script asked for it) but not the bootstrap.

Example:
    >>> SITE_DIR.name
    '_site'
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from mirrorkit import _env

logger = logging.getLogger(__name__)

# The folder that holds the bootstrap sitecustomize.py.
SITE_DIR = Path(__file__).resolve().parent / "_site"
_done: list[bool] = []


def _not_site(entry: str) -> bool:
    try:
        return Path(entry or os.curdir).resolve() != SITE_DIR
    except OSError:
        return True


def keep_out_of_children() -> list[str]:
    """Hide the worker-only variables from child processes (idempotent).

    Returns:
        The variables changed for children (empty when there was nothing to do
        or on a second call).

    Example (what the bootstrap does):
        >>> keep_out_of_children()      # doctest: +SKIP
        ['PYTHONPATH', 'TF_CONFIG']
    """
    if _done:
        return []
    _done.append(True)
    changed = []
    if _env.replace_path_list("PYTHONPATH", _not_site):
        changed.append("PYTHONPATH")
    if _env.hide_from_children(_env.TF_CONFIG):
        changed.append(_env.TF_CONFIG)
    if changed:
        logger.debug("mirrorkit: %s kept out of child processes", ", ".join(changed))
    return changed
