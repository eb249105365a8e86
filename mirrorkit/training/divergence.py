"""Seeing divergence as it happens: a NaN/inf loss, or a loss that spikes far above its recent median.

:class:`DivergenceGuard` reads the loss Keras reports after every
``tf.function`` call and raises :class:`LossSpikeError` (a spike) or
:class:`~mirrorkit.training.metering.NonFiniteLossError` (NaN/inf) from the
step itself, before any end-of-epoch callback can save the broken weights.
``mirrorkit train`` catches both and rolls back
(:mod:`mirrorkit.training.rollback`).

Keras logs the epoch's *running mean* loss, in which a spike drowns; the
guard recovers each call's own mean loss from two consecutive running means
(``(m_n N_n - m_{n-1} N_{n-1}) / (N_n - N_{n-1})``, N = steps so far) and
compares it with the median of the last ``window`` calls.

**The decision is the same on every worker and replica at the same step.**
The logged loss is the all-reduced mean over every replica of every worker
(one value, sent to all of them), and the guard is a deterministic function
of that sequence, so every worker raises at the same call with no extra
communication.

Example:
    >>> guard = DivergenceGuard(spike_factor=10.0)
    >>> guard.spike_factor
    10.0
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

from mirrorkit.errors import UserInputError
from mirrorkit.training.metering import NonFiniteLossError, NonFiniteLossGuard

# Calls of history needed before a spike can be called one: the first calls
# of a run fall fast, and a median of two says little.
MIN_HISTORY = 5


class LossSpikeError(NonFiniteLossError):
    """The loss of one call rose above ``factor`` times the median of the recent calls.

    Attributes:
        median: the median loss of the recent calls it was compared with.
        factor: the spike factor in force.
        (and those of :class:`~mirrorkit.training.metering.NonFiniteLossError`)

    Example:
        >>> str(LossSpikeError(2, 14, 41.2, 1, median=3.3, factor=10.0))
        'the loss spiked to 41.2 (12.5x the median 3.3 of the recent steps) at epoch 2, step 14'
    """

    def __init__(self, epoch: int, step: int, value: float, last_good_epoch: int, *,
                 median: float, factor: float, first_step: int | None = None) -> None:
        super().__init__(epoch, step, value, last_good_epoch, first_step=first_step)
        self.median, self.factor, self.cause = median, factor, "spike"
        self.args = (f"the loss spiked to {value:.4g} ({value / median:.1f}x the median "
                     f"{median:.4g} of the recent steps) at {self.where}",)


class DivergenceGuard(NonFiniteLossGuard):
    """Raise at the first NaN/inf loss or, with ``spike_factor``, the first loss spike.

    Args:
        spike_factor: a call whose mean loss exceeds this many times the
            median of the last ``window`` calls is a spike. ``None`` (default)
            watches for NaN/inf only: how far a loss may jump depends on the
            model and the data, so a threshold is the user's choice.
        window: how many recent calls the median covers. Defaults to 20.

    Raises:
        UserInputError: ``spike_factor`` not above 1, or ``window`` below 1.

    Example:
        >>> DivergenceGuard(spike_factor=0.5)
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: `spike_factor` must be a number above 1. Received: spike_factor=0.5
    """

    def __init__(self, spike_factor: float | None = None, window: int = 20) -> None:
        super().__init__()
        if spike_factor is not None and (isinstance(spike_factor, bool)
                                         or not isinstance(spike_factor, (int, float))
                                         or not 1 < spike_factor < math.inf):
            raise UserInputError(f"`spike_factor` must be a number above 1. "
                                 f"Received: spike_factor={spike_factor!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise UserInputError(
                f"`window` must be a positive integer. Received: window={window!r}")
        self.spike_factor = float(spike_factor) if spike_factor is not None else None
        self._recent: deque[float] = deque(maxlen=window)
        self._mean, self._count = 0.0, 0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        # A rolled-back run starts a fresh history: the losses before the
        # incident are no baseline for the state it returned to.
        self._recent.clear()

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_begin(epoch, logs)
        self._mean, self._count = 0.0, 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        first = self._last_end + 2
        super().on_train_batch_end(batch, logs)  # NaN/inf first
        loss = (logs or {}).get("loss")
        if loss is None or self.spike_factor is None:
            return
        mean, count = float(loss), batch + 1
        call_loss = ((mean * count - self._mean * self._count) / (count - self._count)
                     if count > self._count else mean)
        self._mean, self._count = mean, count
        if len(self._recent) >= MIN_HISTORY:
            median = statistics.median(self._recent)
            if median > 0 and call_loss > self.spike_factor * median:
                raise LossSpikeError(self._epoch + 1, batch + 1, call_loss, self.last_good_epoch,
                                     median=median, factor=self.spike_factor,
                                     first_step=first)
        self._recent.append(call_loss)
