"""Learning-rate scaling for bigger global batches, and gradual warmup.

With N replicas the global batch is N times larger than on one device, so each
step averages over more examples and there are N times fewer steps per epoch.
Goyal et al. 2017 ("Accurate, Large Minibatch SGD") keep accuracy by scaling
the learning rate linearly with the batch (:func:`scale_learning_rate`) and
ramping up to it over the first epochs (:class:`WarmupSchedule`), because the
scaled rate is too large while the weights still change fast.

This module imports Keras (the schedule must be registered for saving), so
``import mirrorkit`` does not import it; ``mirrorkit.WarmupSchedule`` and
``mirrorkit.scale_learning_rate`` load it on first use. Import it before
``keras.models.load_model`` of a model compiled with :class:`WarmupSchedule`.

Example:
    >>> lr = scale_learning_rate(0.1, base_batch=256, global_batch=1024)
    >>> round(lr, 6)
    0.4
    >>> schedule = WarmupSchedule(lr, warmup_steps=500)
    >>> [round(float(schedule(step)), 6) for step in (0, 250, 900)]
    [0.0, 0.2, 0.4]
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import keras

from mirrorkit._checks import check_positive_int
from mirrorkit.errors import UserInputError

_RULES = ("linear", "sqrt", "none")


def _positive_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise UserInputError(f"`{name}` must be a positive number. Received: {name}={value!r}")
    return float(value)


def scale_learning_rate(base_lr: float, base_batch: int, global_batch: int,
                        rule: str = "linear") -> float:
    """Scale a learning rate tuned for ``base_batch`` to ``global_batch``.

    Args:
        base_lr: the learning rate that works at ``base_batch``.
        base_batch: the batch size ``base_lr`` was tuned for.
        global_batch: the batch of one step over all replicas.
        rule: ``"linear"`` (Goyal et al. 2017: ``base_lr * global/base``, for
            SGD), ``"sqrt"`` (``base_lr * sqrt(global/base)``, often better for
            Adam-like optimizers) or ``"none"`` (keep ``base_lr``).

    Returns:
        The scaled learning rate.

    Raises:
        UserInputError: for an unknown rule or a non-positive number.

    Example:
        >>> scale_learning_rate(0.1, 256, 512)
        0.2
        >>> scale_learning_rate(1e-3, 32, 128, rule="sqrt")
        0.002
    """
    if rule not in _RULES:
        raise UserInputError(
            f"Unknown learning-rate scaling rule. Received: rule={rule!r}; "
            f"accepted: {', '.join(_RULES)}"
        )
    base_lr = _positive_number("base_lr", base_lr)
    ratio = _positive_number("global_batch", global_batch) / _positive_number("base_batch",
                                                                             base_batch)
    if rule == "linear":
        return base_lr * ratio
    if rule == "sqrt":
        return base_lr * math.sqrt(ratio)
    return base_lr


@keras.saving.register_keras_serializable(package="mirrorkit")
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from ``initial_lr`` to a target, then a constant or a schedule.

    For ``step < warmup_steps`` the rate is
    ``initial_lr + (target - initial_lr) * step / warmup_steps``, where the
    target is where ``schedule`` continues, so the curve has no jump. After
    warmup:

    - ``schedule`` a float: that constant.
    - ``schedule`` a LearningRateSchedule with ``offset=True`` (default):
      ``schedule(step - warmup_steps)`` -- the wrapped schedule starts after the
      warmup and keeps its whole shape (as Keras ``CosineDecay`` does with its
      own warmup). Target = ``schedule(0)``.
    - with ``offset=False``: ``schedule(step)`` -- the wrapped schedule runs on
      the absolute step (Goyal et al.'s step decay at fixed epochs 30/60/80),
      warmup replaces its first ``warmup_steps``. Target = ``schedule(warmup_steps)``.

    Args:
        schedule: the rate after warmup: a float or a
            ``keras.optimizers.schedules.LearningRateSchedule``.
        warmup_steps: optimizer steps of warmup, e.g. ``5 * steps_per_epoch``.
            0 disables the warmup.
        initial_lr: the rate at step 0. Defaults to 0. Goyal et al. start at the
            unscaled rate: pass ``initial_lr=base_lr``.
        offset: whether the wrapped schedule starts counting after the warmup.
            Defaults to True.
        steps_per_update: batches per optimizer step. Keras evaluates a
            schedule on every batch, also with ``gradient_accumulation_steps=K``
            (its documented behaviour); pass K to count ``warmup_steps`` and
            the wrapped schedule in optimizer steps. Defaults to 1.

    Raises:
        UserInputError: for a negative or non-integer ``warmup_steps``, a negative
            ``initial_lr``, or a ``schedule`` that is neither a number nor a
            LearningRateSchedule.

    Example:
        >>> decay = keras.optimizers.schedules.CosineDecay(0.4, decay_steps=10_000)
        >>> schedule = WarmupSchedule(decay, warmup_steps=500, initial_lr=0.1)
        >>> optimizer = keras.optimizers.SGD(learning_rate=schedule, momentum=0.9)
        >>> round(float(schedule(250)), 6)
        0.25
    """

    def __init__(self, schedule: float | keras.optimizers.schedules.LearningRateSchedule,
                 warmup_steps: int, *, initial_lr: float = 0.0, offset: bool = True,
                 steps_per_update: int = 1, name: str = "WarmupSchedule") -> None:
        super().__init__()
        if isinstance(schedule, dict):
            # A nested config, as get_config writes it.
            schedule = keras.optimizers.schedules.deserialize(schedule)
        is_schedule = isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule)
        if not is_schedule and (isinstance(schedule, bool)
                                or not isinstance(schedule, numbers.Real) or schedule < 0):
            raise UserInputError(
                "`schedule` must be a non-negative learning rate or a keras "
                f"LearningRateSchedule. Received: schedule={schedule!r}"
            )
        if (isinstance(warmup_steps, bool) or not isinstance(warmup_steps, numbers.Integral)
                or warmup_steps < 0):
            raise UserInputError(
                f"`warmup_steps` must be a non-negative integer. Received: "
                f"warmup_steps={warmup_steps!r}"
            )
        if isinstance(initial_lr, bool) or not isinstance(initial_lr, numbers.Real) or initial_lr < 0:
            raise UserInputError(
                f"`initial_lr` must be a non-negative number. Received: initial_lr={initial_lr!r}"
            )
        self.schedule = schedule if is_schedule else float(schedule)
        self.warmup_steps = int(warmup_steps)
        self.initial_lr = float(initial_lr)
        self.offset = bool(offset)
        self.steps_per_update = check_positive_int("steps_per_update", steps_per_update)
        self.name = name

    def _after(self, step: Any) -> Any:
        if not isinstance(self.schedule, keras.optimizers.schedules.LearningRateSchedule):
            return keras.ops.convert_to_tensor(self.schedule, "float32")
        if self.offset:
            # Clamped: wrapped schedules need not be defined for negative steps.
            step = keras.ops.maximum(step - self.warmup_steps, 0.0)
        return keras.ops.cast(self.schedule(step), "float32")

    def __call__(self, step: Any) -> Any:
        step = keras.ops.cast(step, "float32")
        if self.steps_per_update > 1:
            step = keras.ops.floor(step / self.steps_per_update)
        after = self._after(step)
        if self.warmup_steps == 0:
            return after
        if isinstance(self.schedule, keras.optimizers.schedules.LearningRateSchedule):
            target = keras.ops.cast(
                self.schedule(0.0 if self.offset else float(self.warmup_steps)), "float32")
        else:
            target = after
        ramp = self.initial_lr + (target - self.initial_lr) * (step / self.warmup_steps)
        return keras.ops.where(step < self.warmup_steps, ramp, after)

    def get_config(self) -> dict[str, Any]:
        """Return the constructor arguments; a wrapped schedule is serialised.

        Example:
            >>> WarmupSchedule(0.1, 10).get_config()["warmup_steps"]
            10
        """
        schedule = self.schedule
        if isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            schedule = keras.optimizers.schedules.serialize(schedule)
        return {"schedule": schedule, "warmup_steps": self.warmup_steps,
                "initial_lr": self.initial_lr, "offset": self.offset,
                "steps_per_update": self.steps_per_update, "name": self.name}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "WarmupSchedule":
        """Rebuild from :meth:`get_config` output (wrapped schedule included).

        Example:
            >>> s = WarmupSchedule(0.1, 10)
            >>> WarmupSchedule.from_config(s.get_config()).warmup_steps
            10
        """
        config = dict(config)
        schedule = config.pop("schedule")
        warmup_steps = config.pop("warmup_steps")
        return cls(schedule, warmup_steps, **config)


@keras.saving.register_keras_serializable(package="mirrorkit")
class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Another schedule's rate times a constant factor (what a rollback's lower rate is).

    ``mirrorkit train`` wraps the optimizer's schedule in one when it rolls
    back a diverging run (:mod:`mirrorkit.training.rollback`): the schedule
    keeps its shape, at ``factor`` times the height.

    Args:
        schedule: a ``keras.optimizers.schedules.LearningRateSchedule`` (or
            its serialized config).
        factor: the multiplier, above 0.

    Example:
        >>> inner = WarmupSchedule(0.4, warmup_steps=10)
        >>> round(float(ScaledSchedule(inner, 0.5)(20)), 6)
        0.2
    """

    def __init__(self, schedule: Any, factor: float, name: str = "ScaledSchedule") -> None:
        super().__init__()
        if isinstance(schedule, dict):
            schedule = keras.optimizers.schedules.deserialize(schedule)
        self.schedule = schedule
        self.factor = _positive_number("factor", factor)
        self.name = name

    def __call__(self, step: Any) -> Any:
        return keras.ops.cast(self.schedule(step), "float32") * self.factor

    def get_config(self) -> dict[str, Any]:
        """Return the constructor arguments, the wrapped schedule serialized.

        Example:
            >>> ScaledSchedule(WarmupSchedule(0.1, 10), 0.5).get_config()["factor"]
            0.5
        """
        return {"schedule": keras.optimizers.schedules.serialize(self.schedule),
                "factor": self.factor, "name": self.name}
