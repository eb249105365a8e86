"""Run an unmodified Keras script under a distribution strategy.

``mirrorkit run script.py ARGS`` behaves like ``python script.py ARGS``, with
one difference: before the script's first line, the strategy chosen by
:func:`mirrorkit.get_strategy` is created and its ``scope()`` entered for the
script's whole lifetime. Keras 3 models record the strategy in effect when
they are constructed, so every model the script builds, compiles and fits is
mirrored across the replicas -- no code change. ``tf.distribute.get_strategy()``
in the script returns that strategy. With ``--strategy default`` nothing below
applies except the ``fit`` safeguards: the script runs as under ``python``.

Strategies the script creates itself (for the script's lifetime only):

- ``tf.distribute.MirroredStrategy()``, ``tf.distribute.MultiWorkerMirroredStrategy()``
  and ``tf.distribute.experimental.MultiWorkerMirroredStrategy()`` return
  mirrorkit's strategy, so ``--simulate-cpus``, ``mirrorkit launch``'s
  ``TF_CONFIG``, the Keras multi-worker fixes and the lost-peer timeouts all
  apply to tutorial-style scripts. The same holds when the only arguments are
  ``cross_device_ops`` / ``communication_options`` / ``communication`` (not
  used: mirrorkit's strategy is already configured), ``devices`` naming exactly
  mirrorkit's devices, or a ``TFConfigClusterResolver``. One log line says so.
  ``isinstance(strategy, tf.distribute.MirroredStrategy)`` keeps working.
  Whichever of the two classes the script names, it gets the strategy of this
  run: under ``mirrorkit launch`` a ``MirroredStrategy()`` script trains across
  the workers, and a ``MultiWorkerMirroredStrategy()`` script run without a
  cluster trains on the local replicas.
- A strategy pinned to other devices -- ``MirroredStrategy(devices=[...])``,
  ``OneDeviceStrategy(...)``, a subclass -- is created as written and
  mirrorkit's scope is left (one log line), so the script then runs exactly as
  under ``python``: TensorFlow refuses to enter a second strategy's scope
  inside another's. Models built before that keep mirrorkit's strategy.
- ``MultiWorkerMirroredStrategy(cluster_resolver=...)`` with another resolver
  raises ``RuntimeError`` in a process that already joined a cluster
  (TensorFlow allows one per process); elsewhere it is created as written.

Batch semantics:

- by default the ``batch_size`` the script passes to ``fit``/``evaluate``/
  ``predict`` is the *global* batch, split across the replicas (the training
  math of the script is unchanged; each replica gets ``batch_size / N``).
- with ``scale_batch=True`` (``--scale-batch``, ``MIRRORKIT_SCALE_BATCH=1``) it
  is the *per-replica* batch: mirrorkit multiplies it by the replica count of
  the model's strategy (Keras's default of 32 included), so each replica
  computes on the batch the script was written for and an epoch takes N times
  fewer steps. This does not apply to inputs the script batched itself
  (``tf.data.Dataset``, generators, ``PyDataset``): their batch stays the
  global batch (logged once).

Empty replica batches: with N replicas, a last training batch of fewer than N
examples leaves a replica with an empty batch, on which ``BatchNormalization``
fails after a convolution ("Incompatible shapes: [0,6,6,4] vs. [0,8,8,1]") and
silently turns the weights into NaN after a ``Dense`` layer. For arrays and
tensors (what Keras can slice), ``fit`` leaves those few trailing training
examples (fewer than N) out of training, with one warning. Any
``validation_split`` is taken first, from the end of the data exactly as Keras
does, and passed as ``validation_data``, so validation keeps every example;
sample weights are trimmed alike. A ``tf.data.Dataset`` is never rewritten:
batch it with ``drop_remainder=True`` (or build it with
:func:`mirrorkit.data.train_pipeline`). When one fails this way, the error
carries a note saying so; when its loss turns NaN, one warning says so.

Uneven batches otherwise train fine once :mod:`mirrorkit.compat` is applied,
which every run does (``MIRRORKIT_COMPAT=off`` opts out): without it Keras 3
fails whenever the first batch of ``fit``/``evaluate`` does not split evenly
over the replicas (keras#20585), e.g. under ``--strategy default`` with the
script's own ``MirroredStrategy``.

Limits: the scope is entered in the main thread only; strategies created
through TensorFlow's private modules (``tensorflow.python.distribute``) are
not intercepted.

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
import math
import os
import runpy
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable, Iterator

from mirrorkit import _env
from mirrorkit.runtime import Runtime

logger = logging.getLogger(__name__)

# Keras's batch_size when a script passes none to fit/evaluate/predict.
_KERAS_DEFAULT_BATCH = 32
_WRAPPED_METHODS = ("fit", "evaluate", "predict")


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
    ``"__main__"``. The strategy scope, the ``tf.distribute`` strategy classes,
    ``Model.fit``/``evaluate``/``predict``, ``sys.argv``, ``sys.path`` and
    ``MIRRORKIT_*`` variables are restored afterwards. The strategy choice is
    exported as ``MIRRORKIT_STRATEGY``/``MIRRORKIT_SIMULATE_CPUS`` for the
    script's lifetime, so a script that calls :func:`mirrorkit.scope` or
    :func:`mirrorkit.get_strategy` gets the same strategy. See the module
    docstring for the strategies the script creates and the ``fit`` safeguards.

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
        # Keras 3 fixes, a no-op for single-replica models: get_strategy applies
        # them to multi-replica strategies it creates; applying them here too
        # covers the script's own strategy under --strategy default.
        from mirrorkit import compat

        compat.apply()
        if on_start is not None:
            on_start(runtime, scale)
        with _ScriptScope(strategy, runtime) as scope, _script_sys(path, config.args), \
                _script_strategies(scope), _model_methods(scale):
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
    # script.py` would show, starting at the script's own top frame; and the
    # runner's own frames at the end, when the runner refused something the
    # script asked (the script's line is then the last one shown).
    tb = err.__traceback__
    target = os.path.abspath(path)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    if tb is None:
        tb = err.__traceback__
    report = traceback.TracebackException(type(err), err, tb)
    here = os.path.abspath(__file__)
    while len(report.stack) > 1 and os.path.abspath(report.stack[-1].filename) == here:
        report.stack.pop()
    return "".join(report.format())


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


# --- mirrorkit's scope around the script ---------------------------------------

class _ScriptScope:
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

    def __enter__(self) -> "_ScriptScope":
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


# --- strategies the script creates ----------------------------------------------

# Public names replaced for the script's lifetime: (namespace, attribute).
# OneDeviceStrategy always pins a device, so it is only watched, never adopted.
_STRATEGY_NAMES = (
    ("distribute", "MirroredStrategy"),
    ("distribute", "MultiWorkerMirroredStrategy"),
    ("distribute.experimental", "MultiWorkerMirroredStrategy"),
    ("distribute", "OneDeviceStrategy"),
)
# Arguments that only tune how a strategy communicates. mirrorkit's strategy
# is already configured, so a script passing only these still gets it.
_TUNING_ARGUMENTS = ("cross_device_ops", "communication_options", "communication")


@contextlib.contextmanager
def _script_strategies(scope: _ScriptScope) -> Iterator[None]:
    """Make the script's own strategy constructions cooperate with mirrorkit's."""
    if not scope.active:
        yield
        return
    import tensorflow as tf

    patched: list[tuple[Any, str, Any]] = []
    replacements: dict[int, Any] = {}
    for namespace, attr in _STRATEGY_NAMES:
        original = getattr(_resolve(tf, namespace), attr)
        if id(original) not in replacements:
            replacements[id(original)] = _watching_class(original, f"tf.{namespace}.{attr}",
                                                         scope)
        replacement = replacements[id(original)]
        # The same class is exposed by tf.distribute and tf.compat.v2.distribute.
        for module in _public_modules():
            if module.__dict__.get(attr) is original:
                patched.append((module, attr, original))
                setattr(module, attr, replacement)
    try:
        yield
    finally:
        for module, attr, original in reversed(patched):
            setattr(module, attr, original)


def _resolve(tf: Any, dotted: str) -> Any:
    obj = tf
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _public_modules() -> list[Any]:
    # TensorFlow's generated public API lives under tensorflow._api; its
    # private implementation modules are left alone so TF's own code is unaffected.
    return [m for name, m in list(sys.modules.items())
            if name.startswith("tensorflow._api.") and m is not None]


def _watching_class(original: type, public_name: str, scope: _ScriptScope) -> type:
    """A stand-in for ``original`` whose construction goes through :func:`_construct`.

    A subclass with a metaclass: ``isinstance``/``issubclass`` against it
    answer as for ``original`` (so mirrorkit's strategy passes
    ``isinstance(s, tf.distribute.MirroredStrategy)``), and calling it can
    return an existing instance without ``__init__`` running again.
    """

    class _Meta(type(original)):  # type: ignore[misc]
        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            if cls is not stand_in:
                # The script's own subclass: its own strategy, as written.
                instance = super().__call__(*args, **kwargs)
                _honoured(scope, f"{cls.__name__} (a subclass of {public_name})", instance)
                return instance
            return _construct(original, public_name, scope, args, kwargs)

        def __instancecheck__(cls, instance: Any) -> bool:
            if cls is stand_in:
                return isinstance(instance, original)
            return super().__instancecheck__(instance)

        def __subclasscheck__(cls, subclass: type) -> bool:
            if cls is stand_in:
                return issubclass(subclass, original)
            return super().__subclasscheck__(subclass)

    stand_in = _Meta(original.__name__, (original,), {
        "__module__": original.__module__, "__qualname__": original.__qualname__,
        "__doc__": original.__doc__})
    return stand_in


def _construct(original: type, public_name: str, scope: _ScriptScope,
               args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import tensorflow as tf

    try:
        bound = inspect.signature(original.__init__).bind(None, *args, **kwargs)
    except TypeError:
        return original(*args, **kwargs)  # TensorFlow's own error for bad arguments
    given = {k: v for k, v in bound.arguments.items() if k not in ("self", "kwargs")}
    call = "{}({})".format(public_name, ", ".join(
        f"{k}={_short(v, k in _TUNING_ARGUMENTS)}" for k, v in given.items()))
    pinned = {k: v for k, v in given.items() if k not in _TUNING_ARGUMENTS}
    devices = pinned.pop("devices", None)
    if devices is not None and _same_devices(devices, scope.strategy):
        devices = None
    resolver = pinned.pop("cluster_resolver", None)
    if isinstance(resolver, tf.distribute.cluster_resolver.TFConfigClusterResolver):
        resolver = None  # what MultiWorkerMirroredStrategy() reads anyway
    if "OneDevice" not in public_name and devices is None and resolver is None and not pinned:
        unused = [k for k in given if k in _TUNING_ARGUMENTS]
        logger.info(
            "the script's %s is mirrorkit's strategy (%s, %d replica%s)%s.", call,
            scope.runtime.strategy, scope.runtime.replicas,
            "" if scope.runtime.replicas == 1 else "s",
            f"; its {', '.join(unused)} argument is not used" if unused else "")
        return scope.strategy
    if resolver is not None and scope.runtime.strategy == "multi_worker":
        raise RuntimeError(
            f"{call} cannot be created: `mirrorkit run` already joined this process to "
            f"the cluster in TF_CONFIG as {scope.runtime.task}, and TensorFlow allows one "
            "multi-worker strategy per process. Drop the cluster_resolver argument to "
            "use mirrorkit's strategy, or run the script with `python` instead of "
            "`mirrorkit run`.")
    instance = original(*args, **kwargs)
    _honoured(scope, call, instance)
    return instance


def _short(value: Any, elide: bool) -> str:
    # Device names read well as repr; objects (resolvers, options) by type only.
    if elide:
        return "..."
    if isinstance(value, (str, int, float, list, tuple)) or value is None:
        return repr(value)
    return type(value).__name__


def _same_devices(devices: Any, strategy: Any) -> bool:
    """True when ``devices`` names exactly the devices of ``strategy`` (this worker's)."""
    import tensorflow as tf

    def key(name: Any) -> tuple[str, int]:
        spec = tf.DeviceSpec.from_string(str(getattr(name, "name", name)))
        return (spec.device_type or "").upper(), spec.device_index or 0

    try:
        theirs = sorted(key(d) for d in ([devices] if isinstance(devices, str) else devices))
        ours = sorted(key(d) for d in strategy.extended.worker_devices)
    except (TypeError, ValueError, RuntimeError):
        return False
    return theirs == ours


def _honoured(scope: _ScriptScope, call: str, instance: Any) -> None:
    # TensorFlow refuses to enter a second strategy's scope inside another's,
    # so mirrorkit steps aside and the script runs as it would under python.
    replicas = getattr(instance, "num_replicas_in_sync", "?")
    left = scope.leave()
    logger.info(
        "the script creates its own %s (%s replica%s) and uses it as written%s.",
        call, replicas, "" if replicas == 1 else "s",
        "; mirrorkit's strategy scope is left for the rest of the script "
        "(tf.distribute.MirroredStrategy() without devices would be mirrorkit's)"
        if left else "")


# --- Model.fit / evaluate / predict ---------------------------------------------

@contextlib.contextmanager
def _model_methods(scale: bool) -> Iterator[None]:
    """Wrap ``keras.Model.fit/evaluate/predict`` for the script's lifetime.

    ``scale``: multiply ``batch_size`` by the model's replica count. ``fit``
    also drops the trailing examples that would give a replica an empty batch.
    """
    import keras

    saved = {name: keras.Model.__dict__.get(name) for name in _WRAPPED_METHODS}
    warned: set[str] = set()
    for name in _WRAPPED_METHODS:
        setattr(keras.Model, name, _method_wrapper(getattr(keras.Model, name), scale, warned))
    try:
        yield
    finally:
        for name, original in saved.items():
            if original is None:
                delattr(keras.Model, name)
            else:
                setattr(keras.Model, name, original)


def _is_prebatched(x: Any) -> bool:
    import keras
    import tensorflow as tf

    if isinstance(x, (tf.data.Dataset, tf.distribute.DistributedDataset,
                      keras.utils.PyDataset)):
        return True
    # Generators, iterators and framework data loaders yield ready batches.
    return inspect.isgenerator(x) or hasattr(x, "__next__") or "DataLoader" in type(x).__name__


def _replicas(model: Any) -> int:
    try:
        return int(model.distribute_strategy.num_replicas_in_sync)
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return 1


def _method_wrapper(method: Callable[..., Any], scale: bool,
                    warned: set[str]) -> Callable[..., Any]:
    signature = inspect.signature(method)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        replicas = _replicas(self)
        if replicas == 1 or kwargs.get("_use_cached_eval_dataset"):
            # Nothing to split, or fit's own validation pass (data already prepared).
            return method(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return method(self, *args, **kwargs)  # Keras's own error for bad arguments
        x = bound.arguments.get("x")
        prebatched = x is not None and _is_prebatched(x)
        if scale:
            _scale_batch(bound, replicas, prebatched, warned)
        if method.__name__ == "fit" and not prebatched:
            _drop_empty_replica_batch(bound, replicas, warned)
        try:
            result = method(*bound.args, **bound.kwargs)
        except Exception as err:
            _explain(err, method.__name__, replicas)
            raise
        if method.__name__ == "fit" and prebatched:
            _warn_if_nan(result, replicas, warned)
        return result

    wrapper.__name__ = method.__name__
    wrapper.__qualname__ = getattr(method, "__qualname__", method.__name__)
    wrapper.__doc__ = method.__doc__
    wrapper.__wrapped__ = method  # type: ignore[attr-defined]
    return wrapper


def _scale_batch(bound: inspect.BoundArguments, replicas: int, prebatched: bool,
                 warned: set[str]) -> None:
    if prebatched:
        if "scale" not in warned:
            warned.add("scale")
            logger.warning(
                "--scale-batch does not apply to %s inputs: they are already "
                "batched, and that batch is the global batch.",
                type(bound.arguments["x"]).__name__)
        return
    per_replica = bound.arguments.get("batch_size") or _KERAS_DEFAULT_BATCH
    bound.arguments["batch_size"] = per_replica * replicas
    if bound.arguments.get("validation_batch_size"):
        bound.arguments["validation_batch_size"] *= replicas


def _drop_empty_replica_batch(bound: inspect.BoundArguments, replicas: int,
                              warned: set[str]) -> None:
    """Leave out the < ``replicas`` trailing training examples of an uneven last batch.

    Keras splits each global batch across the replicas; a last batch of fewer
    examples than replicas leaves a replica with none, which layers such as
    BatchNormalization cannot handle. Works on what Keras itself can slice
    (arrays, tensors, nested structures of them), in place on ``bound``.
    """
    try:
        # Keras's own slicing helpers: identical validation_split semantics.
        from keras.src.trainers.data_adapters import array_slicing
        from keras import tree
    except ImportError:  # pragma: no cover - depends on Keras internals
        return
    a = bound.arguments
    data = (a.get("x"), a.get("y"), a.get("sample_weight"))
    flat = [t for t in tree.flatten(data) if t is not None]
    if not flat or not all(array_slicing.can_slice_array(t) for t in flat) \
            or not getattr(flat[0], "shape", None):
        return
    validation = None
    if a.get("validation_split") and a.get("validation_data") is None:
        # Same split as Keras (the LAST fraction validates); done here so only
        # the training part is trimmed. Keras's own error for too little data.
        data, validation = array_slicing.train_validation_split(
            data, validation_split=a["validation_split"])
        flat = [t for t in tree.flatten(data) if t is not None]
    n = int(flat[0].shape[0])
    batch = a.get("batch_size") or _KERAS_DEFAULT_BATCH
    remainder = n % batch
    if not 0 < remainder < replicas or n == remainder:
        return
    keep = n - remainder
    data = tree.map_structure(lambda t: None if t is None else t[:keep],
                              array_slicing.convert_to_sliceable(data))
    a["x"], a["y"], a["sample_weight"] = data
    if validation is not None:
        a["validation_data"], a["validation_split"] = validation, 0.0
    if "trim" not in warned:
        warned.add("trim")
        logger.warning(
            "fit leaves out the last %d of %d training examples: with batch_size=%d "
            "on %d replicas the last batch would hold %d, leaving a replica with an "
            "empty batch (BatchNormalization fails or turns the weights into NaN on it). "
            "Keep them with a training set size whose remainder modulo batch_size is 0 "
            "or at least %d.",
            remainder, n, batch, replicas, remainder, replicas)


# A replica's empty batch either fails (convolutions before BatchNormalization)
# or silently turns the weights into NaN (Dense before it). The failure has no
# fixed message ("Incompatible shapes: [0,6,6,4] vs. [0,8,8,1]", "[32] vs.
# [16]", ... depending on the layer), hence "if" in the advice.
_EMPTY_REPLICA = (
    "if the last batch of the training data holds fewer examples than the {n} "
    "replicas, a replica gets an empty batch, which BatchNormalization cannot train on. "
    "mirrorkit trims arrays passed to fit but never rewrites a tf.data.Dataset: batch it "
    "with drop_remainder=True (or build it with mirrorkit.data.train_pipeline).")


def _explain(err: BaseException, method: str, replicas: int) -> None:
    note = "mirrorkit run: " + _EMPTY_REPLICA.format(n=replicas)
    if method == "fit" and "Incompatible shapes" in str(err) \
            and note not in getattr(err, "__notes__", ()):
        err.add_note(note)


def _warn_if_nan(history: Any, replicas: int, warned: set[str]) -> None:
    losses = getattr(history, "history", {}).get("loss", [])
    if "nan" not in warned and any(isinstance(v, float) and math.isnan(v) for v in losses):
        warned.add("nan")
        logger.warning("fit's loss is NaN on %d replicas: %s", replicas,
                       _EMPTY_REPLICA.format(n=replicas))
