"""Ctrl-C during training stops it, even when it lands in a finalizer.

Python raises ``KeyboardInterrupt`` in whatever code runs when SIGINT
arrives. When that is an object's ``__del__`` (TensorFlow frees a traced
function's graph there, often, between steps), Python prints "Exception
ignored in ..." and drops the exception: training goes on as if the key had
not been pressed. Measured: ``mirrorkit train --simulate-cpus 2 --epochs 50``
sent SIGINT 15 s in printed that traceback during epoch 25 and trained to
epoch 50.

:class:`Interrupts` handles SIGINT while ``fit`` runs: the handler records
the interrupt and raises ``KeyboardInterrupt`` as Python's own does, and its
callback raises it again at the next batch's end if it was swallowed. Only
Python's default handler is replaced (a handler someone else installed, and
any thread but the main one, are left alone), and it is put back afterwards.

Example:
    >>> interrupts = Interrupts()
    >>> with interrupts:
    ...     interrupts.pending
    False
"""

from __future__ import annotations

import signal
import threading
from typing import Any


class Interrupts:
    """SIGINT recorded and re-raised at a batch's end while ``fit`` runs (see the module).

    Example:
        >>> interrupts = Interrupts()
        >>> with interrupts:                                   # doctest: +SKIP
        ...     model.fit(data, callbacks=[interrupts.callback()])
    """

    def __init__(self) -> None:
        self.pending = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        self.pending = True
        raise KeyboardInterrupt

    def __enter__(self) -> "Interrupts":
        self.pending = False
        if threading.current_thread() is threading.main_thread() \
                and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if an interrupt was recorded (and so swallowed).

        Example:
            >>> Interrupts().check()
        """
        if self.pending:
            raise KeyboardInterrupt

    def callback(self) -> Any:
        """A Keras callback that calls :meth:`check` after every batch and epoch.

        Example:
            >>> callback = Interrupts().callback()             # doctest: +SKIP
        """
        import keras

        check = self.check

        class InterruptCheck(keras.callbacks.Callback):
            def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
                check()

            def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
                check()

            def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
                check()

        return InterruptCheck()
