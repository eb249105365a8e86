"""``mirrorkit run --speed-up-fit``: the safe speed-ups of ``mirrorkit train``, for an unmodified script.

Opt-in, because they change what the script's callbacks see. Before each
``fit``:

* **Several steps per ``tf.function`` call.** When the script compiled with
  Keras's default ``steps_per_execution=1`` and the steps of an epoch are
  known, the model runs up to 16 steps per call. On data that ends with the
  epoch (arrays, a dataset of known size, no ``steps_per_epoch``) that is
  ``min(16, steps)``: Keras's step loop stops a call early when the data
  runs out, so the last call of an epoch of 23 steps runs 7. With
  ``steps_per_epoch`` it is the largest divisor up to 16
  (:func:`mirrorkit.training.plan.auto_steps_per_execution`), because there
  Keras runs whole calls (an epoch of 23 steps at 8 per call would run 24).
  This removes Keras's per-call Python work, 1.1-1.6x on the benchmark's
  unmodified script at 2 replicas (benchmarks/RESULTS.md, section 4). What
  it changes: batch-level callback
  methods (``on_train_batch_begin``/``end``) run once per call, with the
  index of the call's last step, and the progress bar moves per call. So
  when the script passes a callback that acts per batch (its own
  ``on_*batch*`` method, ``TensorBoard(update_freq=N)``, a checkpoint with
  ``save_freq=N``), the script keeps one step per call and one line says
  why. Epoch-level callbacks (``EarlyStopping``, ``ModelCheckpoint`` per
  epoch, ``CSVLogger``, ...) see exactly what they saw before. A value the
  script chose itself (``compile(steps_per_execution=...)``) is kept.
* **Prefetching.** A ``tf.data.Dataset`` handed to ``fit`` (and as
  ``validation_data``) that does not end in ``prefetch`` gets
  ``.prefetch(tf.data.AUTOTUNE)``: the next batch is prepared while the
  current step runs. Nothing else of the pipeline is rewritten.

The thread split of the CPU (one intra-op pool per simulated device) is
part of the strategy every ``mirrorkit run`` gets, with or without the flag.

Example:
    >>> compile_recorded(model, {"steps_per_execution": 4})  # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import logging
import math
import weakref
from typing import Any

from mirrorkit.patching import engine

logger = logging.getLogger(__name__)

_BATCH_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_batch_begin", "on_batch_end")
# Models whose script chose steps_per_execution in compile (kept as written).
_EXPLICIT: "weakref.WeakSet[Any]" = weakref.WeakSet()
# Beyond ~16 steps per call Keras's per-call Python work is negligible, and
# callbacks and the progress bar stay lively.
_CAP = 16


def compile_recorded(model: Any, kwargs: dict[str, Any]) -> None:
    """Remember whether the script chose ``steps_per_execution`` itself (then it is kept).

    Example:
        >>> compile_recorded(model, {"steps_per_execution": 8})   # doctest: +SKIP
    """
    if "steps_per_execution" in kwargs:
        _EXPLICIT.add(model)
    else:
        _EXPLICIT.discard(model)


def _per_batch(callback: Any) -> str | None:
    """Why ``callback`` acts per batch, or None when it only acts per epoch."""
    import keras

    base = keras.callbacks.Callback
    overridden = [name for name in _BATCH_HOOKS
                  if getattr(type(callback), name, None) is not getattr(base, name)]
    if not overridden:
        return None
    if type(callback).__module__.startswith(("keras.", "mirrorkit.")):
        # Keras's own: per batch only when configured so.
        every_epoch = (getattr(callback, "update_freq", "epoch") == "epoch"
                       and not getattr(callback, "_profile_batch", 0)
                       and getattr(callback, "save_freq", "epoch") == "epoch")
        if every_epoch:
            return None
    return f"{type(callback).__name__}.{overridden[0]}"


def _steps_per_epoch(arguments: dict[str, Any]) -> tuple[int | None, bool]:
    """``(steps of an epoch or None, whether the data ends with the epoch)``."""
    import tensorflow as tf
    from keras import tree

    if arguments.get("steps_per_epoch"):
        return int(arguments["steps_per_epoch"]), False
    x = arguments.get("x")
    if isinstance(x, tf.data.Dataset):
        n = int(x.cardinality())
        return (n, True) if n > 0 else (None, False)
    flat = [t for t in tree.flatten(x) if t is not None] if x is not None else []
    if not flat or not hasattr(flat[0], "shape") or not flat[0].shape:
        return None, False
    n = int(flat[0].shape[0])
    split = arguments.get("validation_split") or 0.0
    if split and arguments.get("validation_data") is None:
        n -= int(math.floor(n * split)) if n * split >= 1 else 0
    batch = arguments.get("batch_size") or 32
    return (math.ceil(n / batch), True) if n > 0 else (None, False)


def _prefetched(dataset: Any) -> Any:
    import tensorflow as tf

    if type(dataset).__name__.lstrip("_") == "PrefetchDataset":
        return dataset
    return dataset.prefetch(tf.data.AUTOTUNE)


def speed_up(model: Any, bound: inspect.BoundArguments, replicas: int,
             warned: set[str]) -> None:
    """Apply the speed-ups to one ``fit`` call, in place on ``bound`` (see the module docstring).

    Example:
        >>> speed_up(model, bound, replicas=2, warned=set())      # doctest: +SKIP
    """
    import tensorflow as tf

    from mirrorkit import compat
    from mirrorkit.training.plan import auto_steps_per_execution

    a = bound.arguments
    for key in ("x", "validation_data"):
        if isinstance(a.get(key), tf.data.Dataset):
            a[key] = _prefetched(a[key])
    if model in _EXPLICIT or getattr(model, "steps_per_execution", 1) != 1:
        return
    callbacks = a.get("callbacks") or []
    reasons = [r for r in (_per_batch(c) for c in callbacks) if r]
    if reasons:
        if "speed-callbacks" not in warned:
            warned.add("speed-callbacks")
            logger.warning("--speed-up-fit keeps 1 step per tf.function call: %s acts per "
                           "batch, and would be called once per call of several steps",
                           reasons[0])
        return
    steps, ends = _steps_per_epoch(a)
    if not steps or not compat.works("multi-step", replicas):
        return
    spe = min(_CAP, steps) if ends else auto_steps_per_execution(steps, _CAP)
    if spe <= 1:
        return
    if not engine.on_object("speed-up-fit", model, "steps_per_execution", spe):
        return
    # Keras builds its step functions once, for the value of that time.
    for function in ("train_function", "test_function", "predict_function"):
        engine.on_object("speed-up-fit", model, function, None)
    if "speed-steps" not in warned:
        warned.add("speed-steps")
        logger.warning("--speed-up-fit: %d training steps per tf.function call (%d steps per "
                       "epoch); batch-level callbacks run once per call", spe, steps)
