"""``mirrorkit run``: one line when the script's optimizer updates outside every replica.

A custom training loop that calls its step directly (``train_step(batch)``,
as the TensorFlow DCGAN tutorial does) rather than through ``fit`` or
``strategy.run`` trains on one device: inside mirrorkit's scope the model's
variables are mirrored, the step runs once on the first device and its update
is written to every copy. The numbers are plain Python's, but N-1 replicas
stand idle, and nothing says so. The first optimizer update made in the
cross-replica context of a strategy with 2+ replicas logs one line naming
the cure; training is unchanged. (A loop that reduces ``strategy.run``'s
gradients itself and applies them at the top level is distributed: the line
says so too.)

Example:
    >>> with one_replica_steps(2):                                # doctest: +SKIP
    ...     optimizer.apply_gradients(zip(grads, model.trainable_variables))
    mirrorkit run: an optimizer update ran outside fit and strategy.run ...
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Iterator

from mirrorkit.patching import engine

PATCH = "one-replica-step-notice"

logger = logging.getLogger(__name__)


def _make_apply(replicas: int, told: list[bool]) -> Callable[[Callable[..., Any]],
                                                             Callable[..., Any]]:
    def make(original: Callable[..., Any]) -> Callable[..., Any]:
        def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
            if not told:
                import tensorflow as tf

                if tf.distribute.in_cross_replica_context() and \
                        tf.distribute.get_strategy().num_replicas_in_sync > 1:
                    told.append(True)
                    logger.warning(
                        "an optimizer update ran outside fit and strategy.run: that "
                        "step runs on one of the %d replicas (the numbers are one "
                        "device's). Call it as strategy.run(step, args=(batch,)) to "
                        "use them all, unless its gradients are already summed over "
                        "the replicas.", replicas)
            return original(self, grads, trainable_variables)

        return apply

    return make


@contextlib.contextmanager
def one_replica_steps(replicas: int) -> Iterator[None]:
    """While the block runs, say once when an optimizer update runs outside every replica.

    Args:
        replicas: the strategy's replicas; with 1 nothing is installed.

    Example:
        >>> with one_replica_steps(1):
        ...     pass
    """
    if replicas < 2:
        yield
        return
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    with engine.applied(PATCH, [(BaseOptimizer, "apply", _make_apply(replicas, []))]):
        yield
