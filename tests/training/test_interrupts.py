"""Ctrl-C during training stops it, even when Python would drop it (``mirrorkit.training.interrupts``).

A ``KeyboardInterrupt`` raised while a finalizer runs (TensorFlow frees a
traced function's graph in ``__del__``) is printed and dropped by Python;
``mirrorkit train`` then trained on to its last epoch. Here SIGINT is sent
from inside a finalizer during a real Keras ``fit``: the interrupt is
recorded and ``fit`` stops at the next batch's end.
"""

from __future__ import annotations

import signal
import sys

import pytest

from mirrorkit.training.interrupts import Interrupts

pytestmark = pytest.mark.fast


class _SignalsWhenFreed:
    """Sends this process SIGINT from its finalizer, as a Ctrl-C landing in one would."""

    def __del__(self) -> None:
        # raise_signal, not os.kill(os.getpid()): it goes to this thread and Python runs
        # the handler before the call returns, so the interrupt is raised in this
        # finalizer. A process-wide kill may be taken by any of TensorFlow's threads and
        # handled wherever the main thread next checks, maybe after the finalizer.
        signal.raise_signal(signal.SIGINT)


@pytest.fixture
def dropped(monkeypatch):
    """Python's own SIGINT handler for the test; what Python drops in the finalizer, by type.

    Python installs ``default_int_handler`` at start-up only if SIGINT is not
    ignored, and a pytest started with it ignored (a background job of a
    non-interactive shell: ``bash .ci/run &`` in a script) inherits that.
    ``Interrupts`` then leaves it alone, as it must any handler it did not
    install, the signal does nothing and ``fit`` runs to its end: the handler
    is set here, not inherited.
    """
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    seen: list[type] = []
    report = sys.unraisablehook

    def hook(unraisable) -> None:
        # Python hands what it drops in a finalizer to this hook; others' go on to pytest's.
        if unraisable.object is _SignalsWhenFreed.__del__:
            seen.append(unraisable.exc_type)
        else:
            report(unraisable)

    monkeypatch.setattr(sys, "unraisablehook", hook)
    yield seen
    signal.signal(signal.SIGINT, previous)


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


def test_an_interrupt_swallowed_by_a_finalizer_stops_fit_at_the_next_batch(dropped):
    interrupts = Interrupts()
    with interrupts:
        batches = _fit(interrupts.callback())
    # Recorded at batch 1 (Python dropped it there), raised by the check after it.
    assert dropped == [KeyboardInterrupt]
    assert interrupts.pending and batches == [0, 1, "interrupted"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_it_python_drops_the_interrupt_and_training_goes_on(dropped):
    # The control: the same finalizer with Python's own handler only.
    assert _fit() == list(range(16)) and dropped == [KeyboardInterrupt]


def test_a_handler_someone_else_installed_is_left_alone():
    seen = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with Interrupts() as interrupts:
            signal.raise_signal(signal.SIGINT)   # handled before it returns (see above)
        assert seen == [signal.SIGINT] and not interrupts.pending
    finally:
        signal.signal(signal.SIGINT, previous)
