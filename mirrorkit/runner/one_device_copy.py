"""A one-device copy of a compiled model, and one training step of it.

For ``mirrorkit run --compare-one-device``. The copy is built from the
model's config (same class: a model that overrides ``train_step`` keeps its
step), compiled like the model (a fresh optimizer from the optimizer's
config, the same losses and loss weights, fresh metrics), given the model's
weights and optimizer state, and trained one step under the default
strategy. All of it happens in a thread of its own: mirrorkit's strategy
scope and Keras's name counters are per thread, so the copy lands on one
device and the script's later layer names are unchanged.

Example:
    >>> from mirrorkit.runner.one_device_copy import one_device_step   # doctest: +SKIP
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from mirrorkit.patching import engine
from mirrorkit.runner.one_device_verdict import Step

__all__ = ["CannotCopy", "QUIET", "one_device_step", "one_line", "run_step", "seed_states"]

# Layers whose training-time randomness is switched off for the check when
# the replica-random fix is off, and the attribute that does it: then each
# replica draws its own mask, so N replicas cannot draw one device's.
QUIET = {"Dropout": "rate", "SpatialDropout1D": "rate", "SpatialDropout2D": "rate",
         "SpatialDropout3D": "rate", "GaussianDropout": "rate", "AlphaDropout": "rate",
         "GaussianNoise": "stddev"}


class CannotCopy(RuntimeError):
    """The model has no faithful one-device copy (the message says why).

    Example:
        >>> str(CannotCopy("GAN overrides compile()"))
        'GAN overrides compile()'
    """


def run_step(model: Any, batch: tuple[Any, Any, Any], class_weight: Any,
             strategy: Any) -> dict[str, np.ndarray]:
    """Run ``model``'s own compiled training step once on ``batch``; return its logs.

    The batch is fed the way ``fit`` feeds it: Keras's epoch iterator,
    distributed by ``strategy``, handed to ``model.train_function``.

    Example:
        >>> run_step(model, (x[:32], y[:32], None), None, model.distribute_strategy)  # doctest: +SKIP
        {'loss': array(0.69, dtype=float32)}
    """
    from keras.src.backend.tensorflow.trainer import TFEpochIterator

    x, y, sample_weight = batch
    iterator = TFEpochIterator(x=x, y=y, sample_weight=sample_weight,
                               batch_size=_rows(batch), shuffle=False,
                               class_weight=class_weight, distribute_strategy=strategy,
                               steps_per_execution=model.steps_per_execution)
    model.make_train_function()
    logs = None
    with iterator.catch_stop_iteration():
        for _, _, data in iterator:
            logs = model.train_function(data)
            break
    if logs is None:
        raise CannotCopy("the batch gave no training step")
    # What fit reports for the epoch: the metrics read across the replicas. A
    # step's own logs hold each replica's result, averaged, which for a
    # weighted metric is not the global batch's value.
    report = getattr(model, "_get_metrics_result_or_logs", None)
    logs = report(logs) if report is not None else logs
    flat: dict[str, np.ndarray] = {}
    for key, value in logs.items():
        # A custom train_step returning {m.name: m.result()} nests compile_metrics.
        items = value.items() if isinstance(value, dict) else ((key, value),)
        flat.update((k, np.asarray(v)) for k, v in items)
    return flat


def _rows(batch: Any) -> int:
    from keras import tree

    leaves = [t for t in tree.flatten(batch) if t is not None]
    return int(leaves[0].shape[0])


def seed_states(model: Any) -> list[Any]:
    """The state variable of every seed generator of ``model``'s layers, in layer order.

    A copy built from the model's config has its layers, and so its seed
    generators, in the same order: giving it these states makes its Dropout
    masks and random augmentation the model's.

    Example:
        >>> import keras
        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dropout(0.5)])
        >>> [tuple(v.shape) for v in seed_states(model)]
        [(2,)]
    """
    return [generator.state for layer in model._flatten_layers()
            for generator in getattr(layer, "_seed_generators", None) or ()]


def one_device_step(model: Any, batch: tuple[Any, Any, Any], class_weight: Any,
                    weights: Sequence[np.ndarray], slots: Sequence[np.ndarray],
                    seeds: Sequence[np.ndarray] | None = None) -> Step:
    """Train a one-device copy of ``model`` one step on ``batch``, from the given state.

    Args:
        model: the compiled (and built) model.
        batch: ``(x, y, sample_weight)`` of the global batch.
        class_weight: ``fit``'s ``class_weight`` (or None).
        weights: the value of each of ``model.weights`` before the step.
        slots: the value of each of ``model.optimizer.variables`` before the step.
        seeds: the value of each of :func:`seed_states` before the step: the
            copy draws the model's random numbers. None: the copy's
            :data:`QUIET` layers are switched off instead.

    Returns:
        The copy's logs and each weight's update.

    Raises:
        CannotCopy: no faithful copy (another class, other variables, a custom
            ``compile``); the message says why.

    Example:
        >>> one_device_step(model, batch, None, weights, slots)       # doctest: +SKIP
    """
    result: dict[str, Any] = {}
    policy = _dtype_policy()

    def work() -> None:
        try:
            result["step"] = _copy_and_step(model, batch, class_weight, weights, slots, seeds,
                                            policy)
        except BaseException as err:  # noqa: BLE001 -- handed back to the caller's thread
            result["error"] = err

    thread = threading.Thread(target=work, name="mirrorkit-one-device-check")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["step"]


def _dtype_policy() -> Any:
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute("dtype_policy")


def _copy_and_step(model: Any, batch: tuple[Any, Any, Any], class_weight: Any,
                   weights: Sequence[np.ndarray], slots: Sequence[np.ndarray],
                   seeds: Sequence[np.ndarray] | None, policy: Any) -> Step:
    import tensorflow as tf
    from keras.src.backend.common import global_state

    if tf.distribute.has_strategy():
        raise CannotCopy("no one-device context: a strategy scope is open in every thread")
    if policy is not None:
        # Keras's global state is per thread: the script's mixed-precision policy.
        global_state.set_global_attribute("dtype_policy", policy)
    copy = _copy(model)
    _compile_like(copy, model)
    copy._symbolic_build(data_batch=batch)
    if copy.optimizer is not None and not copy.optimizer.built:
        copy.optimizer.build(copy.trainable_variables)
    _assign(copy.weights, weights, "weights")
    # As after Keras loads weights: a layer that keeps tensors derived from its
    # variables (an adapted Normalization's mean and variance) recomputes them.
    for layer in copy._flatten_layers():
        finalize = getattr(layer, "finalize_state", None)
        if callable(finalize) and layer.weights:
            finalize()
    _assign(copy.optimizer.variables, slots, "optimizer variables")
    if seeds is not None:
        _assign(seed_states(copy), seeds, "seed generators")
    else:
        for layer in copy._flatten_layers():
            attr = QUIET.get(type(layer).__name__)
            if attr:
                engine.on_object("one-device-check", layer, attr, 0.0)
    logs = run_step(copy, batch, class_weight, tf.distribute.get_strategy())
    updates = [np.asarray(v.numpy()) - w for v, w in zip(copy.weights, weights)]
    return Step(logs=logs, updates=updates)


def _copy(model: Any) -> Any:
    import keras
    from keras.src.saving import serialization_lib

    classes = {type(layer).__name__: type(layer) for layer in model._flatten_layers()}
    classes[type(model).__name__] = type(model)

    def rebuild(objects: dict[str, Any]) -> Any:
        # The script's own layer classes are known here, not registered.
        with keras.utils.custom_object_scope(objects), \
                serialization_lib.SafeModeScope(False):
            return type(model).from_config(model.get_config())

    try:
        copy = rebuild(classes)
    except Exception as err:  # noqa: BLE001 -- any failure means: no copy, unless ...
        try:
            # ... a layer of the script's whose __init__ takes only its own arguments
            # (keras.io's ViT Patches(patch_size)) refused Keras's name/trainable/dtype.
            copy = rebuild({name: _lenient(cls) for name, cls in classes.items()})
        except Exception as again:  # noqa: BLE001 -- the retry got further: its reason
            raise CannotCopy(f"{type(model).__name__} cannot be rebuilt from its config "
                             f"({type(again).__name__}: {one_line(again)})") from err
    if type(copy) is not type(model):
        raise CannotCopy(f"its config rebuilds a {type(copy).__name__}, not a "
                         f"{type(model).__name__}")
    return copy


def _lenient(cls: type) -> type:
    """``cls``, or for a script's layer whose ``__init__`` takes no ``**kwargs``, a stand-in
    whose ``from_config`` builds a ``cls`` from the config keys ``__init__`` names."""
    import inspect

    if cls.__module__.startswith("keras"):
        return cls
    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return cls

    class Lenient(cls):  # type: ignore[misc,valid-type]
        @classmethod
        def from_config(cls_, config: dict[str, Any]) -> Any:
            return cls(**{k: v for k, v in config.items() if k in params and k != "self"})

    Lenient.__name__ = Lenient.__qualname__ = cls.__name__
    Lenient.__module__ = cls.__module__
    return Lenient


def one_line(err: BaseException) -> str:
    """``err``'s message on one line, at most 200 characters (Keras wraps its messages).

    Example:
        >>> one_line(ValueError("Object Wrapped was created by passing\\nnon-serializable"))
        'Object Wrapped was created by passing non-serializable'
    """
    text = " ".join(str(err).split())
    return text if len(text) <= 200 else text[:197] + "..."


def _fresh(value: Any) -> Any:
    """A metric object's twin with its own state (strings and functions as they are)."""
    import keras
    from keras import tree

    def one(m: Any) -> Any:
        if isinstance(m, keras.metrics.Metric):
            return type(m).from_config(m.get_config())
        return m

    return tree.map_structure(one, value) if value is not None else None


def _compile_like(copy: Any, model: Any) -> None:
    import keras

    if type(model).compile is not keras.Model.compile:
        raise CannotCopy(f"{type(model).__name__} overrides compile()")
    config = dict(getattr(model, "_compile_config").config)
    optimizer = model.optimizer
    try:
        fresh_optimizer = type(optimizer).from_config(optimizer.get_config())
    except Exception as err:  # noqa: BLE001
        raise CannotCopy(f"its optimizer {type(optimizer).__name__} cannot be rebuilt from "
                         f"its config ({one_line(err)})") from err
    copy.compile(optimizer=fresh_optimizer, loss=config.get("loss"),
                 loss_weights=config.get("loss_weights"), metrics=_fresh(config.get("metrics")),
                 weighted_metrics=_fresh(config.get("weighted_metrics")),
                 run_eagerly=model.run_eagerly, jit_compile=False, steps_per_execution=1)


def _assign(variables: Sequence[Any], values: Sequence[np.ndarray], what: str) -> None:
    shapes = [tuple(v.shape) for v in variables]
    wanted = [tuple(np.shape(v)) for v in values]
    if shapes != wanted:
        raise CannotCopy(f"the copy's {what} differ from the model's "
                         f"({len(shapes)} vs {len(wanted)})")
    for variable, value in zip(variables, values):
        variable.assign(value)
