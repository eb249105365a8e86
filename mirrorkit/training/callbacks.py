"""Chief-aware drop-ins for Keras's ``BackupAndRestore``, ``ModelCheckpoint``, ``TensorBoard``.

Keras 3's own callbacks have no notion of a chief: under
``MultiWorkerMirroredStrategy`` every worker writes the same path, and two
workers sharing a directory fail with an HDF5 ``BlockingIOError`` (file
lock), then ``UnavailableError`` on the peer. The classes here take the same
constructor arguments as Keras's and fix that:

* **The chief writes the real path.** The chief is ``chief:0`` when the
  cluster has one, else ``worker:0`` (``strategy.extended.should_checkpoint``).
* **Every other worker writes to its own temporary directory**
  (``tempfile.mkdtemp``, named ``mirrorkit-<kind>-<hash of the real
  path>-<task>-*``), so no file is ever opened for writing by two
  processes. The others still write, rather than skip, because saving can
  run collectives (sync-on-read variables are all-reduced when read), and a
  collective that only the chief enters would hang it.
* **Temporary directories are removed** at ``on_train_end``, at interpreter
  exit (also after an exception ends ``fit``), and -- for a worker killed
  with ``SIGKILL`` -- by the same task's next start, which deletes stale
  directories of the same callback and real path.
* Single-process runs (default or ``MirroredStrategy``) are the chief: the
  callbacks behave exactly like Keras's.

Resuming (``BackupAndRestore``) works at **epoch granularity**. The chief
restores from ``backup_dir`` and then sends its weights, optimizer state and
epoch to the other workers over the cluster (one all-reduce at
``on_train_begin``), so every worker resumes from the same state and
``backup_dir`` only has to exist on the chief's machine -- no shared
filesystem needed. (If the chief itself moves to another machine, bring
``backup_dir`` along.) With ``save_freq=N`` steps the backup holds the
weights of the last N-step save, but Keras records only completed epochs, so
a resumed run restarts the unfinished epoch from its first batch: those
batches are trained twice.

Example:
    >>> import mirrorkit
    >>> from mirrorkit.training.callbacks import BackupAndRestore, ModelCheckpoint, TensorBoard
    >>> strategy = mirrorkit.get_strategy()                       # doctest: +SKIP
    >>> callbacks = [BackupAndRestore("out/backup"),
    ...              ModelCheckpoint("out/ckpt/model.keras", monitor="loss"),
    ...              TensorBoard("out/logs")]
    >>> model.fit(x, y, epochs=5, callbacks=callbacks)            # doctest: +SKIP
    >>> mirrorkit.callbacks.save_model(model, "out/final.keras")  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import shutil
import threading
from typing import Any

import keras

from mirrorkit.compat.saving_cache import share_saving_references
from mirrorkit.errors import MissingDependency
from mirrorkit.patching import engine
from mirrorkit.training import backup_manifest
from mirrorkit.training.chief import (
    Scratch,
    barrier,
    broadcast_from_chief,
    chief_path,
    in_multi_worker_mode,
    in_scratch,
    is_chief,
    strategy_of,
    task_label,
)

logger = logging.getLogger(__name__)

__all__ = ["BackupAndRestore", "ModelCheckpoint", "TensorBoard", "checkpoint_waits_after",
           "chief_path", "in_scratch", "is_chief", "save_model"]


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras ``BackupAndRestore`` that only the chief writes to ``backup_dir``.

    Same arguments and behaviour as :class:`keras.callbacks.BackupAndRestore`
    (the backup is deleted at the end of a successful ``fit`` unless
    ``delete_checkpoint=False``), plus:

    * the chief backs up to ``backup_dir``; other workers to a private
      temporary directory, removed when training ends;
    * on ``fit`` start the chief restores from ``backup_dir`` and every other
      worker receives the chief's weights, optimizer state and epoch over
      the cluster, so all resume identically (epoch granularity; see the
      module docstring for ``save_freq`` in steps);
    * the backup is written beside the old one and renamed over it, with a
      manifest (sizes, sha256) written last and the previous complete backup
      kept in ``previous/`` (:mod:`mirrorkit.training.backup_manifest`);
    * every restore verifies the backup first: a missing, truncated or
      changed file raises :class:`~mirrorkit.errors.RunError` naming it and
      the choices, instead of training on from random weights or epoch 0;
      ``previous/`` is used only when ``MIRRORKIT_BACKUP_FALLBACK=previous``.

    Args:
        backup_dir: directory for the backup (chief only).
        save_freq: ``"epoch"`` or an integer number of batches.
        double_checkpoint: keep the previous backup as well.
        delete_checkpoint: delete the backup when ``fit`` completes.

    Example:
        >>> cb = BackupAndRestore("out/backup")
        >>> model.fit(x, y, epochs=10, callbacks=[cb])       # doctest: +SKIP
    """

    def __init__(self, backup_dir, save_freq="epoch", double_checkpoint=False,
                 delete_checkpoint=True):
        super().__init__(backup_dir, save_freq=save_freq,
                         double_checkpoint=double_checkpoint,
                         delete_checkpoint=delete_checkpoint)
        self._real_backup_dir = self.backup_dir
        self._scratch: Scratch | None = None
        # Whether _load_model restored a backup (maybe previous/, when allowed).
        self._restored = False

    def _point_at(self, directory: str) -> None:
        # Keras derives these four paths from backup_dir in __init__.
        # Through the patch engine: turned off by name (backup-paths), every
        # worker keeps Keras's own paths, as the stock callback would.
        probe = keras.callbacks.BackupAndRestore(directory)
        for name in ("backup_dir", "_weights_path", "_training_metadata_path",
                     "_prev_weights_path", "_prev_training_metadata_path"):
            if not engine.on_object("backup-paths", self, name, getattr(probe, name)):
                return

    def set_model(self, model):
        super().set_model(model)
        strategy = strategy_of(model)
        if is_chief(strategy):
            self._point_at(self._real_backup_dir)
        else:
            if self._scratch is None:
                self._scratch = Scratch("backup", self._real_backup_dir, task_label(strategy))
            self._point_at(self._scratch.get())

    def on_train_begin(self, logs=None):
        model = self.model
        strategy = strategy_of(model)
        if in_multi_worker_mode(strategy):
            # Before the chief alone restores: see compat.saving_cache.
            share_saving_references(strategy)
        if model.optimizer is not None and not model.optimizer.built:
            # Build on every worker: creating variables is collective under
            # MWMS, and Keras would otherwise build it on the chief alone.
            with strategy.scope():
                model.optimizer.build(model.trainable_variables)
        super().on_train_begin(logs)
        if in_multi_worker_mode(strategy):
            self._sync_from_chief(model, strategy)

    def _sync_from_chief(self, model: Any, strategy: Any) -> None:
        import tensorflow as tf

        restored = is_chief(strategy) and (
            self._restored if "://" not in self.backup_dir
            else tf.io.gfile.exists(self._weights_path))
        # First agree on whether there is anything to send (one scalar, -1 for
        # nothing), so a fresh start costs no weight transfer.
        epoch = int(model._initial_epoch or 0) if restored else -1
        (epoch_t,) = broadcast_from_chief(strategy, [tf.constant(epoch, tf.int64)])
        epoch = int(epoch_t.numpy())
        if epoch < 0:
            return
        variables = list(model.weights)
        if model.optimizer is not None:
            variables += list(model.optimizer.variables)
        values = broadcast_from_chief(strategy, [tf.convert_to_tensor(v) for v in variables])
        for var, value in zip(variables, values):
            var.assign(value)
        model._initial_epoch = epoch
        logger.info("mirrorkit: resumed at epoch %d from the chief's backup", epoch)

    def _load_model(self):
        if "://" in self.backup_dir or not self.model.built:
            return super()._load_model()  # gs://, s3://: gfile; unbuilt: Keras's error
        # Keras loads whatever is there: no weights file meant random weights
        # labelled as later epochs, no metadata a silent restart at epoch 0.
        model = self.model
        backup = backup_manifest.restore(model, self.backup_dir)
        self._restored = backup is not None
        if backup is not None:
            model._initial_epoch = backup.epoch

    def _save_model(self):
        if "://" in self.backup_dir:  # gs://, s3://...: Keras's own (gfile) writes
            return super()._save_model()
        # Keras writes in place: a worker killed mid-write (SIGKILL, OOM) left a
        # half-written backup no restart could load. This writes beside it, then commits.
        os.makedirs(self.backup_dir, exist_ok=True)
        if self.double_checkpoint:
            for src, dst in ((self._weights_path, self._prev_weights_path),
                             (self._training_metadata_path, self._prev_training_metadata_path)):
                if os.path.exists(src):
                    _atomic_copy(src, dst)
        backup_manifest.save(self.model, self.backup_dir, self._current_epoch,
                             self._last_batch_seen)

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self._scratch is not None:
            self._scratch.remove()


def _atomic_copy(src: str, dst: str) -> None:
    partial = os.path.join(os.path.dirname(dst), ".partial-" + os.path.basename(dst))
    shutil.copyfile(src, partial)
    os.replace(partial, dst)


class ModelCheckpoint(keras.callbacks.ModelCheckpoint):
    """Keras ``ModelCheckpoint`` that only the chief writes to ``filepath``.

    Same arguments and behaviour as :class:`keras.callbacks.ModelCheckpoint`.
    Other workers save to a private temporary directory (emptied after each
    save, removed when training ends): every worker must save because saving
    may run collectives. ``save_best_only`` decides identically everywhere,
    since monitored metrics are aggregated over all workers.

    After each save every worker waits for the others (one tiny all-reduce,
    patch ``checkpoint-barrier``), so a worker that lists or loads
    ``filepath``'s folder right after ``fit`` finds the chief's newest file
    complete. Every worker reaches that point at the same epoch or batch
    (``save_freq`` counts batches, which are the same everywhere), and it
    waits whether or not ``save_best_only`` chose to write, so the wait never
    depends on that decision.

    Args:
        filepath: where the chief saves (may contain ``{epoch}`` etc.).
        monitor, verbose, save_best_only, save_weights_only, mode, save_freq,
        initial_value_threshold: as in Keras.

    Example:
        >>> cb = ModelCheckpoint("out/ckpt/epoch{epoch:02d}.keras", monitor="loss")
        >>> model.fit(x, y, epochs=3, callbacks=[cb])        # doctest: +SKIP
    """

    def __init__(self, filepath, monitor="val_loss", verbose=0, save_best_only=False,
                 save_weights_only=False, mode="auto", save_freq="epoch",
                 initial_value_threshold=None):
        super().__init__(filepath, monitor=monitor, verbose=verbose,
                         save_best_only=save_best_only,
                         save_weights_only=save_weights_only, mode=mode,
                         save_freq=save_freq,
                         initial_value_threshold=initial_value_threshold)
        self._scratch: Scratch | None = None
        self._chief = True
        self._after_save: Any = None

    def set_model(self, model):
        super().set_model(model)
        strategy = strategy_of(model)
        self._chief = is_chief(strategy)
        if in_multi_worker_mode(strategy):
            # Turned off by name (checkpoint-barrier), a worker may read the
            # folder before the chief's newest file is written.
            engine.on_object("checkpoint-barrier", self, "_after_save",
                             functools.partial(barrier, strategy))
        if not self._chief and self._scratch is None:
            self._scratch = Scratch("ckpt", self.filepath, task_label(strategy))
        if self._scratch is not None and not self._chief:
            self._scratch.get()  # now, so a killed run's leftovers go at start

    def _get_file_path(self, epoch, batch, logs):
        path = super()._get_file_path(epoch, batch, logs)
        if self._chief or self._scratch is None:
            return path
        return os.path.join(self._scratch.get(), os.path.basename(path))

    def _save_model(self, epoch, batch, logs):
        # Keras calls this at every save point and decides inside it whether
        # to write (save_best_only): the wait below comes after, whatever it
        # decided, and stands for the one mirrorkit run's Model.save has.
        _IN_CHECKPOINT.depth = getattr(_IN_CHECKPOINT, "depth", 0) + 1
        try:
            super()._save_model(epoch, batch, logs)
            if not self._chief and self._scratch is not None:
                # The others' copies are never read: keep disk use at one file.
                self._scratch.clear()
        finally:
            _IN_CHECKPOINT.depth -= 1
        if self._after_save is not None:
            self._after_save()

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self._scratch is not None:
            self._scratch.remove()


class TensorBoard(keras.callbacks.TensorBoard):
    """Keras ``TensorBoard`` that only the chief writes to ``log_dir``.

    Same arguments and behaviour as :class:`keras.callbacks.TensorBoard`;
    other workers log to a private temporary directory removed when training
    ends, so ``log_dir`` holds one run, not one per worker.

    Raises:
        ImportError: when the ``tensorboard`` package is not installed
            (TensorFlow 2.21 no longer depends on it).

    Example:
        >>> cb = TensorBoard("out/logs")
        >>> model.fit(x, y, epochs=3, callbacks=[cb])        # doctest: +SKIP
    """

    def __init__(self, log_dir="logs", **kwargs):
        # TF 2.21 no longer installs TensorBoard; without it Keras fails at the
        # first summary, mid-epoch, after creating an empty event file.
        if importlib.util.find_spec("tensorboard") is None:
            raise MissingDependency(
                "mirrorkit.callbacks.TensorBoard needs the tensorboard package, "
                "which TensorFlow 2.21 does not install: pip install tensorboard")
        super().__init__(log_dir=log_dir, **kwargs)
        self._scratch: Scratch | None = None

    def set_model(self, model):
        strategy = strategy_of(model)
        if is_chief(strategy):
            return super().set_model(model)
        if self._scratch is None:
            self._scratch = Scratch("tensorboard", self.log_dir, task_label(strategy))
        real = self.log_dir
        # Keras derives its writers' directories from log_dir in set_model.
        self.log_dir = self._scratch.get()
        try:
            super().set_model(model)
        finally:
            self.log_dir = real

    def on_train_batch_end(self, batch, logs=None):
        if self.update_freq == "epoch":
            # Keras calls summary.scalar for every log of every batch even
            # though, at update_freq="epoch", no writer is active and nothing
            # is recorded: ~0.1 ms per step (~2 % of a small model's step).
            logs = None
        super().on_train_batch_end(batch, logs)

    def on_train_end(self, logs=None):
        super().on_train_end(logs)
        if self._scratch is not None:
            self._scratch.remove()


# How deep this thread is in a ModelCheckpoint save (see checkpoint_waits_after).
_IN_CHECKPOINT = threading.local()


def checkpoint_waits_after() -> bool:
    """True while a chief-aware :class:`ModelCheckpoint` saves on this thread.

    Such a save ends with one wait for every worker (or none, with
    ``checkpoint-barrier`` turned off), so a ``Model.save`` wrapper that
    waits after each save (``mirrorkit run``'s chief-only saving) leaves
    the wait to the callback instead of waiting twice.

    Example:
        >>> checkpoint_waits_after()
        False
    """
    return getattr(_IN_CHECKPOINT, "depth", 0) > 0


def save_model(model: Any, path: str | os.PathLike, **kwargs: Any) -> bool:
    """Save ``model`` to ``path`` on the chief only; call it on every worker.

    Saving can run collectives (sync-on-read variables are all-reduced when
    read), so every worker must save or the chief may wait forever. The
    chief writes ``path``; the others write to a temporary directory that is
    deleted at once. ``*.weights.h5`` paths save weights
    (``model.save_weights``), anything else the whole model (``model.save``).

    Args:
        model: the Keras model.
        path: destination, e.g. ``"out/model.keras"`` or ``"out/w.weights.h5"``.
        **kwargs: passed to ``model.save`` / ``model.save_weights``.

    Returns:
        True when this process wrote ``path`` (the chief).

    Example:
        >>> from mirrorkit.training.callbacks import save_model
        >>> save_model(model, "out/final.keras")             # doctest: +SKIP
        True
    """
    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent and is_chief(model):
        os.makedirs(parent, exist_ok=True)
    with chief_path(model, path, "save") as target:
        if path.endswith(".weights.h5"):
            model.save_weights(target, **kwargs)
        else:
            model.save(target, **kwargs)
    return is_chief(model)
