"""The ``replica-global-seed`` fix: a seedless ``keras.random`` draw in a replica's step works.

``keras.random.normal(shape)`` with no ``seed`` draws from Keras's global
``SeedGenerator``, which Keras keeps in thread-local state
(``keras.src.backend.common.global_state``) and creates on first use.
``tf.distribute.MirroredStrategy`` (and ``MultiWorkerMirroredStrategy``) runs
each replica's step in a thread of its own, started anew for every trace, so
every replica thread of every trace finds no generator and makes one: its
variable is then created on the step function's second trace, and
TensorFlow stops the step with "tf.function only supports singleton
tf.Variables created on the first call". Measured: a ``train_step`` that
draws ``keras.random.normal(shape=(batch, 3))`` without a seed (as keras.io's
GAN and WGAN-GP examples draw their latent vectors once ``tf.random.normal``
is swapped for Keras's) fails under ``MirroredStrategy`` on 2 devices and
under ``mirrorkit run`` / ``launch``, and trains on one device (TensorFlow
2.21, Keras 3.15).

The fix gives a replica thread the global generator of the thread that
started it (the one the script's code runs in), creating it there on first
use: one generator per process, created where and when one device creates
it and advanced once per draw. With ``replica-random`` every replica then
takes its rows of the draw one device makes, so the numbers are plain
Python's.

Example:
    >>> from keras.src.random import seed_generator                  # doctest: +SKIP
    >>> patched = make_generator(seed_generator.global_seed_generator)  # doctest: +SKIP
"""

from __future__ import annotations

import threading
from typing import Any, Callable

# The attribute a replica thread keeps its starter's Keras global state under.
_STARTER = "_mirrorkit_keras_state"


def make_thread_init(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``_MirroredReplicaThread.__init__``: remember the starting thread's Keras state.

    ``__init__`` runs in the thread that starts the replicas, so the state
    read here is that thread's (a ``threading.local``'s ``__dict__`` is the
    calling thread's own).

    Example:
        >>> from tensorflow.python.distribute import mirrored_run        # doctest: +SKIP
        >>> init = mirrored_run._MirroredReplicaThread.__init__          # doctest: +SKIP
        >>> patched = make_thread_init(init)                             # doctest: +SKIP
    """

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        from keras.src.backend.common import global_state

        starter = getattr(threading.current_thread(), _STARTER, None)
        # A thread started from a replica thread shares that one's starter.
        setattr(self, _STARTER, starter if starter is not None
                else global_state.GLOBAL_STATE_TRACKER.__dict__)

    return __init__


def make_generator(original: Callable[[], Any]) -> Callable[[], Any]:
    """Wrap Keras's ``global_seed_generator``: a replica thread uses its starter's.

    Example:
        >>> from keras.src.random import seed_generator                  # doctest: +SKIP
        >>> patched = make_generator(seed_generator.global_seed_generator)  # doctest: +SKIP
    """

    def global_seed_generator() -> Any:
        starter = getattr(threading.current_thread(), _STARTER, None)
        if starter is None:
            return original()
        from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR

        generator = starter.get(GLOBAL_SEED_GENERATOR)
        if generator is None:
            # Made here, as one device makes it inside its step, and kept
            # where the script's thread and the next trace's replicas find it.
            generator = original()
            starter[GLOBAL_SEED_GENERATOR] = generator
        return generator

    return global_seed_generator
