"""``Model.fit``/``evaluate``/``predict`` wrapped for the script's lifetime.

Four jobs: ``--scale-batch`` (the script's ``batch_size`` is per replica),
the trailing examples of ``fit`` on arrays that would leave a replica an
empty batch (see :mod:`mirrorkit.runner.script`), ``--speed-up-fit``
(:mod:`mirrorkit.runner.speed`) and ``--compare-one-device`` (each model's
first ``fit`` starts with :func:`mirrorkit.runner.one_device_check.check_fit`).

Example:
    >>> from mirrorkit.runner.model_methods import model_methods   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import weakref
from typing import Any, Callable, Iterator

from mirrorkit.patching import engine
from mirrorkit.strategy_facts import model_replicas, per_replica_batch_norm

logger = logging.getLogger(__name__)

# Keras's batch_size when a script passes none to fit/evaluate/predict.
_KERAS_DEFAULT_BATCH = 32
_WRAPPED_METHODS = ("fit", "evaluate", "predict")


@contextlib.contextmanager
def model_methods(scale: bool, speed: bool = False, compare: bool = False) -> Iterator[None]:
    """Wrap ``keras.Model.fit/evaluate/predict`` (and ``compile``) for the script's lifetime.

    ``scale``: multiply ``batch_size`` by the model's replica count. ``fit``
    also drops the trailing examples that would give a replica an empty batch.
    ``speed``: ``--speed-up-fit`` (:func:`mirrorkit.runner.speed.speed_up`).
    ``compare``: ``--compare-one-device``: each model's first ``fit`` on more
    than one replica starts with the one-device check.

    Example:
        >>> with model_methods(scale=False, compare=True):          # doctest: +SKIP
        ...     model.fit(x, y)   # one "mirrorkit: one-device check:" line first
    """
    import keras

    # --speed-up-fit is a patch of its own (turned off by name: fit as written).
    speed = speed and engine.enabled("speed-up-fit")
    warned: set[str] = set()
    # Models whose first fit was checked (each model once; the script owns them).
    checked: weakref.WeakSet | None = weakref.WeakSet() if compare else None
    methods = [(keras.Model, name,
                lambda method: _method_wrapper(method, scale, warned, speed, checked))
               for name in _WRAPPED_METHODS]
    compiles = [(keras.Model, "compile", _compile_wrapper)] if speed else []
    with engine.applied("script-model-methods", methods), \
            engine.applied("speed-up-fit", compiles):
        yield


def _is_prebatched(x: Any) -> bool:
    import keras
    import tensorflow as tf

    if isinstance(x, (tf.data.Dataset, tf.distribute.DistributedDataset,
                      keras.utils.PyDataset)):
        return True
    # Generators, iterators and framework data loaders yield ready batches.
    return inspect.isgenerator(x) or hasattr(x, "__next__") or "DataLoader" in type(x).__name__


def _compile_wrapper(method: Callable[..., Any]) -> Callable[..., Any]:
    def compile(self: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: A001 - Keras's name
        from mirrorkit.runner.speed import compile_recorded

        compile_recorded(self, kwargs)
        return method(self, *args, **kwargs)

    compile.__doc__ = method.__doc__
    compile.__wrapped__ = method  # type: ignore[attr-defined]
    return compile


def _method_wrapper(method: Callable[..., Any], scale: bool, warned: set[str],
                    speed: bool = False,
                    checked: weakref.WeakSet | None = None) -> Callable[..., Any]:
    signature = inspect.signature(method)
    speeds_up = speed and method.__name__ == "fit"

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        replicas = model_replicas(self)
        if checked is not None and replicas == 1 and method.__name__ == "fit" \
                and self not in checked:
            from mirrorkit.runner.one_device_check import single_replica

            checked.add(self)
            single_replica(self)
        if (replicas == 1 and not speeds_up) or kwargs.get("_use_cached_eval_dataset"):
            # Nothing to split, or fit's own validation pass (data already prepared).
            return method(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return method(self, *args, **kwargs)  # Keras's own error for bad arguments
        x = bound.arguments.get("x")
        prebatched = x is not None and _is_prebatched(x)
        if scale and replicas > 1:
            _scale_batch(bound, replicas, prebatched, warned)
        if method.__name__ == "fit" and not prebatched and replicas > 1:
            _drop_empty_replica_batch(bound, replicas, warned)
        if method.__name__ == "fit" and replicas > 1:
            _note_per_replica_batch_norm(self, replicas, warned)
        if checked is not None and method.__name__ == "fit" and replicas > 1 \
                and self not in checked:
            from mirrorkit.runner.one_device_check import check_fit

            checked.add(self)
            # Before --speed-up-fit: the check compares the step as the script compiled it.
            check_fit(self, bound, replicas)
        if speeds_up:
            from mirrorkit.runner.speed import speed_up

            speed_up(self, bound, replicas, warned)
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


def _note_per_replica_batch_norm(model: Any, replicas: int, warned: set[str]) -> None:
    # A difference from plain Python's numbers that mirrorkit leaves by default
    # (tf.distribute's and every framework's default; changing it costs
    # all-reduces): said once, so it is never silent.
    if "batch_norm" in warned:
        return
    names = per_replica_batch_norm(model)
    if not names:
        return
    warned.add("batch_norm")
    logger.warning(
        "%d BatchNormalization layer%s of %s (%s) normalise%s each replica's slice of "
        "the batch (%d replicas) with that slice's own statistics, as tf.distribute does: "
        "losses and weights differ a little from plain Python's. mirrorkit run "
        "--sync-batch-norm gives plain Python's numbers.",
        len(names), "" if len(names) == 1 else "s",
        repr(getattr(model, "name", "the model")),
        ", ".join(names[:3]) + (", ..." if len(names) > 3 else ""),
        "s" if len(names) == 1 else "", replicas)


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
        from keras import tree
        from keras.src.trainers.data_adapters import array_slicing
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
    "with drop_remainder=True (or build it with mirrorkit.train_pipeline).")


# How TensorFlow words the shape mismatch an empty replica batch runs into
# (which op meets it first depends on the step's graph).
_SHAPE_ERRORS = ("Incompatible shapes", "Unable to broadcast tensor")


def _explain(err: BaseException, method: str, replicas: int) -> None:
    note = "mirrorkit run: " + _EMPTY_REPLICA.format(n=replicas)
    if method == "fit" and any(shape in str(err) for shape in _SHAPE_ERRORS) \
            and note not in getattr(err, "__notes__", ()):
        err.add_note(note)


def _warn_if_nan(history: Any, replicas: int, warned: set[str]) -> None:
    losses = getattr(history, "history", {}).get("loss", [])
    if "nan" not in warned and any(isinstance(v, float) and math.isnan(v) for v in losses):
        warned.add("nan")
        logger.warning("fit's loss is NaN on %d replicas: %s", replicas,
                       _EMPTY_REPLICA.format(n=replicas))
