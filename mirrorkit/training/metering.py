"""Callbacks that watch the training loop: a throughput meter and a non-finite-loss guard.

:class:`ThroughputMeter` measures images per second per epoch, over all
replicas and per replica, and adds both to the epoch logs (so
``History``, ``CSVLogger`` and TensorBoard record them).
:class:`NonFiniteLossGuard` stops training at the first step whose loss is
NaN or infinite, naming the epoch and step, before the end-of-epoch
callbacks could overwrite the last good backup with broken weights.

This module imports Keras; ``import mirrorkit`` does not import it.

Example:
    >>> meter = ThroughputMeter(global_batch=256, replicas=8, report=print)  # doctest: +SKIP
    >>> model.fit(ds, epochs=3, callbacks=[NonFiniteLossGuard(), meter])     # doctest: +SKIP
    epoch 1/3: 5,120 images/s (640 per replica)
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable

import keras

from mirrorkit.errors import UserInputError


class ThroughputMeter(keras.callbacks.Callback):
    """Measure training images per second, total and per replica, every epoch.

    The time of an epoch runs from its start to the end of its last training
    step: validation and end-of-epoch callbacks (checkpoints) are excluded.
    The first epoch includes graph tracing, so :attr:`images_per_second`
    averages the later epochs when there are any.

    Adds ``images_per_second`` and ``images_per_second_per_replica`` to the
    epoch logs; place it before ``CSVLogger``/``TensorBoard`` so they record
    them.

    Args:
        global_batch: examples per step over all replicas.
        replicas: replicas in sync.
        report: called with one line per epoch, e.g. ``print``. Defaults to
            None (no line).

    Example:
        >>> meter = ThroughputMeter(global_batch=64, replicas=2)
        >>> meter.images_per_second is None
        True
    """

    def __init__(self, global_batch: int, replicas: int, *,
                 report: Callable[[str], Any] | None = None) -> None:
        super().__init__()
        for name, value in (("global_batch", global_batch), ("replicas", replicas)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserInputError(
                    f"`{name}` must be a positive integer. Received: {name}={value!r}")
        self.global_batch = global_batch
        self.replicas = replicas
        self.report = report
        self.rates: list[float] = []
        self._start = 0.0
        self._last = 0.0
        self._steps = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._start = self._last = time.perf_counter()
        self._steps = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # ``batch`` is the step index within the epoch (the last step of an
        # execution when steps_per_execution > 1), so steps = batch + 1.
        self._steps = batch + 1
        self._last = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        elapsed = self._last - self._start
        if self._steps == 0 or elapsed <= 0:
            return
        rate = self._steps * self.global_batch / elapsed
        self.rates.append(rate)
        if logs is not None:
            logs["images_per_second"] = rate
            logs["images_per_second_per_replica"] = rate / self.replicas
        if self.report is not None:
            total = self.params.get("epochs") if self.params else None
            of = f"/{total}" if total else ""
            self.report(f"epoch {epoch + 1}{of}: {rate:,.0f} images/s "
                        f"({rate / self.replicas:,.0f} per replica, {self.replicas} "
                        f"replica{'s' if self.replicas != 1 else ''})")

    @property
    def images_per_second(self) -> float | None:
        """Mean over the measured epochs, leaving out the first when there are more.

        Example:
            >>> meter = ThroughputMeter(64, 2)
            >>> meter.rates = [100.0, 300.0, 500.0]
            >>> meter.images_per_second
            400.0
        """
        rates = self.rates[1:] if len(self.rates) > 1 else self.rates
        return sum(rates) / len(rates) if rates else None


class NonFiniteLossError(RuntimeError):
    """Raised by :class:`NonFiniteLossGuard`: the loss became NaN or infinite.

    Attributes:
        epoch: 1-based epoch of the bad step.
        step: 1-based step within that epoch (the last step of the
            ``tf.function`` call that produced it).
        first_step: with several steps per call, the call's first step: the
            loss turned bad somewhere in ``first_step..step``. Else ``step``.
        value: the loss value seen (``nan``, ``inf`` or ``-inf``).
        cause: ``"nan"`` or ``"inf"`` (``"spike"`` for
            :class:`~mirrorkit.training.divergence.LossSpikeError`).
        last_good_epoch: the last epoch that finished with a finite loss (0 if none).

    Example:
        >>> str(NonFiniteLossError(epoch=2, step=3, value=float("nan"), last_good_epoch=1))
        'the loss became nan at epoch 2, step 3'
        >>> str(NonFiniteLossError(2, 22, float("inf"), 1, first_step=12))
        'the loss became inf at epoch 2, in steps 12-22 (one tf.function call)'
    """

    def __init__(self, epoch: int, step: int, value: float, last_good_epoch: int,
                 first_step: int | None = None) -> None:
        self.epoch, self.step, self.value = epoch, step, value
        self.cause = "nan" if math.isnan(value) else "inf"
        self.first_step = step if first_step is None else first_step
        self.last_good_epoch = last_good_epoch
        # "epoch 2, step 3": also what LossSpikeError's message ends with.
        self.where = f"epoch {epoch}, " + (
            f"step {step}" if self.first_step == step else
            f"in steps {self.first_step}-{step} (one tf.function call)")
        super().__init__(f"the loss became {value} at {self.where}")


class NonFiniteLossGuard(keras.callbacks.Callback):
    """Stop training at the first NaN or infinite loss, naming the epoch and step.

    Unlike ``keras.callbacks.TerminateOnNaN`` (which sets ``stop_training``,
    so Keras still runs the end-of-epoch callbacks and a backup or checkpoint
    callback would save the broken weights over the last good ones), this
    raises :class:`NonFiniteLossError` from the step itself: no later callback
    of that epoch runs, and the last backup stays the last good one.

    Example:
        >>> guard = NonFiniteLossGuard()
        >>> guard.last_good_epoch
        0
    """

    def __init__(self) -> None:
        super().__init__()
        self._epoch = 0
        self._last_end = -1
        self.last_good_epoch = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._last_end = -1

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        value = float(loss)
        first, self._last_end = self._last_end + 2, batch
        if not math.isfinite(value):
            raise NonFiniteLossError(self._epoch + 1, batch + 1, value, self.last_good_epoch,
                                     first_step=first)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.last_good_epoch = epoch + 1
