"""The minimal-change API: build and compile a model under the chosen strategy.

Two lines turn a single-device Keras script into a data-parallel one::

    import mirrorkit                                   # line 1
    with mirrorkit.scope():                            # line 2
        model = build_model()
        model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    model.fit(x, y, batch_size=64)                     # 64 is the global batch

Everything created inside the scope (weights, optimizer slots, metrics) is
mirrored on every replica, and Keras ``fit``/``evaluate``/``predict`` then split
each global batch across the replicas and all-reduce the gradients.

Importing this module does not import TensorFlow.

Example:
    >>> import mirrorkit
    >>> with mirrorkit.scope() as strategy:              # doctest: +SKIP
    ...     model = make_model()
    ...     model.compile(optimizer="adam", loss="mse")
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator, TypeVar

from mirrorkit.errors import UserInputError

logger = logging.getLogger(__name__)

T = TypeVar("T")


def current_strategy() -> Any:
    """Return the strategy in effect here, without creating one.

    Order: the strategy whose ``scope()`` is entered (``tf.distribute``'s
    own notion of "current"), then the one :func:`mirrorkit.get_strategy`
    created in this process, then TensorFlow's default (1 replica).

    Example:
        >>> current_strategy().num_replicas_in_sync      # doctest: +SKIP
        1
    """
    import tensorflow as tf

    if tf.distribute.has_strategy():
        return tf.distribute.get_strategy()
    # Read, never create: creating a strategy here could split devices the
    # user did not ask to split.
    from mirrorkit.distribute import strategy as _strategy

    return _strategy.created_strategy() or tf.distribute.get_strategy()


@contextlib.contextmanager
def scope(strategy: Any | None = None) -> Iterator[Any]:
    """Enter ``strategy.scope()``; build and compile your model inside it.

    Args:
        strategy: a ``tf.distribute.Strategy``. Defaults to
            :func:`mirrorkit.get_strategy` (which reads ``MIRRORKIT_STRATEGY``,
            ``MIRRORKIT_SIMULATE_CPUS`` and ``TF_CONFIG``; on a plain CPU
            machine it is the default strategy, so the same script still runs).

    Yields:
        The strategy, for ``with mirrorkit.scope() as strategy:``.

    Raises:
        UserInputError, RuntimeError: from :func:`mirrorkit.get_strategy` (bad
            settings, or TensorFlow already initialised with other devices).

    Example:
        >>> import keras, mirrorkit
        >>> with mirrorkit.scope() as strategy:          # doctest: +SKIP
        ...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        ...     model.compile(optimizer="sgd", loss="mse")
        >>> model.distribute_strategy is strategy        # doctest: +SKIP
        True
    """
    if strategy is None:
        from mirrorkit.distribute.strategy import get_strategy

        strategy = get_strategy()
    with strategy.scope():
        yield strategy


def build(fn: Callable[..., T], *args: Any, strategy: Any | None = None, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` inside :func:`scope` and return its result.

    For code that already has a ``build_model()`` function: wrap the call
    instead of indenting the body. Compile inside ``fn`` too, so the optimizer's
    variables are mirrored as well.

    Args:
        fn: a function that builds (and ideally compiles) a Keras model.
        *args: positional arguments for ``fn``.
        strategy: as in :func:`scope`. Defaults to :func:`mirrorkit.get_strategy`.
        **kwargs: keyword arguments for ``fn``.

    Returns:
        Whatever ``fn`` returns.

    Example:
        >>> def make(units):
        ...     model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(units)])
        ...     model.compile(optimizer="sgd", loss="mse")
        ...     return model
        >>> model = mirrorkit.build(make, 3)             # doctest: +SKIP
    """
    if not callable(fn):
        raise ValueError(f"`fn` must be callable. Received: fn={fn!r}")
    with scope(strategy):
        return fn(*args, **kwargs)


def sync_batch_norm(model: Any, *, strategy: Any | None = None) -> Any:
    """Return a copy of ``model`` whose BatchNormalization layers synchronise.

    By default each replica normalises with the mean and variance of its own
    slice of the batch and keeps its own moving statistics, so (a) training
    is not the same as on one device with the global batch, and (b) the
    replicas' moving mean/variance drift apart (the exported model takes
    replica 0's). Keras ``BatchNormalization(synchronized=True)`` all-reduces
    the statistics over the global batch instead, at the cost of three small
    all-reduces per BN layer per step.

    Use it when the per-replica batch is small (roughly < 16 examples, where
    per-slice statistics get noisy), for BN-heavy models (ResNets), and when
    replicas must stay identical. Skip it for large per-replica batches where
    the speed matters more.

    The copy is made with ``keras.models.clone_model`` (recursively, so nested
    Sequential/Functional models are covered) under the strategy's scope, and
    keeps the original weights. Call it before ``compile``: the copy is not
    compiled.

    Args:
        model: a built Sequential or Functional Keras model.
        strategy: the strategy whose scope the copy's variables are created in.
            Defaults to the model's own (``model.distribute_strategy``).

    Returns:
        A new model with ``synchronized=True`` on every BatchNormalization
        layer, or ``model`` itself when no BatchNormalization layer needs it.

    Raises:
        UserInputError: for a subclassed model (its layers cannot be cloned; pass
            ``synchronized=True`` when you construct its BN layers instead).

    Example:
        >>> with mirrorkit.scope():                      # doctest: +SKIP
        ...     model = mirrorkit.sync_batch_norm(keras.applications.ResNet50(weights=None))
        ...     model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    """
    import keras

    if not isinstance(model, keras.Model):
        raise ValueError(f"`model` must be a keras.Model. Received: model={model!r}")
    bn_layers = [layer for layer in _all_layers(model)
                 if isinstance(layer, keras.layers.BatchNormalization)]
    if not any(not layer.synchronized for layer in bn_layers):
        return model
    if not _is_graph_model(model):
        raise UserInputError(
            "sync_batch_norm can only clone Sequential or Functional models; for a "
            "subclassed model create its layers with "
            "keras.layers.BatchNormalization(synchronized=True). "
            f"Received: model of type {type(model).__name__}"
        )

    def clone_function(layer: Any) -> Any:
        config = layer.get_config()
        if isinstance(layer, keras.layers.BatchNormalization):
            config["synchronized"] = True
        return layer.__class__.from_config(config)

    if model.compiled:
        logger.warning("sync_batch_norm returns an uncompiled copy of %r; compile the "
                       "copy (the original's compile settings are not carried over).",
                       model.name)
    # Variables must be created under the same strategy as the original, or the
    # copy's weights would not be mirrored.
    strategy = strategy or model.distribute_strategy
    with strategy.scope():
        clone = keras.models.clone_model(model, clone_function=clone_function,
                                         recursive=True)
        if model.built and model.weights:
            clone.set_weights(model.get_weights())
    logger.info("sync_batch_norm: %d BatchNormalization layer(s) of %r now synchronise "
                "across replicas.", len(bn_layers), model.name)
    return clone


def _is_graph_model(model: Any) -> bool:
    # The same test clone_model applies; Functional has no public alias.
    import keras
    from keras.src.models.functional import Functional

    return isinstance(model, (keras.Sequential, Functional))


def _all_layers(model: Any) -> list[Any]:
    # Model.layers lists only the top level; nested models hide their BN layers.
    found = []
    for layer in getattr(model, "layers", []):
        found.append(layer)
        if hasattr(layer, "layers"):
            found.extend(_all_layers(layer))
    return found
