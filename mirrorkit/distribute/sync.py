"""Are the workers' weights still identical? One collective to find out.

Data-parallel training keeps one copy of the weights per worker and relies on
every all-reduce landing the same on all of them. A worker that diverges (a
non-deterministic op in a custom step, a variable updated outside the
strategy, a bug) trains on silently; the chief's saved model then tells
nothing about the others. :func:`weights_in_sync` compares a checksum of
every weight of every worker, bit for bit.

Example:
    >>> report = weights_in_sync(model, strategy)      # doctest: +SKIP
    >>> report                                         # doctest: +SKIP
    {'workers': 2, 'identical': True, 'differing_workers': []}
"""

from __future__ import annotations

import zlib
from typing import Any, Sequence


def checksums(weights: Sequence[Any]) -> list[int]:
    """CRC-32 of each array's bytes (equal arrays, equal checksums).

    Example:
        >>> import numpy as np
        >>> checksums([np.zeros(2, "float32")]) == checksums([np.zeros(2, "float32")])
        True
    """
    import numpy as np

    return [zlib.crc32(np.ascontiguousarray(w).tobytes()) for w in weights]


def compare(rows: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Compare per-worker checksum rows with the chief's (row 0).

    Example:
        >>> compare([[1, 2], [1, 2], [1, 3]])
        {'workers': 3, 'identical': False, 'differing_workers': [2]}
    """
    first = list(rows[0])
    differing = [i for i, row in enumerate(rows) if list(row) != first]
    return {"workers": len(rows), "identical": not differing, "differing_workers": differing}


def weights_in_sync(model: Any, strategy: Any = None) -> dict[str, Any]:
    """Check that every worker holds bit-identical weights; a collective every worker must call.

    Under ``MultiWorkerMirroredStrategy`` each worker contributes the
    checksums of its ``model.get_weights()`` and all of them are gathered,
    so every worker gets the same report. Under one worker (any other
    strategy) the report covers that worker alone: mirrored variables are
    kept identical across local replicas by construction.

    Args:
        model: a built Keras model.
        strategy: its strategy. Defaults to ``tf.distribute.get_strategy()``.

    Returns:
        ``{"workers": N, "identical": bool, "differing_workers": [task indexes
        whose weights differ from task 0's]}``.

    Example:
        >>> weights_in_sync(model, strategy)["identical"]     # doctest: +SKIP
        True
    """
    import tensorflow as tf

    strategy = strategy or tf.distribute.get_strategy()
    return compare(gather_per_worker(checksums(model.get_weights()), strategy, "int64"))


def gather_per_worker(values: Sequence[float], strategy: Any = None,
                      dtype: str = "float64") -> list[list[Any]]:
    """Every worker's ``values``, in worker order; a collective every worker must call.

    Under ``MultiWorkerMirroredStrategy`` one all-gather brings each worker's
    row to all of them (row 0 is the chief's). Under any other strategy there
    is one worker and the result is ``[values]``. All workers must pass the
    same number of values.

    Args:
        values: this worker's numbers.
        strategy: defaults to ``tf.distribute.get_strategy()``.
        dtype: how they travel (``"int64"`` keeps checksums exact).

    Example:
        >>> gather_per_worker([0.021], strategy)       # doctest: +SKIP
        [[0.021], [0.038]]
    """
    import numpy as np
    import tensorflow as tf

    from mirrorkit.distribute.strategy import describe

    strategy = strategy or tf.distribute.get_strategy()
    mine = list(values)
    workers = describe(strategy).workers
    if workers < 2:
        return [mine]
    gathered = _gather_function(strategy)(tf.constant(mine, dtype=dtype)).numpy()
    # One row per replica; replicas of one worker are consecutive and alike.
    per_worker = gathered.reshape(workers, -1, len(mine))[:, 0, :]
    return np.asarray(per_worker).tolist()


# One traced all-gather per strategy, called every epoch: a tf.function made
# anew per call is traced anew each time (and TensorFlow warns about the
# retracing after five). A process has one strategy or a few (tests), and the
# function holds its strategy anyway, so the strategies stay as long as this.
_GATHERS: dict[Any, Any] = {}


def _gather_function(strategy: Any) -> Any:
    """The all-gather of a 1-D tensor over ``strategy``'s replicas, traced once per shape."""
    import tensorflow as tf

    found = _GATHERS.get(strategy)
    if found is None:
        @tf.function  # eager collectives are slow and TensorFlow warns about them
        def found(local: Any) -> Any:
            return strategy.gather(strategy.run(tf.identity, args=(local,)), axis=0)

        _GATHERS[strategy] = found
    return found
