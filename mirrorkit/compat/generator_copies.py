"""The ``generator-copies`` fix: arrays a Python generator yields are copied before TensorFlow wraps them.

``tf.data.Dataset.from_generator`` -- behind Keras's ``PyDataset``, generator
inputs to ``fit`` and users' own generator datasets -- wraps each NumPy array
the generator yields in a tensor that shares the array's memory whenever the
array's data is 64-byte aligned. A training step that reuses an input buffer
for its output (TensorFlow's buffer forwarding) then writes into the user's
data. Measured, upstream, TensorFlow 2.21:

* two local replicas (``MirroredStrategy`` over two CPU devices), a
  ``PyDataset`` returning slices of one array as x and y: every run whose
  array sits at a 64-byte aligned address (about one in four for small
  arrays, every one for large arrays, which NumPy places on page boundaries)
  ends with the user's array overwritten (sum 31.5 -> 18.1) and other
  weights (0.0281 vs 0.0486); the same with a plain generator and
  ``from_generator``;
* 2+ workers (``MultiWorkerMirroredStrategy``): a ``PyDataset`` returning
  slices of its sample-weight array had them overwritten during the first
  epoch, so later epochs' loss, weighted metrics and training varied from
  run to run.

The fix copies every NumPy array a generator yields before TensorFlow wraps
it: the tensor then owns its memory and the user's arrays stay read-only to
TensorFlow. It copies in every process where it is on, one device included:
the array's address, not the strategy, decides whether TensorFlow shares it,
and a dataset is often made before the strategy that will read it. The copy
costs one ``memcpy`` of each batch, next to a Python call per batch that
``from_generator`` already makes; an unaligned array, TensorFlow copies
itself anyway.

Example:
    >>> from tensorflow.python.data.ops import from_generator_op   # doctest: +SKIP
    >>> patched = make(from_generator_op._from_generator)           # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable, Iterator


def owned(element: Any) -> Any:
    """``element`` with every NumPy array in it replaced by a copy that owns its memory.

    Dicts, lists, tuples and named tuples keep their type; anything that is
    not an array (numbers, strings, tensors) is returned as it is.

    Example:
        >>> import numpy as np
        >>> data = np.ones(4)
        >>> x, y = owned((data[:2], 3))
        >>> np.shares_memory(x, data), y
        (False, 3)
    """
    import numpy as np

    if isinstance(element, np.ndarray):
        return element.copy()
    if isinstance(element, dict):
        return type(element)((k, owned(v)) for k, v in element.items())
    if isinstance(element, tuple) and hasattr(element, "_fields"):
        return type(element)(*(owned(v) for v in element))
    if isinstance(element, (list, tuple)):
        return type(element)(owned(v) for v in element)
    return element


def copying(generator: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """Wrap a ``from_generator`` generator callable so each element it yields is :func:`owned`.

    Example:
        >>> import numpy as np
        >>> data = np.ones(4)
        >>> [np.shares_memory(e, data) for e in copying(lambda: iter([data]))()]
        [False]
    """

    def generate(*args: Any) -> Iterator[Any]:
        for element in generator(*args):
            yield owned(element)

    return generate


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``from_generator_op._from_generator`` (``original``) with the fix."""

    def _from_generator(generator, *args, **kwargs):
        if callable(generator):
            generator = copying(generator)
        return original(generator, *args, **kwargs)

    return _from_generator
