"""The stock export and reuse paths of a trained model, under ``mirrorkit run``.

A script that trains and then ships its model -- ``model.export(path)``,
``tf.saved_model.save(model, path)``, ``keras.export.ExportArchive``, then
``tf.saved_model.load(path)`` and a call of the loaded object's functions or
signatures, ``keras.layers.TFSMLayer``, TensorFlow Lite's converters -- runs
those lines while mirrorkit's strategy scope is open. Two things then differ
from ``python script.py``:

* **Calling what was loaded** (``loaded-function-calls``). Saving, exporting
  and converting work as they are, but ``tf.saved_model.load`` inside a
  strategy scope restores the variables as mirrored variables, and TensorFlow
  makes a restored function called in the cross-replica context (the
  script's top level, under mirrorkit's scope) fail on purpose
  (``InvalidArgumentError: ... executing a graph generated from the
  cross-replica context in an in-replica context``). While the script runs,
  such a call reads this process's first copy of each mirrored variable,
  which is what one device reads. Loading itself is left in the scope on
  purpose: a ``TFSMLayer`` (or a TF-Hub layer) the script fine-tunes must
  have mirrored variables, or ``fit`` fails.
* **Who writes the files** (``chief-only-saved-model``, multi-worker only).
  Every worker runs ``tf.saved_model.save`` (and with it ``model.export`` and
  ``ExportArchive.write_out``) on the same path; the chief writes the real
  directory, the others a private temporary one removed at once, then all
  wait for the chief, so a worker that loads the path next reads the chief's
  finished files. Every worker still saves: a save may run collectives. The
  folder ``TFLiteConverter.from_keras_model(...).convert()`` makes for itself
  (``tempfile.mkdtemp``, written through ``model.export`` and read back) is
  every worker's own and kept as it is.

Why not load with the scope stepped aside: the loaded variables would then be
plain, one copy, and ``fit`` on a model around a reloaded ``TFSMLayer`` fails
under the strategy (``AssertionError``; TensorFlow 2.21, Keras 3.15).

Limits: a restored function that *assigns* a mirrored variable from the top
level changes this process's first copy only; a sync-on-read variable reads
its first replica's value, not the sum.

Example:
    >>> with restored_calls(scope), chief_only_saved_models(runtime):  # doctest: +SKIP
    ...     runpy.run_path("train.py", run_name="__main__")
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
from mirrorkit.runner.scope import ScriptScope

logger = logging.getLogger(__name__)

# Their records: mirrorkit.patching.catalogue.
CALLS = "loaded-function-calls"
SAVES = "chief-only-saved-model"


@contextlib.contextmanager
def restored_calls(scope: ScriptScope) -> Iterator[None]:
    """Let the script call functions it loaded while mirrorkit's scope is open.

    Args:
        scope: the script's :class:`~mirrorkit.runner.scope.ScriptScope`;
            nothing changes when it mirrors nothing (``--strategy default``).

    Example:
        >>> with restored_calls(scope):                      # doctest: +SKIP
        ...     tf.saved_model.load("exported").serve(images)
    """
    if not scope.active:
        yield
        return
    from tensorflow.python.saved_model import load

    wrapper = getattr(load, "_WrapperFunction", None)
    if wrapper is None or "_call_flat" not in vars(wrapper):
        logger.warning("mirrorkit: this TensorFlow has no saved_model.load._WrapperFunction."
                       "_call_flat; %s is not applied (loaded functions keep TensorFlow's "
                       "behaviour).", CALLS)
        yield
        return
    make = functools.partial(_local_copies_across_replicas, scope=scope)
    with engine.applied(CALLS, [(wrapper, "_call_flat", make)]):
        yield


def _local_copies_across_replicas(call_flat: Callable[..., Any],
                                  scope: ScriptScope) -> Callable[..., Any]:
    import tensorflow as tf
    from tensorflow.python.distribute import distribute_utils

    @functools.wraps(call_flat)
    def _call_flat(self: Any, args: Any, captured_inputs: Any, *rest: Any, **kwargs: Any
                   ) -> Any:
        strategy = tf.distribute.get_strategy()
        # Only at the script's own level of mirrorkit's strategy: in a replica
        # (fit, strategy.run) TensorFlow already picks the replica's copy, and
        # a strategy the script made itself keeps TensorFlow's behaviour.
        if strategy is scope.strategy and tf.distribute.in_cross_replica_context():
            captured_inputs = [
                strategy.experimental_local_results(x)[0].handle
                if distribute_utils.is_distributed_variable(x) else x
                for x in captured_inputs]
        return call_flat(self, args, captured_inputs, *rest, **kwargs)

    return _call_flat


@contextlib.contextmanager
def chief_only_saved_models(runtime: Any) -> Iterator[None]:
    """Make ``tf.saved_model.save`` write the real path on the chief only.

    Covers ``model.export`` and ``keras.export.ExportArchive.write_out``,
    which save through it.

    Args:
        runtime: the :class:`mirrorkit.Runtime` of this process; nothing
            changes unless ``runtime.is_multi_worker``.

    Example:
        >>> with chief_only_saved_models(runtime):           # doctest: +SKIP
        ...     model.export("exported")       # a worker's own copy, unless chief
    """
    if not getattr(runtime, "is_multi_worker", False):
        yield
        return
    from tensorflow.python.saved_model import save

    # Importing `tensorflow.saved_model.experimental` (Keras's ExportArchive does,
    # at its first export) loads the public module again as `tensorflow.saved_model`,
    # with the unwrapped function, and makes it `tf.saved_model`: done first, it
    # is one of the modules below.
    importlib.import_module("tensorflow.saved_model.experimental")
    original = save.save
    replacement = _chief_only_save(original)
    # Every public name of the one function (tf.saved_model, tf.compat.v1/v2 ...);
    # TensorFlow's own modules (TFLite's temporary SavedModels) keep theirs.
    changes: list[tuple[Any, str, Callable[[Any], Any]]] = [
        (module, "save", lambda _f: replacement) for module in _public_api_modules()
        if module.__dict__.get("save") is original]
    try:
        from tensorflow.lite.python.lite import TFLiteKerasModelConverterV2 as converter
    except ImportError:   # no TFLite in this TensorFlow: nothing of its own to keep
        converter = None
    if converter is not None and hasattr(converter, "_convert_keras_to_saved_model"):
        changes.append((converter, "_convert_keras_to_saved_model", _saves_its_own))
    with engine.applied(SAVES, changes):
        yield


# The directories a TFLite conversion in progress made for itself (absolute paths).
_OWN: set[str] = set()


def _saves_its_own(convert: Callable[..., Any]) -> Callable[..., Any]:
    """``TFLiteConverter.from_keras_model(...).convert()`` saves the Keras model into
    a ``tempfile.mkdtemp()`` folder of its own and reads it back: never redirected."""

    @functools.wraps(convert)
    def _convert_keras_to_saved_model(self: Any, output_dir: Any, *args: Any,
                                      **kwargs: Any) -> Any:
        own = os.path.abspath(os.fspath(output_dir))
        _OWN.add(own)
        try:
            return convert(self, output_dir, *args, **kwargs)
        finally:
            _OWN.discard(own)

    return _convert_keras_to_saved_model


def _public_api_modules() -> list[Any]:
    # TensorFlow's generated public API, under whichever name it was imported.
    return [module for module in list(sys.modules.values())
            if module is not None and f"{os.sep}_api{os.sep}" in (
                getattr(module, "__file__", None) or "")]


def _chief_only_save(original: Callable[..., Any]) -> Callable[..., Any]:
    from mirrorkit.training.chief import barrier, chief_path, in_scratch, is_chief

    @functools.wraps(original)
    def save(obj: Any, export_dir: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(export_dir, (str, os.PathLike)) or in_scratch(export_dir) \
                or os.path.abspath(os.fspath(export_dir)) in _OWN:
            return original(obj, export_dir, *args, **kwargs)
        if not is_chief(None):
            _make_parent(export_dir)
        with chief_path(None, export_dir, "savedmodel") as target:
            result = original(obj, target, *args, **kwargs)
        # The script may load the path next on every worker: none before the
        # chief has finished writing it.
        barrier(None)
        return result

    return save


def _make_parent(export_dir: Any) -> None:
    """Make the folder a non-chief's own save would have made around its export.

    TensorFlow's multi-worker tutorial saves a non-chief's copy into a
    per-task folder and then removes that folder (``tf.io.gfile.rmtree``),
    which raises ``NotFoundError`` on a folder that was never made.
    """
    parent = os.path.dirname(os.path.abspath(os.fspath(export_dir)))
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as err:   # the save itself must still run
        logger.debug("mirrorkit: could not make %s (%s)", parent, err)
