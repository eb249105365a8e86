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
  reading (``latest_checkpoint``, ``restore``) is left to the real path. The
  real directory is still made (empty) on the other workers, as their own
  save would have made it.

A script with its own chief logic is left to it. TensorFlow's "Multi-worker
training with a custom training loop" tutorial points a non-chief's
``CheckpointManager`` at a folder of its own (``workertemp_1/ckpt``) and then
removes it with ``tf.io.gfile.rmtree``: the save goes to the private
directory, and the folder the script removes is there, empty. mirrorkit
cannot tell such a per-task folder from a shared one without a collective in
every save, which would hang a script that saves on the chief alone; so it
never lets two workers write one set of files, and the only difference a
script can see is that a non-chief's own folder is empty (its
``tf.train.latest_checkpoint(own_folder)`` is None). When the chief removes a
shared checkpoint folder right after its last save, a slower worker's save
can make the folder again, empty.

Outside multi-worker mode nothing is replaced: a single process is the chief.
``isinstance(cb, keras.callbacks.ModelCheckpoint)`` keeps working (the
replacements are subclasses), and so do the script's own subclasses.

``tf.saved_model.save`` (so ``model.export``): :mod:`mirrorkit.runner.exports`.
Not covered: ``keras.saving.save_model(model, path)`` called directly, and
files the script writes itself (``open``, ``np.save``).

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

from mirrorkit.patching import engine

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
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(engine.applied("chief-only-callbacks", _replace_callbacks()))
            stack.enter_context(engine.applied("chief-only-model-save", _wrap_saving()))
            stack.enter_context(engine.applied("chief-only-tf-checkpoint", _tf_checkpoints()))
        except Exception as err:  # noqa: BLE001 -- never break the script over this
            logger.warning("mirrorkit: chief-only saving not installed (%s); "
                           "every worker writes the script's paths.", err)
        yield


# One change: (owner, attribute, make(current) -> replacement), for the engine.
_Changes = list[tuple[Any, str, Callable[[Any], Any]]]


def _replace_callbacks() -> _Changes:
    import keras

    from mirrorkit.training import callbacks as chief_aware

    for name in _API_MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    changes: _Changes = []
    for cls_name in _CALLBACKS:
        original = getattr(keras.callbacks, cls_name)
        replacement = getattr(chief_aware, cls_name)
        for module_name, module in list(sys.modules.items()):
            if module is None or not module_name.startswith("keras") \
                    or module_name.startswith("keras.src"):
                continue
            if module.__dict__.get(cls_name) is original:
                changes.append((module, cls_name, lambda _cls, r=replacement: r))
    return changes


def _chief_only(method: Callable[..., Any], kind: str) -> Callable[..., Any]:
    from mirrorkit.training.callbacks import checkpoint_waits_after
    from mirrorkit.training.chief import barrier, chief_path

    @functools.wraps(method)
    def save(self: Any, filepath: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(filepath, (str, bytes)) and not hasattr(filepath, "__fspath__"):
            return method(self, filepath, *args, **kwargs)   # file objects: as written
        with chief_path(self, filepath, kind) as target:
            result = method(self, target, *args, **kwargs)
        # The script may read the file next (save, then load_model) on every
        # worker: none may read before the chief has finished writing it.
        # A chief-aware ModelCheckpoint waits once itself, after its save.
        if not checkpoint_waits_after():
            barrier(self)
        return result

    return save


def _wrap_saving() -> _Changes:
    from keras.src.models.model import Model

    return [(Model, "save", lambda method: _chief_only(method, "save")),
            (Model, "save_weights", lambda method: _chief_only(method, "weights"))]


def _tf_checkpoints() -> _Changes:
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
                _keep_present(os.path.dirname(prefix))
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
            _keep_present(directory)
            mine = private(directory)
            self._directory = mine
            self._checkpoint_prefix = os.path.join(mine, os.path.basename(prefix))
            try:
                return original(self, *args, **kwargs)
            finally:
                self._directory, self._checkpoint_prefix = directory, prefix

        return save

    return [(tf.train.Checkpoint, "save", redirect), (tf.train.Checkpoint, "write", redirect),
            (tf.train.CheckpointManager, "save", manager_save)]


def _keep_present(directory: Any) -> None:
    """Make the (empty) real directory a non-chief's redirected save would have made.

    The script may use it next as its own: TensorFlow's custom-loop tutorial
    removes a non-chief's checkpoint folder with ``tf.io.gfile.rmtree``,
    which raises ``NotFoundError`` on a folder that was never made.
    """
    if not directory:
        return
    import tensorflow as tf

    try:
        tf.io.gfile.makedirs(os.fspath(directory))
    except Exception as err:  # noqa: BLE001 -- the save itself must still run
        logger.debug("mirrorkit: could not make %s (%s)", directory, err)


# Real directory -> this worker's private stand-in, for the process's lifetime.
_PRIVATE: dict[str, Any] = {}


def _writes_elsewhere(path: Any) -> bool:
    """True on a non-chief worker for a real path (not already a private one)."""
    if not isinstance(path, (str, os.PathLike)):
        return False
    from mirrorkit.training.chief import in_scratch, is_chief

    return not is_chief(None) and not in_scratch(path)
