"""mirrorkit's strategy scope, held open around the whole script, and able to step aside.

Example:
    >>> from mirrorkit.runner.scope import ScriptScope
    >>> ScriptScope.__name__
    'ScriptScope'
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from mirrorkit.distribute.runtime import Runtime

logger = logging.getLogger(__name__)


class ScriptScope:
    """mirrorkit's strategy scope for the script's lifetime; it can step aside.

    Under the default strategy it enters nothing (nothing to mirror), so the
    script behaves exactly as under ``python``.
    """

    def __init__(self, strategy: Any, runtime: Runtime) -> None:
        self.strategy = strategy
        self.runtime = runtime
        self.active = runtime.strategy != "default"
        self._scope: Any = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "ScriptScope":
        if self.active:
            self._scope = self.strategy.scope()
            self._scope.__enter__()
            self._thread = threading.current_thread()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._exit()

    def leave(self) -> bool:
        """Leave mirrorkit's scope early (the script chose its own strategy).

        Returns:
            True when the scope was left now; False when it was not entered,
            already left, or cannot be left from here (another thread, or the
            script is inside a replica function).
        """
        import tensorflow as tf

        if (self._scope is None or threading.current_thread() is not self._thread
                or tf.distribute.get_strategy() is not self.strategy
                or not tf.distribute.in_cross_replica_context()):
            return False
        self._exit()
        return True

    def _exit(self) -> None:
        scope, self._scope = self._scope, None
        if scope is None:
            return
        try:
            scope.__exit__(None, None, None)
        except Exception as err:  # noqa: BLE001 -- a script that left scopes open
            logger.warning("could not leave the strategy scope cleanly: %s", err)
