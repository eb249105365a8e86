"""Run an unmodified Keras script under a distribution strategy.

``mirrorkit run script.py ARGS`` behaves like ``python script.py ARGS``, with
one difference: before the script's first line, the strategy chosen by
:func:`mirrorkit.get_strategy` is created and its ``scope()`` entered for the
script's whole lifetime. Keras 3 models record the strategy in effect when
they are constructed, so every model the script builds, compiles and fits is
mirrored across the replicas -- no code change.

Batch semantics:

- by default the ``batch_size`` the script passes to ``fit``/``evaluate``/
  ``predict`` is the *global* batch, split across the replicas (the training
  math of the script is unchanged; each replica gets ``batch_size / N``).
- with ``scale_batch=True`` (``--scale-batch``, ``MIRRORKIT_SCALE_BATCH=1``) it
  is the *per-replica* batch: mirrorkit multiplies it by the replica count
  (Keras's default of 32 included), so each replica computes on the batch the
  script was written for and an epoch takes N times fewer steps. This does not
  apply to inputs the script batched itself (``tf.data.Dataset``, generators,
  ``PyDataset``): their batch stays the global batch (logged once).

Limits: the scope is entered in the main thread only; a script that creates
its own ``tf.distribute`` strategy should be run with ``--strategy default``
(or plain ``python``), as TensorFlow refuses to nest two strategies.

Example:
    >>> from mirrorkit.runner import RunConfig, run_script
    >>> run_script(RunConfig(script="train.py", args=("--epochs", "1"),
    ...                      simulate_cpus=2))          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

from mirrorkit import _env
from mirrorkit.runtime import Runtime

logger = logging.getLogger(__name__)

# Keras's batch_size when a script passes none to fit/evaluate/predict.
_KERAS_DEFAULT_BATCH = 32
_SCALED_METHODS = ("fit", "evaluate", "predict")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What to run and how (the ``mirrorkit run`` flags).

    Attributes:
        script: path of the ``.py`` file to run.
        args: the script's own arguments (its ``sys.argv[1:]``).
        strategy: strategy kind; None falls back to ``MIRRORKIT_STRATEGY``, then auto.
        simulate_cpus: logical CPU devices; None falls back to
            ``MIRRORKIT_SIMULATE_CPUS``, then none.
        scale_batch: treat the script's ``batch_size`` as per replica; None
            falls back to ``MIRRORKIT_SCALE_BATCH``, then False.

    Example:
        >>> RunConfig(script="train.py", args=("--epochs", "3")).args
        ('--epochs', '3')
    """

    script: str | os.PathLike[str]
    args: tuple[str, ...] = ()
    strategy: str | None = None
    simulate_cpus: int | None = None
    scale_batch: bool | None = None


class ScriptFailed(Exception):
    """The script raised an uncaught exception (Python would exit with 1).

    Attributes:
        traceback_text: the traceback as ``python script.py`` would print it,
            starting at the script's own frame.
        exit_code: 1, like the interpreter.
    """

    exit_code = 1

    def __init__(self, traceback_text: str) -> None:
        super().__init__(traceback_text.rstrip().splitlines()[-1] if traceback_text else "")
        self.traceback_text = traceback_text


def check_script(script: str | os.PathLike[str]) -> Path:
    """Check that ``script`` is an existing ``.py`` file and return its path.

    Raises:
        FileNotFoundError: when it does not exist.
        ValueError: when it is a directory or does not end in ``.py``.

    Example:
        >>> check_script("surely/missing.py")
        Traceback (most recent call last):
        ...
        FileNotFoundError: Script not found. Received: script='surely/missing.py'
    """
    path = Path(script)
    if not path.exists():
        raise FileNotFoundError(f"Script not found. Received: script={os.fspath(script)!r}")
    if path.is_dir() or path.suffix != ".py":
        raise ValueError(
            f"The script must be a Python file ending in .py. Received: "
            f"script={os.fspath(script)!r}"
        )
    return path


def run_script(config: RunConfig,
               on_start: Callable[[Runtime, bool], None] | None = None) -> None:
    """Run ``config.script`` as ``__main__`` under the selected strategy.

    Like ``python SCRIPT ARGS``: ``sys.argv`` is ``[SCRIPT, *ARGS]``, the
    script's directory comes first on ``sys.path``, and ``__name__`` is
    ``"__main__"``. The strategy scope, ``sys.argv``, ``sys.path`` and
    ``MIRRORKIT_*`` variables are restored afterwards. The strategy choice is
    exported as ``MIRRORKIT_STRATEGY``/``MIRRORKIT_SIMULATE_CPUS`` for the
    script's lifetime, so a script that calls :func:`mirrorkit.scope` or
    :func:`mirrorkit.get_strategy` gets the same strategy.

    Args:
        config: the script, its arguments and the strategy settings.
        on_start: called as ``on_start(runtime, scale_batch)`` after the
            strategy exists and before the script's first line (the CLI prints
            its one-line summary there).

    Raises:
        FileNotFoundError, ValueError: for a missing or non-``.py`` script or a
            bad strategy setting (before anything runs).
        RuntimeError: when the strategy cannot be created.
        SystemExit: whatever the script raised (``sys.exit(3)``), unchanged.
        ScriptFailed: the script raised an uncaught exception; its traceback
            text, trimmed to the script's frames, is attached.

    Example:
        >>> run_script(RunConfig("train.py", simulate_cpus=2),
        ...            on_start=lambda rt, scaled: print(rt.summary()))  # doctest: +SKIP
        strategy=mirrored replicas=2 (MIRRORKIT_SIMULATE_CPUS=2 on a CPU-only machine)
    """
    path = check_script(config.script)
    scale = _env.scale_batch() if config.scale_batch is None else bool(config.scale_batch)
    # Explicit settings go through the environment, so the script's own
    # mirrorkit calls (if any) resolve to the very same strategy.
    exported = {_env.SCALE_BATCH: "1" if scale else "0"}
    if config.strategy is not None:
        exported[_env.STRATEGY] = config.strategy
    if config.simulate_cpus is not None:
        exported[_env.SIMULATE_CPUS] = str(config.simulate_cpus)
    with _env.patch(exported):
        from mirrorkit.strategy import describe, get_strategy

        strategy = get_strategy()
        runtime = describe(strategy)
        if on_start is not None:
            on_start(runtime, scale)
        with _strategy_scope(strategy, runtime), _script_sys(path, config.args), \
                _scaled_batches(runtime.replicas if scale else 1):
            _run_path(path)


def _run_path(path: Path) -> None:
    try:
        runpy.run_path(os.fspath(path), run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as err:  # noqa: BLE001 -- report any script failure like Python
        raise ScriptFailed(_script_traceback(err, path)) from None


def _script_traceback(err: BaseException, path: Path) -> str:
    # Drop mirrorkit's and runpy's frames so the user sees what `python
    # script.py` would show, starting at the script's own top frame.
    tb = err.__traceback__
    target = os.path.abspath(path)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    if tb is None:
        tb = err.__traceback__
    return "".join(traceback.format_exception(type(err), err, tb))


@contextlib.contextmanager
def _strategy_scope(strategy: Any, runtime: Runtime) -> Iterator[None]:
    if runtime.strategy == "default":
        # Nothing to mirror; staying out of any scope lets a script that
        # creates its own strategy enter that strategy's scope.
        yield
        return
    scope = strategy.scope()
    scope.__enter__()
    try:
        yield
    finally:
        try:
            scope.__exit__(None, None, None)
        except Exception as err:  # noqa: BLE001 -- a script that left scopes open
            logger.warning("could not leave the strategy scope cleanly: %s", err)


@contextlib.contextmanager
def _script_sys(path: Path, args: tuple[str, ...]) -> Iterator[None]:
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [os.fspath(path), *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


def _is_prebatched(x: Any) -> bool:
    import keras
    import tensorflow as tf

    if isinstance(x, (tf.data.Dataset, tf.distribute.DistributedDataset,
                      keras.utils.PyDataset)):
        return True
    # Generators, iterators and framework data loaders yield ready batches.
    return inspect.isgenerator(x) or hasattr(x, "__next__") or "DataLoader" in type(x).__name__


@contextlib.contextmanager
def _scaled_batches(factor: int) -> Iterator[None]:
    """Multiply the batch_size given to Model.fit/evaluate/predict by ``factor``."""
    if factor == 1:
        yield
        return
    import keras

    saved = {name: keras.Model.__dict__.get(name) for name in _SCALED_METHODS}
    warned: list[bool] = []
    for name in _SCALED_METHODS:
        setattr(keras.Model, name, _scaling_wrapper(getattr(keras.Model, name), factor, warned))
    try:
        yield
    finally:
        for name, original in saved.items():
            if original is None:
                delattr(keras.Model, name)
            else:
                setattr(keras.Model, name, original)


def _scaling_wrapper(method: Callable[..., Any], factor: int,
                     warned: list[bool]) -> Callable[..., Any]:
    signature = inspect.signature(method)

    def scaled(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(self, *args, **kwargs)
        x = bound.arguments.get("x")
        if x is not None and _is_prebatched(x):
            if not warned:
                warned.append(True)
                logger.warning(
                    "--scale-batch does not apply to %s inputs: they are already "
                    "batched, and that batch is the global batch.", type(x).__name__)
            return method(*bound.args, **bound.kwargs)
        per_replica = bound.arguments.get("batch_size") or _KERAS_DEFAULT_BATCH
        bound.arguments["batch_size"] = per_replica * factor
        if bound.arguments.get("validation_batch_size"):
            bound.arguments["validation_batch_size"] *= factor
        return method(*bound.args, **bound.kwargs)

    scaled.__name__ = method.__name__
    scaled.__doc__ = method.__doc__
    scaled.__wrapped__ = method  # type: ignore[attr-defined]
    return scaled
