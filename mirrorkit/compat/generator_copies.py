"""The ``generator-copies`` fix: arrays a Python generator yields are copied across workers.

``tf.data.Dataset.from_generator`` -- behind Keras's ``PyDataset``, generator
inputs to ``fit`` and users' own generator datasets -- wraps each NumPy array
the generator yields in a tensor that shares the array's memory. A training
step that reuses an input buffer for its output (TensorFlow's buffer
forwarding) then writes into the user's data. Under
``MultiWorkerMirroredStrategy`` with 2+ workers this happens on some runs and
not others: a ``PyDataset`` that returns slices of its sample-weight array had
them overwritten on one worker during the first epoch (by ``w / 64`` and zeros,
the gradient of the weighted loss), so from the second epoch on the loss, the
weighted metrics and the training itself differ from run to run.

The fix copies every NumPy array a generator yields before TensorFlow wraps
it, in a process that is one of 2+ workers (``TF_CONFIG`` names them): the
tensor then owns its memory and the user's arrays stay read-only to
TensorFlow. One process with local devices keeps the zero-copy path (no run
there showed the write). The copy costs one ``memcpy`` of each batch, next to
a Python call per batch that ``from_generator`` already makes.

Example:
    >>> from tensorflow.python.data.ops import from_generator_op   # doctest: +SKIP
    >>> patched = make(from_generator_op._from_generator)           # doctest: +SKIP
"""

from __future__ import annotations

import json
from typing import Any, Callable, Iterator

from mirrorkit import _env


def in_cluster() -> bool:
    """True when ``TF_CONFIG`` makes this process one of 2+ training tasks.

    Example:
        >>> with _env.patch({"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:2"]}}'}):
        ...     in_cluster()
        True
    """
    text = _env.tf_config_text()
    if text is None:
        return False
    try:
        cluster = json.loads(text).get("cluster") or {}
        return sum(len(cluster.get(kind) or ()) for kind in ("chief", "worker")) >= 2
    except (ValueError, AttributeError, TypeError):
        return False  # TensorFlow reports a malformed TF_CONFIG itself


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
        # Decided when the dataset is made: a launched worker has TF_CONFIG
        # from its first line on.
        if in_cluster() and callable(generator):
            generator = copying(generator)
        return original(generator, *args, **kwargs)

    return _from_generator
