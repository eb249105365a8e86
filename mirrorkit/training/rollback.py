"""Rolling a diverging run back to its last good state, at a lower learning rate.

:class:`Rollback` keeps, in memory, a copy of the weights and optimizer
state as they were at the start of training and at the end of every epoch
(the same points the epoch backup is written). When
:class:`~mirrorkit.training.divergence.DivergenceGuard` raises,
``mirrorkit train`` asks :meth:`Rollback.prepare` for an incident and calls
``fit`` again from the saved epoch; the callback's ``on_train_begin`` then
puts the saved state back and multiplies the learning rate by ``lr_factor``.
After ``max_rollbacks`` incidents the next one stops the run, as without
rollback.

Every worker keeps its own copy (the weights are identical on all of them)
and every worker sees the same incident at the same step (see
:mod:`mirrorkit.training.divergence`), so restoring needs no communication.
The callback must come *after* ``BackupAndRestore`` in the callback list: it
overrides what that one restores from disk, which has the old learning rate.

A constant learning rate is an optimizer variable and is simply assigned; a
schedule is wrapped in :class:`~mirrorkit.training.schedules.ScaledSchedule`
and the training function retraced (a schedule is read when the step is
traced).

Example:
    >>> rollback = Rollback(max_rollbacks=2, lr_factor=0.5)
    >>> rollback.incidents
    []
"""

from __future__ import annotations

import math
from typing import Any

import keras

from mirrorkit.training.config import check_rollback


class Rollback(keras.callbacks.Callback):
    """Remember the last good state; put it back, with a lower learning rate, after an incident.

    Args:
        max_rollbacks: incidents to recover from; the next one ends the run.
            Defaults to 2.
        lr_factor: the learning rate is multiplied by this at each rollback.
            Defaults to 0.5.
        reset_lr: a constant learning rate to set once training begins, after
            a backup was restored (an elastic run whose batch changed).

    Attributes:
        incidents: one dict per rollback: ``epoch``, ``step`` (1-based, in
            that epoch), ``first_step``, ``cause`` (``nan``, ``inf`` or
            ``spike``), ``loss``, ``restored_epoch`` (epochs kept),
            ``learning_rate`` (the new rate; a schedule's at the restored step)
            and ``lr_factor`` (the total factor so far).

    Raises:
        UserInputError: ``max_rollbacks`` negative, ``lr_factor`` not in (0, 1].

    Example:
        >>> Rollback(lr_factor=2.0)
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: `rollback_lr_factor` must be above 0 and at most 1. Received: rollback_lr_factor=2.0
    """

    def __init__(self, max_rollbacks: int = 2, lr_factor: float = 0.5, *,
                 reset_lr: float | None = None) -> None:
        super().__init__()
        check_rollback(max_rollbacks, lr_factor)
        self.reset_lr = reset_lr
        self.max_rollbacks, self.lr_factor = max_rollbacks, float(lr_factor)
        self.incidents: list[dict[str, Any]] = []
        self._saved: tuple[int, list[Any], list[Any]] | None = None
        self._pending = False
        self._total = 1.0

    # -- the state ---------------------------------------------------------
    def _variables(self) -> tuple[list[Any], list[Any]]:
        optimizer = self.model.optimizer
        return list(self.model.weights), list(optimizer.variables) if optimizer else []

    def _save(self, epoch: int) -> None:
        weights, slots = self._variables()
        self._saved = (epoch, [v.numpy() for v in weights], [v.numpy() for v in slots])

    def _lr_variable(self) -> Any:
        lr = getattr(self.model.optimizer, "_learning_rate", None)
        return None if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule) else lr

    # -- Keras hooks -------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not self._pending:
            lr = self._lr_variable()
            if self.reset_lr is not None and lr is not None:
                # The backup just restored holds the rate of the old batch.
                lr.assign(self.reset_lr)
                self.reset_lr = None
            # After BackupAndRestore: a resumed run's first good state is its backup.
            self._save(int(self.model._initial_epoch or 0))
            return
        epoch, weights, slots = self._saved
        for variable, value in zip(self._variables()[0] + self._variables()[1], weights + slots):
            variable.assign(value)
        lr = self._lr_variable()
        if lr is not None:
            lr.assign(float(lr.numpy()) * self.lr_factor)
        self.model._initial_epoch = epoch
        self._pending = False

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._save(epoch + 1)

    # -- incidents ---------------------------------------------------------
    @property
    def exhausted(self) -> bool:
        """True when no rollback is left."""
        return len(self.incidents) >= self.max_rollbacks or self._saved is None

    def prepare(self, error: Any) -> dict[str, Any]:
        """Record the incident and arm the rollback the next ``fit`` performs.

        Call it with the guard's error, then call ``fit`` again with
        ``initial_epoch=incident["restored_epoch"]``.

        Returns:
            The incident (also appended to :attr:`incidents`).

        Example:
            >>> incident = rollback.prepare(error)           # doctest: +SKIP
            >>> model.fit(ds, initial_epoch=incident["restored_epoch"], ...)  # doctest: +SKIP
        """
        if self.exhausted:
            raise RuntimeError("no rollback left")
        optimizer = self.model.optimizer
        self._total *= self.lr_factor
        schedule = getattr(optimizer, "_learning_rate", None)
        epoch, _, slots = self._saved
        if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            from mirrorkit.training.schedules import ScaledSchedule

            optimizer._learning_rate = ScaledSchedule(schedule, self.lr_factor)
            # The step reads the schedule when it is traced: trace it again.
            self.model.train_function = None
            step = self._saved_value(optimizer.iterations, slots)
            new_lr = float(optimizer._learning_rate(step if step is not None else 0))
        else:
            saved = self._saved_value(schedule, slots)
            new_lr = float(saved if saved is not None else schedule.numpy()) * self.lr_factor
        value = float(error.value)
        incident = {"kind": "rollback", "rollback": len(self.incidents) + 1, "epoch": error.epoch,
                    "step": error.step, "first_step": error.first_step, "cause": error.cause,
                    "loss": value if math.isfinite(value) else str(value),
                    "restored_epoch": epoch, "learning_rate": new_lr,
                    "lr_factor": self._total}
        if getattr(error, "median", None) is not None:
            incident["median_loss"] = float(error.median)
        self.incidents.append(incident)
        self._pending = True
        return incident

    def _saved_value(self, variable: Any, slots: list[Any]) -> Any:
        for candidate, value in zip(self._variables()[1], slots):
            if candidate is variable:
                return value
        return None


def describe(incident: dict[str, Any], max_rollbacks: int) -> str:
    """The one line a rollback prints.

    Example:
        >>> describe({"rollback": 1, "epoch": 2, "step": 14, "first_step": 14, "cause": "nan",
        ...           "loss": "nan", "restored_epoch": 1, "learning_rate": 0.001,
        ...           "lr_factor": 0.5}, 2)
        'rollback 1 of 2: the loss became nan at epoch 2, step 14; back to the end of epoch 1, learning rate x0.5 -> 0.001'
    """
    where = (f"step {incident['step']}" if incident["first_step"] == incident["step"]
             else f"steps {incident['first_step']}-{incident['step']}")
    what = (f"spiked to {incident['loss']:.4g} ({incident['loss'] / incident['median_loss']:.1f}x "
            f"the recent median)" if incident["cause"] == "spike"
            else f"became {incident['loss']}")
    back = (f"the end of epoch {incident['restored_epoch']}" if incident["restored_epoch"]
            else "the start")
    return (f"rollback {incident['rollback']} of {max_rollbacks}: the loss {what} at epoch "
            f"{incident['epoch']}, {where}; back to {back}, learning rate "
            f"x{incident['lr_factor']:g} -> {incident['learning_rate']:.4g}")
