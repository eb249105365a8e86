"""Apply mirrorkit's Keras/TensorFlow fixes to programs that never import mirrorkit.

``mirrorkit launch`` puts a tiny ``sitecustomize`` (in ``mirrorkit/launcher/_site``)
first on each Python worker's ``PYTHONPATH``. It calls :func:`install`, which
waits for the program's own imports: when ``tensorflow`` has been imported
under a multi-worker ``TF_CONFIG``, peer-failure detection is configured
(before the program can create its strategy); when ``keras`` has been
imported, the compat fixes are applied. So the unmodified TensorFlow
multi-worker tutorial works under ``mirrorkit launch -n 2 -- python
tutorial.py``, where stock Keras 3 fails (keras#20585).

Nothing is imported eagerly: a worker that never imports TensorFlow pays
nothing. ``MIRRORKIT_COMPAT=off`` turns the fixes off as everywhere else.

Example (what the launcher's sitecustomize does):
    >>> from mirrorkit.launcher import autofix
    >>> autofix.install()       # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from typing import Any, Callable, ContextManager

from mirrorkit import _env
from mirrorkit.patching import engine

# Its record: mirrorkit.patching.catalogue.
NAME = "fixes-on-import"

logger = logging.getLogger(__name__)

def _after_tensorflow() -> None:
    if _env.tf_config_text() is None:
        return
    from mirrorkit.distribute.failure_detection import configure_failure_detection

    configure_failure_detection()


def _after_keras() -> None:
    from mirrorkit.distribute.fixes import apply_fixes

    apply_fixes()


class _Loader(importlib.abc.Loader):
    """Runs a module with its real loader, then one callback."""

    def __init__(self, loader: Any, name: str, hook: "AfterImport") -> None:
        self._loader, self._name, self._hook = loader, name, hook

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        # The module keeps its real loader: tools that inspect __loader__
        # (inspect.getsource, importlib.resources) must not see this wrapper.
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        with self._hook.around(self._name):
            self._loader.exec_module(module)
        # Popped only now: importlib.util.find_spec("keras") (TensorFlow
        # probes for Keras that way) finds a spec without loading it.
        callback = self._hook.pending.pop(self._name, None)
        if callback is None:
            return
        try:
            callback()
        except Exception as err:  # never break the user's program over a fix or a speed-up
            logger.warning("mirrorkit: could not finish its set-up after importing %s (%s)",
                           self._name, err)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the real loader of a few watched modules.

    Each watched module's callback runs once, right after the module has run.

    Example:
        >>> hook = AfterImport({"json": lambda: print("json imported")})
        >>> hook.find_spec("csv", None) is None
        True
    """

    def __init__(self, callbacks: dict[str, Callable[[], None]]) -> None:
        self.pending = dict(callbacks)
        self._searching: set[tuple[int, str]] = set()

    def around(self, name: str) -> ContextManager[Any]:
        """What runs around a watched module's own code (nothing here; subclasses say)."""
        return contextlib.nullcontext()

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        key = (threading.get_ident(), name)
        if name not in self.pending or key in self._searching:
            return None
        # Another hook watching the same module asks every finder too, this
        # one included: asked again during its own search, it answers None,
        # and the module gets both hooks' loaders, one inside the other.
        self._searching.add(key)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None and spec.loader is not None:
                    spec.loader = _Loader(spec.loader, name, self)
                    return spec
            return None
        finally:
            self._searching.discard(key)


def install() -> bool:
    """Arrange for the fixes to apply when the program imports TF and Keras.

    Modules already imported get their fix at once. Idempotent.

    Returns:
        True when a hook was installed or a fix applied now.

    Example:
        >>> from mirrorkit.launcher import autofix
        >>> autofix.install()       # doctest: +SKIP
        True
    """
    if any(type(f) is AfterImport for f in sys.meta_path):
        return False
    try:
        if not engine.enabled(NAME):
            return False
    except ValueError as err:  # a misspelt MIRRORKIT_COMPAT_DISABLE: say so, run unpatched
        logger.warning("mirrorkit: no fixes applied: %s", err)
        return False
    callbacks = {"tensorflow": _after_tensorflow, "keras": _after_keras}
    for name in list(callbacks):
        if name in sys.modules:
            callbacks.pop(name)()
    if callbacks:
        engine.add_finder(NAME, AfterImport(callbacks))
    return True
