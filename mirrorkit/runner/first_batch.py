"""The first global batch of a ``fit`` call's input, taken without using it up.

For ``mirrorkit run --compare-one-device`` (:mod:`mirrorkit.runner.one_device_check`):

* arrays, tensors, dicts/lists of them, DataFrames: the first ``batch_size``
  rows of the training part (after ``validation_split``), unshuffled;
* a ``tf.data.Dataset``: one element of a fresh iterator (``fit`` starts its
  own iterators, so it still sees every batch);
* a ``keras.utils.PyDataset``: its item 0;
* a generator or iterator: its first batch, after which ``fit`` gets a
  generator that yields that batch first and then the rest.

What cannot be peeked (the check then says "not checked"): a
``tf.distribute.DistributedDataset`` (already split across replicas) and
inputs Keras cannot slice. A dataset whose elements change from one
iteration to the next gives the check one draw and ``fit`` the next ones:
``shuffle(n, seed=s)`` reshuffles per iterator, so with the check ``fit``'s
epochs come in the orders the epochs after them would have had (measured:
``range(8).shuffle(8, seed=1)`` gives the second epoch's order first).

Example:
    >>> import inspect, numpy as np
    >>> bound = inspect.signature(lambda x=None, y=None, batch_size=None: 0).bind(
    ...     np.zeros((10, 2)), np.ones(10), batch_size=4)
    >>> x, y, sample_weight = take(bound)
    >>> x.shape, y.shape, sample_weight
    ((4, 2), (4,), None)
"""

from __future__ import annotations

import inspect
from typing import Any, Iterator

__all__ = ["NotPeekable", "take"]

# Keras's batch_size when a script passes none to fit.
_KERAS_DEFAULT_BATCH = 32


class NotPeekable(ValueError):
    """The input's first batch cannot be taken without changing what ``fit`` sees.

    Example:
        >>> str(NotPeekable("fit was given no x"))
        'fit was given no x'
    """


def _prepend(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest


def _unpack(element: Any) -> tuple[Any, Any, Any]:
    from keras.utils import unpack_x_y_sample_weight

    return _owned(unpack_x_y_sample_weight(element))


def _owned(batch: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """The batch's NumPy arrays copied: TensorFlow wraps an array without a copy,
    and a step may write into it -- into the script's own data, for a slice."""
    import numpy as np
    from keras import tree

    return tuple(tree.map_structure(
        lambda t: np.array(t) if isinstance(t, np.ndarray) else t, batch))


def take(bound: inspect.BoundArguments) -> tuple[Any, Any, Any]:
    """Return ``(x, y, sample_weight)`` of the first global batch of ``fit``'s input.

    A generator or iterator in ``bound`` is replaced by one that yields the
    taken batch first, so ``fit`` still sees every batch.

    Args:
        bound: ``fit``'s bound arguments (``x``, ``y``, ``sample_weight``,
            ``batch_size``, ``validation_split``, ``validation_data``).

    Raises:
        NotPeekable: the input cannot be peeked (the message says why).

    Example:
        >>> import inspect
        >>> bound = inspect.signature(lambda x=None: 0).bind(iter([([1.0], [2.0])]))
        >>> take(bound), list(bound.arguments["x"])
        (([1.0], [2.0], None), [([1.0], [2.0])])
    """
    import keras
    import tensorflow as tf

    a = bound.arguments
    x = a.get("x")
    if x is None:
        raise NotPeekable("fit was given no x")
    if isinstance(x, tf.distribute.DistributedDataset):
        raise NotPeekable("a tf.distribute.DistributedDataset is already split across the "
                          "replicas; its global batch cannot be taken back")
    if isinstance(x, tf.data.Dataset):
        for element in x:
            return _unpack(element)
        raise NotPeekable("the tf.data.Dataset is empty")
    if isinstance(x, keras.utils.PyDataset):
        try:
            return _unpack(x[0])
        except IndexError as err:
            raise NotPeekable("the PyDataset has no item 0") from err
    if inspect.isgenerator(x) or hasattr(x, "__next__"):
        try:
            first = next(x)
        except StopIteration as err:
            raise NotPeekable("the generator yields nothing") from err
        a["x"] = _prepend(first, x)
        return _unpack(first)
    return _array_batch(bound)


def _array_batch(bound: inspect.BoundArguments) -> tuple[Any, Any, Any]:
    from keras import tree
    from keras.src.trainers.data_adapters import array_slicing

    a = bound.arguments
    data = (a.get("x"), a.get("y"), a.get("sample_weight"))
    flat = [t for t in tree.flatten(data) if t is not None]
    if not all(array_slicing.can_slice_array(t) for t in flat):
        kinds = sorted({type(t).__name__ for t in flat
                        if not array_slicing.can_slice_array(t)})
        raise NotPeekable(f"Keras cannot slice inputs of type {', '.join(kinds)}")
    if a.get("validation_split") and a.get("validation_data") is None:
        data, _ = array_slicing.train_validation_split(
            data, validation_split=a["validation_split"])
    batch = a.get("batch_size") or _KERAS_DEFAULT_BATCH
    return _owned(tuple(tree.map_structure(lambda t: None if t is None else t[:batch],
                                           array_slicing.convert_to_sliceable(data))))
