"""Chief-only saving for unmodified multi-worker scripts (``mirrorkit run`` under a cluster).

A script written for one process saves the usual way -- stock
``keras.callbacks.BackupAndRestore``/``ModelCheckpoint``/``TensorBoard``,
``model.save(...)``, ``model.save_weights(...)`` -- and, run as N workers
sharing a filesystem, every worker writes the same paths: HDF5's file lock
fails (``BlockingIOError: [Errno 11] Unable to synchronously create file``),
two writers of one ``.keras`` zip corrupt it (``BadZipFile``), TensorBoard
gets one run per worker. :func:`installed` makes those stock names
chief-only for the script's lifetime, reusing :mod:`mirrorkit.training.callbacks`:

* ``keras.callbacks.BackupAndRestore``/``ModelCheckpoint``/``TensorBoard``
  (and the same classes under ``tf.keras.callbacks``) are mirrorkit's
  chief-aware subclasses, which take the same arguments: the chief writes the
  real path, every other worker a private temporary directory removed after
  training; ``BackupAndRestore`` resumes every worker from the chief's backup.
* ``Model.save``/``Model.save_weights`` write the real path on the chief and
  a private temporary path (removed at once) elsewhere. Every worker still
  saves: saving can run collectives, and a collective only the chief
  entered would hang it.
* ``tf.train.Checkpoint.save``/``write`` and ``tf.train.CheckpointManager.save``
  write the real files on the chief and a private directory elsewhere;
  reading (``latest_checkpoint``, ``restore``) is left to the real path.

Outside multi-worker mode nothing is replaced: a single process is the chief.
``isinstance(cb, keras.callbacks.ModelCheckpoint)`` keeps working (the
replacements are subclasses), and so do the script's own subclasses.

Not covered: ``keras.saving.save_model(model, path)`` called directly,
``model.export``, and files the script writes itself (``open``, ``np.save``).

Example:
    >>> from mirrorkit.runner import chief_saving
    >>> with chief_saving.installed(runtime):                # doctest: +SKIP
    ...     run_the_script()
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import sys
from typing import Any, Callable, Iterator

logger = logging.getLogger(__name__)

_CALLBACKS = ("BackupAndRestore", "ModelCheckpoint", "TensorBoard")
# The public API modules that expose keras.callbacks (tf.keras is loaded lazily).
_API_MODULES = ("keras.callbacks", "keras._tf_keras.keras.callbacks")


@contextlib.contextmanager
def installed(runtime: Any) -> Iterator[None]:
    """Make the stock Keras saving paths chief-only while the block runs.

    Args:
        runtime: the :class:`mirrorkit.Runtime` of this process;
            nothing changes unless ``runtime.is_multi_worker``.

    Example:
        >>> with installed(runtime):                         # doctest: +SKIP
        ...     runpy.run_path("train.py", run_name="__main__")
    """
    if not getattr(runtime, "is_multi_worker", False):
        yield
        return
    undo: list[tuple[Any, str, Any]] = []
    try:
        try:
            _replace_callbacks(undo)
            _wrap_saving(undo)
            _tf_checkpoints(undo)
        except Exception as err:  # noqa: BLE001 -- never break the script over this
            logger.warning("mirrorkit: chief-only saving not installed (%s); "
                           "every worker writes the script's paths.", err)
        yield
    finally:
        for owner, attr, original in reversed(undo):
            setattr(owner, attr, original)


def _set(undo: list, owner: Any, attr: str, value: Any) -> None:
    undo.append((owner, attr, owner.__dict__[attr] if attr in owner.__dict__
                 else getattr(owner, attr)))
    setattr(owner, attr, value)


def _replace_callbacks(undo: list) -> None:
    import keras

    from mirrorkit.training import callbacks as chief_aware

    for name in _API_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    for cls_name in _CALLBACKS:
        original = getattr(keras.callbacks, cls_name)
        replacement = getattr(chief_aware, cls_name)
        for module_name, module in list(sys.modules.items()):
            if module is None or not module_name.startswith("keras") \
                    or module_name.startswith("keras.src"):
                continue
            if module.__dict__.get(cls_name) is original:
                _set(undo, module, cls_name, replacement)


def _chief_only(method: Callable[..., Any], kind: str) -> Callable[..., Any]:
    from mirrorkit.training.chief import barrier, chief_path

    @functools.wraps(method)
    def save(self: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(filepath, (str, bytes)) and not hasattr(filepath, "__fspath__"):
            return method(self, filepath, *args, **kwargs)   # file objects: as written
        with chief_path(self, filepath, kind) as target:
            result = method(self, target, *args, **kwargs)
        # The script may read the file next (save, then load_model) on every
        # worker: none may read before the chief has finished writing it.
        barrier(self)
        return result

    return save


def _wrap_saving(undo: list) -> None:
    from keras.src.models.model import Model

    _set(undo, Model, "save", _chief_only(Model.save, "save"))
    _set(undo, Model, "save_weights", _chief_only(Model.save_weights, "weights"))


def _tf_checkpoints(undo: list) -> None:
    """``tf.train.Checkpoint.save/write`` and ``CheckpointManager.save``: chief-only writes.

    The pattern of TensorFlow's multi-worker tutorial, without the script
    writing it: every worker saves (saving may run collectives), the others
    into a private directory kept for the run (a manager's ``max_to_keep``
    sweeps and its ``latest_checkpoint`` work there) and removed at exit.
    Reading is untouched: a manager created on a restarted worker reads the
    real directory, so ``checkpoint.restore(manager.latest_checkpoint)``
    restores the chief's checkpoint on every worker (one machine or a shared
    filesystem, as the tutorial assumes).
    """
    import tensorflow as tf

    def private(path: str) -> str:
        from mirrorkit.training.chief import Scratch, strategy_of, task_label

        real = os.path.abspath(os.fspath(path))
        if real not in _PRIVATE:
            _PRIVATE[real] = Scratch("tfckpt", real, task_label(strategy_of(None)))
        return _PRIVATE[real].get()

    def redirect(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def save(self: Any, file_prefix: Any, *args: Any, **kwargs: Any) -> Any:
            if _writes_elsewhere(file_prefix):
                prefix = os.fspath(file_prefix)
                file_prefix = os.path.join(private(os.path.dirname(prefix) or "."),
                                           os.path.basename(prefix))
            return original(self, file_prefix, *args, **kwargs)

        return save

    def manager_save(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def save(self: Any, *args: Any, **kwargs: Any) -> Any:
            directory = getattr(self, "_directory", None)
            prefix = getattr(self, "_checkpoint_prefix", None)
            if directory is None or prefix is None or not _writes_elsewhere(directory):
                return original(self, *args, **kwargs)
            mine = private(directory)
            self._directory = mine
            self._checkpoint_prefix = os.path.join(mine, os.path.basename(prefix))
            try:
                return original(self, *args, **kwargs)
            finally:
                self._directory, self._checkpoint_prefix = directory, prefix

        return save

    for attr in ("save", "write"):
        _set(undo, tf.train.Checkpoint, attr, redirect(tf.train.Checkpoint.__dict__[attr]))
    _set(undo, tf.train.CheckpointManager, "save",
         manager_save(tf.train.CheckpointManager.__dict__["save"]))


# Real directory -> this worker's private stand-in, for the process's lifetime.
_PRIVATE: dict[str, Any] = {}


def _writes_elsewhere(path: Any) -> bool:
    """True on a non-chief worker for a real path (not already a private one)."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    from mirrorkit.training.chief import in_scratch, is_chief

    return not is_chief(None) and not in_scratch(path)
