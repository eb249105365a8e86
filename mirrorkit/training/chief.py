"""Who writes in a multi-worker job, and where the others write instead.

The chief writes real paths; every other worker writes to a private
:class:`Scratch` directory that is removed afterwards, so no file is ever
opened by two processes (see :mod:`mirrorkit.training.callbacks`).
:func:`broadcast_from_chief` hands the chief's restored state to everyone.

Example:
    >>> from mirrorkit.training.chief import is_chief
    >>> is_chief()                                       # doctest: +SKIP
    True
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import tempfile
import weakref
from typing import Any, Iterator

from mirrorkit import _env
from mirrorkit.strategy_facts import in_multi_worker_mode


def strategy_of(model_or_strategy: Any) -> Any:
    """The strategy of a model, a strategy itself, or (None) the current one."""
    import tensorflow as tf

    if model_or_strategy is None:
        return tf.distribute.get_strategy()
    return getattr(model_or_strategy, "distribute_strategy", model_or_strategy)


def is_chief(model_or_strategy: Any = None) -> bool:
    """True when this process writes checkpoints and logs.

    Args:
        model_or_strategy: a Keras model (its ``distribute_strategy`` is used),
            a ``tf.distribute.Strategy``, or None for the current strategy.

    Example:
        >>> from mirrorkit.training.callbacks import is_chief
        >>> is_chief()                                       # doctest: +SKIP
        True
    """
    strategy = strategy_of(model_or_strategy)
    return bool(getattr(strategy.extended, "should_checkpoint", True))


def task_label(strategy: Any) -> str:
    """``"worker1"`` style name of this task, or ``"local"`` outside a cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    task_type = getattr(resolver, "task_type", None)
    if not task_type:
        return "local"
    return f"{task_type}{int(getattr(resolver, 'task_id', 0) or 0)}"


def scratch_parent() -> str:
    """Where private folders go: the launched job's scratch root, else the temp dir.

    ``mirrorkit launch`` removes its root (``MIRRORKIT_SCRATCH_DIR``) once the
    workers are gone, however the job ended; a worker started without it
    relies on :class:`Scratch`'s own removal.

    Example:
        >>> scratch_parent() == (_env.scratch_dir() or tempfile.gettempdir())
        True
    """
    return _env.scratch_dir() or tempfile.gettempdir()


class Scratch:
    """A non-chief worker's private stand-in for a real path; removed when done.

    The name ties it to (callback kind, real path, task) so the same task's
    next start can delete what a killed run left behind, without touching
    other jobs' or other tasks' directories. Under ``mirrorkit launch`` it
    lives in the job's scratch root (:func:`scratch_parent`), which the
    launcher removes even when SIGKILL left no chance to clean up here.
    """

    def __init__(self, kind: str, real_path: str, task: str) -> None:
        digest = hashlib.sha1(os.path.abspath(real_path).encode()).hexdigest()[:10]
        self.prefix = f"mirrorkit-{kind}-{digest}-{task}-"
        self.path: str | None = None
        self._finalizer: Any = None

    def get(self) -> str:
        if self.path is None or not os.path.isdir(self.path):
            self._remove_stale()
            self.path = tempfile.mkdtemp(prefix=self.prefix, dir=scratch_parent())
            # Runs at garbage collection or interpreter exit, so an exception
            # that ends fit() (no on_train_end) still cleans up.
            self._finalizer = weakref.finalize(self, shutil.rmtree, self.path, True)
        return self.path

    def _remove_stale(self) -> None:
        for stale in glob.glob(os.path.join(scratch_parent(), self.prefix + "*")):
            shutil.rmtree(stale, ignore_errors=True)

    def clear(self) -> None:
        """Empty the directory but keep it (between saves)."""
        if self.path and os.path.isdir(self.path):
            for name in os.listdir(self.path):
                full = os.path.join(self.path, name)
                if os.path.isdir(full):
                    shutil.rmtree(full, ignore_errors=True)
                else:
                    os.remove(full)

    def remove(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self.path, self._finalizer = None, None


def broadcast_from_chief(strategy: Any, values: list[Any]) -> list[Any]:
    """Return the chief's copy of each tensor in ``values``, on every worker.

    An all-reduce SUM in which only global replica 0 (the chief's first
    device) contributes its value and every other replica contributes zeros:
    exact, and made of public API. Every worker must call it.
    """
    import tensorflow as tf

    # Integers travel as float64 (exact below 2**53); one all-reduce per dtype
    # because a packed all-reduce needs a single dtype.
    wire = [v if v.dtype.is_floating else tf.cast(v, tf.float64) for v in values]
    groups: dict[Any, list[int]] = {}
    for i, t in enumerate(wire):
        groups.setdefault(t.dtype, []).append(i)

    @tf.function
    def _step(tensors):
        def _replica_fn(tensors):
            ctx = tf.distribute.get_replica_context()
            is_source = tf.equal(ctx.replica_id_in_sync_group, 0)
            mine = [tf.where(is_source, t, tf.zeros_like(t)) for t in tensors]
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, mine)

        return strategy.run(_replica_fn, args=(tensors,))

    out: list[Any] = [None] * len(values)
    for indices in groups.values():
        reduced = _step([wire[i] for i in indices])
        for i, r in zip(indices, reduced):
            out[i] = tf.cast(strategy.experimental_local_results(r)[0], values[i].dtype)
    return out


def in_scratch(path: str | os.PathLike) -> bool:
    """True when ``path`` lies in one of mirrorkit's private temporary directories
    (or anywhere in a launched job's scratch root).

    Example:
        >>> in_scratch("out/model.keras")
        False
    """
    full = os.path.realpath(os.fspath(path))
    job = _env.scratch_dir()
    if job is not None and _strictly_under(full, os.path.realpath(job)):
        return True
    root = os.path.realpath(tempfile.gettempdir())
    if not _strictly_under(full, root):
        return False
    return os.path.relpath(full, root).split(os.sep)[0].startswith("mirrorkit-")


def _strictly_under(full: str, root: str) -> bool:
    return os.path.commonpath([root, full]) == root and full != root


@contextlib.contextmanager
def chief_path(model_or_strategy: Any, path: str | os.PathLike,
               kind: str = "save") -> Iterator[str]:
    """Yield where this process writes ``path``: itself on the chief, else a private path.

    A non-chief worker gets ``<private temp dir>/<basename of path>``; the
    directory is removed when the block ends. A path already inside one of
    mirrorkit's private directories (a chief-aware callback's) is kept.

    Args:
        model_or_strategy: as for :func:`is_chief`.
        path: the real destination.
        kind: a short label for the private directory's name.

    Example:
        >>> with chief_path(model, "out/final.keras") as target:   # doctest: +SKIP
        ...     model.save(target)
    """
    path = os.fspath(path)
    if is_chief(model_or_strategy) or in_scratch(path):
        yield path
        return
    scratch = Scratch(kind, path, task_label(strategy_of(model_or_strategy)))
    try:
        yield os.path.join(scratch.get(), os.path.basename(path) or "saved")
    finally:
        scratch.remove()


def barrier(model_or_strategy: Any = None) -> None:
    """Wait until every worker reaches this point (a no-op outside multi-worker mode).

    After a chief-only save, the others must not read the real path before
    the chief has finished writing it (a script that saves then reloads,
    ``model.save(p); keras.models.load_model(p)``, runs the same lines on
    every worker). One tiny all-reduce: every worker must call it.

    Example:
        >>> barrier()          # doctest: +SKIP
    """
    strategy = strategy_of(model_or_strategy)
    if not in_multi_worker_mode(strategy):
        return
    import tensorflow as tf

    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
