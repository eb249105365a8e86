"""Keras's imports of pandas and matplotlib.pyplot, deferred to their first use.

Keras 3 imports two optional packages whenever they are installed, used or
not: pandas in its array data adapter (so ``fit`` knows DataFrames) and
``matplotlib.pyplot`` in ``keras.visualization`` (to draw image galleries).
Together they are about a fifth of what ``import tensorflow, keras`` costs
(0.5 of 2.6 CPU-s on a 2-core machine; ``benchmarks/startup.py`` measures
it), paid at every start and restart of every worker in an environment that
has them (any with Ray Train, which requires pandas).

From the start of a ``mirrorkit`` command and of every Python worker
``mirrorkit launch`` starts, Keras imports neither:

* pandas: the array adapter is imported as if pandas were absent; when the
  program imports pandas (no DataFrame exists before that), the adapter gets
  pandas and its ``Series``/``DataFrame`` types, exactly as Keras sets them.
* matplotlib: ``keras.visualization``'s galleries import ``matplotlib.pyplot``
  and ``matplotlib.patches`` when they first draw; a program that imports
  matplotlib gets pyplot with it, as it would have had from Keras.

A package the program imported before Keras is left alone.
``MIRRORKIT_COMPAT_DISABLE=deferred-optional-imports`` keeps Keras's eager
imports.

Example:
    >>> from mirrorkit.launcher import deferred_imports
    >>> deferred_imports.install()       # doctest: +SKIP
    True
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
from typing import Any

from mirrorkit.launcher.autofix import AfterImport
from mirrorkit.patching import engine

# Its record: mirrorkit.patching.adaptations.
NAME = "deferred-optional-imports"

_SLICING = "keras.src.trainers.data_adapters.array_slicing"
# A Keras module -> (its global, the module it imports into it when Keras is imported).
_ON_FIRST_USE = {
    "keras.src.visualization.plot_image_gallery": ("plt", "matplotlib.pyplot"),
    "keras.src.visualization.plot_bounding_box_gallery": ("patches", "matplotlib.patches"),
}
# The Keras module -> the optional package it imports at its top level.
_DEFERRED = {_SLICING: "pandas", **{k: "matplotlib" for k in _ON_FIRST_USE}}
_PACKAGES = frozenset(_DEFERRED.values())


def _importer() -> str | None:
    """The module whose top-level code runs the import being looked up, or None.

    Past importlib's frames and other import hooks asking on its behalf. An
    import inside a function is not deferred: only Keras's module-level
    ``try: import ... except ImportError`` is known to expect a refusal.
    """
    frame = sys._getframe(2)
    while frame is not None and (
            frame.f_globals.get("__name__", "").startswith(("importlib", "_frozen_importlib"))
            or frame.f_code is AfterImport.find_spec.__code__):
        frame = frame.f_back
    if frame is None or frame.f_code.co_name != "<module>":
        return None
    return frame.f_globals.get("__name__")


class _OnFirstUse:
    """Stands for a module until one of its attributes is read, then imports it."""

    def __init__(self, module: str) -> None:
        self._module = module

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._module), attr)

    def __repr__(self) -> str:
        return f"<{self._module}, imported on first use ({NAME})>"


class _Deferrer(AfterImport):
    """Refuses the two optional imports to the Keras modules that make them eagerly."""

    def __init__(self) -> None:
        callbacks = {name: functools.partial(self._after_gallery, name) for name in _ON_FIRST_USE}
        super().__init__({"pandas": self._after_pandas, "matplotlib": self._after_matplotlib,
                          **callbacks})
        self.deferred: set[str] = set()

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        top = name.partition(".")[0]
        if top in _PACKAGES:
            importer = _importer()
            if _DEFERRED.get(importer) == top:
                self.deferred.add(importer)
                # Keras imports these in `try: ... except ImportError`.
                raise ModuleNotFoundError(f"{name} is imported on first use ({NAME})",
                                          name=name)
        return super().find_spec(name, path, target)

    def _after_pandas(self) -> None:
        slicing = sys.modules.get(_SLICING)
        if _SLICING not in self.deferred or slicing is None:
            return
        pandas = sys.modules["pandas"]
        # What array_slicing sets at its top level when pandas imports.
        engine.replace(NAME, slicing, "pandas", lambda _: pandas, force=True)
        engine.replace(NAME, slicing, "ARRAY_TYPES",
                       lambda types: (*types, pandas.Series, pandas.DataFrame), force=True)

    def _after_matplotlib(self) -> None:
        # Keras would have imported pyplot with it: a program that imports only
        # matplotlib and reads matplotlib.pyplot works as in plain Python.
        if self.deferred & _ON_FIRST_USE.keys():
            importlib.import_module("matplotlib.pyplot")

    def _after_gallery(self, name: str) -> None:
        attr, module = _ON_FIRST_USE[name]
        top = module.partition(".")[0]
        if name in self.deferred and importlib.util.find_spec(top) is not None:
            engine.replace(NAME, sys.modules[name], attr, lambda _: _OnFirstUse(module),
                           force=True)


def install() -> bool:
    """Defer Keras's imports of pandas and matplotlib.pyplot, if Keras is not imported yet.

    Returns:
        True when the hook was installed (False: Keras was already imported,
        the hook is in place, or the patch is turned off by name).

    Example:
        >>> from mirrorkit.launcher import deferred_imports
        >>> deferred_imports.install()       # doctest: +SKIP
        True
    """
    if _SLICING in sys.modules or any(isinstance(f, _Deferrer) for f in sys.meta_path):
        return False
    try:
        return engine.add_finder(NAME, _Deferrer())
    except ValueError:  # a misspelt MIRRORKIT_COMPAT_DISABLE: the command says so, in one line
        return False
