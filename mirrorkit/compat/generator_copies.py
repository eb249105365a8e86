"""The ``generator-copies`` fix: arrays from a generator or ``numpy_function`` are copied first.

``tf.data.Dataset.from_generator`` -- behind Keras's ``PyDataset``, generator
inputs to ``fit`` and users' own generator datasets -- and
``tf.numpy_function`` wrap each NumPy array the Python code returns in a
tensor that shares the array's memory whenever the array's data is 64-byte
aligned. A training step that reuses an input buffer for its output
(TensorFlow's buffer forwarding) then writes into the user's data.
Measured, upstream, TensorFlow 2.21:

* two local replicas (``MirroredStrategy`` over two CPU devices), a
  ``PyDataset`` returning slices of one array as x and y: every run whose
  array sits at a 64-byte aligned address (about one in four for small
  arrays, every one for large arrays, which NumPy places on page boundaries)
  ends with the user's array overwritten (sum 31.5 -> 18.1) and other
  weights (0.0281 vs 0.0486); the same with a plain generator and
  ``from_generator``, and with ``tf.numpy_function`` returning slices;
* 2+ workers (``MultiWorkerMirroredStrategy``): a ``PyDataset`` returning
  slices of its sample-weight array had them overwritten during the first
  epoch, so later epochs' loss, weighted metrics and training varied from
  run to run.

The fix copies every NumPy array a ``numpy_function`` returns (a generator's
elements reach TensorFlow through one) before TensorFlow wraps it: the tensor
then owns its memory and the user's arrays stay read-only to TensorFlow. It
copies in every process where it is on, one device included: the array's
address, not the strategy, decides whether TensorFlow shares it, and a
dataset is often made before the strategy that will read it. The copy
costs one ``memcpy`` of each batch, next to the Python call per batch that
is already made; an unaligned array, TensorFlow copies itself anyway.

Example:
    >>> from tensorflow.python.ops import script_ops                # doctest: +SKIP
    >>> patched = make(script_ops.FuncRegistry.__call__)            # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable


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


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``script_ops.FuncRegistry.__call__`` (``original``) with the fix.

    That call returns what a ``numpy_function`` (``from_generator``'s
    ``next`` among them) gave back, as NumPy arrays TensorFlow then wraps;
    each is replaced by its own copy. ``tf.py_function`` returns tensors and
    is left alone.
    """

    def __call__(self: Any, token: Any, device: Any, args: Any) -> Any:
        result = original(self, token, device, args)
        if isinstance(result, list):
            return [owned(value) for value in result]
        return owned(result)

    return __call__
