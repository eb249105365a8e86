"""Ctrl-C during training stops it, even when Python would drop it (``mirrorkit.training.interrupts``).

A ``KeyboardInterrupt`` raised while a finalizer runs (TensorFlow frees a
traced function's graph in ``__del__``) is printed and dropped by Python;
``mirrorkit train`` then trained on to its last epoch. Here SIGINT is sent
from inside a finalizer during a real Keras ``fit``: the interrupt is
recorded and ``fit`` stops at the next batch's end.
"""

from __future__ import annotations

import os
import signal

import pytest

from mirrorkit.training.interrupts import Interrupts

pytestmark = [pytest.mark.fast,
              # Python reports the interrupt it drops in a finalizer: that is the point.
              pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")]


class _SignalsWhenFreed:
    """Sends this process SIGINT from its finalizer, as a Ctrl-C landing in one would."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)


def _fit(*callbacks) -> list[int]:
    """A real Keras fit of 16 batches whose batch 1 ends with SIGINT sent from a finalizer."""
    import keras
    import numpy as np

    batches = []

    class Step(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            batches.append(batch)
            if batch == 1:
                _SignalsWhenFreed()   # freed at once: the interrupt is raised in __del__

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    try:
        model.fit(np.ones((64, 3)), np.ones((64, 1)), batch_size=4, epochs=1, verbose=0,
                  callbacks=[Step(), *callbacks])
    except KeyboardInterrupt:
        batches.append("interrupted")
    return batches


def test_an_interrupt_swallowed_by_a_finalizer_stops_fit_at_the_next_batch():
    interrupts = Interrupts()
    with interrupts:
        batches = _fit(interrupts.callback())
    # Recorded at batch 1 (Python dropped it there), raised by the check after it.
    assert interrupts.pending and batches == [0, 1, "interrupted"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_it_python_drops_the_interrupt_and_training_goes_on():
    # The control: the same finalizer with Python's own handler only.
    assert _fit() == list(range(16))


def test_a_handler_someone_else_installed_is_left_alone():
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with Interrupts() as interrupts:
            os.kill(os.getpid(), signal.SIGINT)
        assert seen == [signal.SIGINT] and not interrupts.pending
    finally:
        signal.signal(signal.SIGINT, previous)
