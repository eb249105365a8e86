"""The callback that starts each fine-tuning phase right and tags every epoch with its phase.

Placed after ``BackupAndRestore`` (which may just have restored the end of
phase 1, with its optimizer state and rate) and before ``Rollback`` (whose
saved state must be the phase's own start), see
:mod:`mirrorkit.training.finetune`.

Example:
    >>> switch = PhaseSwitch(phases)                           # doctest: +SKIP
    >>> model.fit(ds, epochs=4, callbacks=[backup, switch])     # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import Any

import keras

# Per-epoch logs kept in metrics.json's fine_tune records.
_KEPT = ("loss", "accuracy", "val_loss", "val_accuracy")


class PhaseSwitch(keras.callbacks.Callback):
    """At a phase-2 start: a fresh optimizer state at the fine-tuning rate; records each epoch's phase.

    Args:
        phases: the run's :class:`~mirrorkit.training.finetune.Phases`.
        reset: also set the phase's rate when resuming mid-phase (an
            elastic job whose batch changed: the backup holds the old rate).

    Attributes:
        phase: the phase being fitted (set before each ``fit``).
        records: ``{"epoch", "phase", "loss", ...}`` per epoch trained.

    Example:
        >>> switch = PhaseSwitch(phases); switch.phase = 2          # doctest: +SKIP
    """

    def __init__(self, phases: Any, *, reset: bool = False) -> None:
        super().__init__()
        self.phases, self.reset = phases, reset
        self.phase = 1
        self.records: list[dict[str, Any]] = []

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        first, _ = self.phases.span(self.phase)
        start = int(self.model._initial_epoch or first)
        if self.phase != 2:
            return
        optimizer = self.model.optimizer
        # Under mixed_float16 the loss scale lives on the wrapper: keep it.
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        rate = getattr(inner, "_learning_rate", None)
        if start <= first:
            # What recompiling with a new optimizer gives (Keras's guide):
            # no moments, step count 0.
            for variable in inner.variables:
                if variable is not rate:
                    variable.assign(keras.ops.zeros(variable.shape, variable.dtype))
        if (start <= first or self.reset) and isinstance(rate, keras.Variable):
            rate.assign(self.phases.fine_tune_lr)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        record: dict[str, Any] = {"epoch": epoch + 1, "phase": self.phase}
        for name in _KEPT:
            value = (logs or {}).get(name)
            if value is not None:
                value = float(value)
                record[name] = value if math.isfinite(value) else str(value)
        self.records.append(record)
