"""Behavioural probes: does the installed Keras still have a bug, on this strategy?

Each probe runs the smallest ``fit`` that shows its bug, with Keras's own
(unpatched) code, and answers True (the bug showed, with its known error),
False (it trained), or None (cannot tell here: too few replicas, several
workers, or a different failure). They are used only for Keras versions
outside the tested range (:mod:`mirrorkit.compat.fix`), once per process.
Models use zero initialisers and no shuffling, so a probe never draws from
Keras's global random state: a script's own seeds give the same numbers with
or without it.

Example:
    >>> import mirrorkit                                         # doctest: +SKIP
    >>> uneven_global_batch(mirrorkit.get_strategy(simulate_cpus=2))  # doctest: +SKIP
    True
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from mirrorkit.strategy_facts import in_multi_worker_mode, replicas

logger = logging.getLogger(__name__)


def _local_replicas(strategy: Any) -> int:
    if strategy is None or in_multi_worker_mode(strategy):
        return 0  # across workers a probe would need every worker to run it in step
    return replicas(strategy)


def _fit(strategy: Any, examples: int, batch: int, steps_per_execution: int,
         markers: tuple[str, ...]) -> bool | None:
    import keras
    import numpy as np

    x = np.ones((examples, 2), "float32")
    y = np.zeros((examples, 1), "float32")
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)),
                                  keras.layers.Dense(1, kernel_initializer="zeros")])
        model.compile("sgd", "mse", steps_per_execution=steps_per_execution)
    try:
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)
    except Exception as err:  # noqa: BLE001 -- a probe reports, it never raises
        text = str(err)
        if any(m in text for m in markers):
            return True
        logger.info("mirrorkit.compat probe: unexpected %s (%s); undecided",
                    type(err).__name__, text.splitlines()[0] if text else "")
        return None
    return False


def _probe(strategy: Any, sizes: Callable[[int], tuple[int, int]], steps_per_execution: int,
           markers: tuple[str, ...]) -> bool | None:
    n = _local_replicas(strategy)
    if n < 2:
        return None
    examples, batch = sizes(n)
    return _fit(strategy, examples, batch, steps_per_execution, markers)


def uneven_global_batch(strategy: Any) -> bool | None:
    """``symbolic-build`` (keras#20585): does a global batch of replicas + 1 fail to fit?

    Example:
        >>> uneven_global_batch(None) is None
        True
    """
    return _probe(strategy, lambda n: (n + 1, n + 1), 1,
                  ("must have the same size and shape", "Attempt to convert a value (PerReplica"))


def several_steps_per_call(strategy: Any) -> bool | None:
    """``multi-step`` (keras#19246): does ``steps_per_execution=2`` fail to fit?

    Example:
        >>> several_steps_per_call(None) is None
        True
    """
    return _probe(strategy, lambda n: (4 * n, 2 * n), 2,
                  ("You must feed a value for placeholder tensor",))
