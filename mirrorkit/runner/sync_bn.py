"""``mirrorkit run --sync-batch-norm``: the script's BatchNormalization layers synchronise.

Under N replicas each replica normalises with the mean and variance of its own
slice of the batch, so a model with BatchNormalization trains differently from
one device on the whole batch (the corpus measures 5e-2 on the first step's
loss at 16 examples per replica), and the replicas' moving statistics drift
apart. Keras's ``BatchNormalization(synchronized=True)`` all-reduces the
statistics over the global batch instead: the numbers of one device, at the
cost of a few small all-reduces per layer and step. A script asks for it in
code; an unmodified script gets it with this flag: while the script runs,
every ``BatchNormalization`` constructed without an explicit ``synchronized``
argument (its own layers, ``keras.applications`` backbones) gets
``synchronized=True``. A model loaded from a file keeps its saved setting.

Example:
    >>> with synchronized_batch_norm(True):                           # doctest: +SKIP
    ...     keras.layers.BatchNormalization().synchronized
    True
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Callable, Iterator

from mirrorkit.patching import engine

PATCH = "sync-batch-norm"


def _make_init(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind_partial(self, *args, **kwargs)
        if "synchronized" not in bound.arguments:
            kwargs["synchronized"] = True
        original(self, *args, **kwargs)

    return __init__


@contextlib.contextmanager
def synchronized_batch_norm(enabled: bool) -> Iterator[None]:
    """While the block runs, new BatchNormalization layers default to ``synchronized=True``.

    Args:
        enabled: False: nothing changes.

    Example:
        >>> import keras
        >>> with synchronized_batch_norm(True):
        ...     keras.layers.BatchNormalization().synchronized
        True
        >>> keras.layers.BatchNormalization().synchronized
        False
    """
    if not enabled:
        yield
        return
    from keras.src.layers.normalization.batch_normalization import BatchNormalization

    with engine.applied(PATCH, [(BatchNormalization, "__init__", _make_init)]):
        yield
