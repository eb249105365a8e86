"""Keras's saving reference objects, created once and on every worker alike.

A Keras bug, made harmful by chief-only saving: ``saving_lib.get_attr_skipset``
means to cache, per type, the attributes a save skips, but reads one key and
stores another (``saving_attr_skiplist_*`` vs ``saving_attr_skipset_*``), so
every save and load builds a throw-away ``Optimizer(1.0)``. Inside a
``MultiWorkerMirroredStrategy`` scope creating those variables is a
collective; when only the chief restores a backup, the workers' collectives
fall out of step. Used by :class:`mirrorkit.callbacks.BackupAndRestore`
before a chief-only restore.

Example:
    >>> from mirrorkit.compat.saving_cache import share_saving_references
    >>> share_saving_references(strategy)        # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

from mirrorkit.patching import engine

NAME = "saving-skipset-cache"


def _cached(original: Callable[[str], Any]) -> Callable[[str], Any]:
    cache: dict[str, Any] = {}

    def get_attr_skipset(obj_type):
        if obj_type not in cache:
            cache[obj_type] = original(obj_type)
        return cache[obj_type]

    return get_attr_skipset


def share_saving_references(strategy: Any) -> None:
    """Create Keras's saving reference objects once, on every worker alike.

    Keras's ``saving_lib.get_attr_skipset`` builds a throw-away
    ``Optimizer(1.0)`` on every save and load: its cache never hits (it reads
    ``saving_attr_skiplist_*`` but stores ``saving_attr_skipset_*``). Inside
    a ``MultiWorkerMirroredStrategy`` scope (``mirrorkit run`` keeps one open
    for the whole script) creating its variables is a collective, so a load
    that only the chief performs desynchronises the workers' collectives
    ("Collective instance 111 expected type 1 and data_type 9 but got type 0
    and data_type 2"). Here the function gets a working cache and every
    worker fills it at the same point, so later loads create nothing.
    Turned off by name (``saving-skipset-cache``), Keras's own function stays.
    """
    try:
        from keras.src.saving import saving_lib
    except ImportError:  # pragma: no cover - Keras internals moved
        return
    if not engine.is_applied(NAME):
        engine.replace(NAME, saving_lib, "get_attr_skipset", _cached)
    with strategy.scope():
        for obj_type in ("Optimizer", "Metric", "Layer", "Operation", "Loss"):
            try:
                saving_lib.get_attr_skipset(obj_type)
            except Exception:  # noqa: BLE001 -- a type this Keras does not know
                pass
