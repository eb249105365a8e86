"""TensorFlow and Keras imported without Python's cyclic garbage collector in the way.

``import tensorflow`` creates about 300,000 Python objects, nearly all of
which live as long as the process. The cyclic collector runs many times over
that growing heap during the import, finding nothing to free, and after it
every full collection (while tracing a step, for instance) walks those
objects again. In every ``mirrorkit`` command and every Python worker
``mirrorkit launch`` starts, the collector pauses while TensorFlow and Keras
import, and the objects they created are then frozen out of its way
(:func:`gc.freeze`, made for long-lived start-up objects): about a sixth less
CPU for the import and for the work after it in a small job
(``benchmarks/startup.py``). Objects created later are collected as always.
``MIRRORKIT_COMPAT_DISABLE=import-gc-freeze`` keeps the collector as it is.

Example:
    >>> from mirrorkit.launcher import import_gc
    >>> import_gc.install()       # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import gc
import sys
from typing import Any, Iterator

from mirrorkit.launcher.autofix import AfterImport
from mirrorkit.patching import engine

# Its record: mirrorkit.patching.adaptations.
NAME = "import-gc-freeze"

_PACKAGES = ("tensorflow", "keras")


class _Paused(AfterImport):
    """Pauses the collector around TensorFlow's and Keras's imports, then freezes."""

    def __init__(self) -> None:
        super().__init__({name: self._freeze for name in _PACKAGES})

    @contextlib.contextmanager
    def around(self, name: str) -> Iterator[None]:
        was = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            if was:
                gc.enable()

    @staticmethod
    def _freeze() -> None:
        # After each of the two (each imports the other): freezing is cheap,
        # and what the outer import creates after the inner one is frozen too.
        gc.freeze()


def install() -> bool:
    """Pause the collector while TensorFlow and Keras import, if neither is imported yet.

    Returns:
        True when the hook was installed (False: TensorFlow or Keras was
        already imported, the hook is in place, or the patch is turned off).

    Example:
        >>> from mirrorkit.launcher import import_gc
        >>> import_gc.install()       # doctest: +SKIP
        True
    """
    if any(name in sys.modules for name in _PACKAGES) or any(
            isinstance(f, _Paused) for f in sys.meta_path):
        return False
    try:
        return engine.add_finder(NAME, _Paused())
    except ValueError:  # a misspelt MIRRORKIT_COMPAT_DISABLE: the command says so, in one line
        return False
