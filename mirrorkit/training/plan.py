"""The numbers of a run, decided before anything trains: batch, steps, learning rate, validation.

:func:`make_plan` turns a :class:`~mirrorkit.training.config.TrainConfig`,
the dataset's sizes and the replica count into a frozen :class:`TrainPlan`,
so every worker derives the same plan and the summary lines print it.

Example:
    >>> auto_steps_per_execution(44)
    11
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from mirrorkit.data import BatchSize, resolve_batch
from mirrorkit.errors import UserInputError
from mirrorkit.training.config import BASE_BATCH, DEFAULT_PER_REPLICA_BATCH, TrainConfig

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class TrainPlan:
    """Everything :func:`make_plan` decides.

    Attributes:
        batch: per-replica and global batch of one training step (a micro-batch
            when gradients are accumulated).
        steps: training steps (micro-batches) per epoch, a multiple of ``accumulate``.
        lr: the learning rate after scaling to the effective batch.
        warmup_steps: optimizer steps of linear warmup (0: none).
        steps_per_execution: training steps per ``tf.function`` call.
        val_batch: the per-epoch validation batch.
        val_steps: per-epoch validation steps.
        accumulate: micro-batches per optimizer step (1: no accumulation).

    Example:
        >>> plan = make_plan(TrainConfig(), train_examples=1437, val_examples=360, replicas=2)
        >>> plan.batch.global_batch, plan.steps, plan.lr
        (64, 22, 0.004)
    """

    batch: BatchSize
    steps: int
    lr: float
    warmup_steps: int
    steps_per_execution: int
    val_batch: BatchSize
    val_steps: int
    accumulate: int = 1

    @property
    def effective_batch(self) -> int:
        """Examples per optimizer step: per replica x replicas x ``accumulate``.

        Example:
            >>> plan = make_plan(TrainConfig(accumulate=4), train_examples=1437,
            ...                  val_examples=360, replicas=2)
            >>> plan.batch.global_batch, plan.effective_batch, plan.steps
            (64, 256, 20)
        """
        return self.batch.global_batch * self.accumulate

    def schedule(self, config: TrainConfig) -> Any:
        """The optimizer's learning rate: ``lr``, or a warmup schedule towards it.

        Example:
            >>> plan = make_plan(TrainConfig(), train_examples=64, val_examples=8, replicas=1)
            >>> plan.schedule(TrainConfig())
            0.002
        """
        if not self.warmup_steps:
            return self.lr
        from mirrorkit.training.schedules import WarmupSchedule

        return WarmupSchedule(self.lr, self.warmup_steps,
                              initial_lr=config.base_lr if self.lr > config.base_lr else 0.0,
                              steps_per_update=self.accumulate)


def make_plan(config: TrainConfig, *, train_examples: int, val_examples: int, replicas: int,
              name: str = "the dataset") -> TrainPlan:
    """Decide the batch, steps, learning rate and validation of a run.

    Args:
        config: the run.
        train_examples: training examples in the dataset.
        val_examples: validation examples.
        replicas: replicas in sync (over all workers).
        name: the dataset's name, for error messages.

    Returns:
        A :class:`TrainPlan`.

    Raises:
        UserInputError: a batch larger than the data, or a steps_per_execution
            that cannot run here.

    Example:
        >>> make_plan(TrainConfig(global_batch=32), train_examples=320, val_examples=64,
        ...           replicas=2).batch.per_replica
        16
    """
    from mirrorkit.training.schedules import scale_learning_rate

    batch, k = resolve_accumulation(config, replicas)
    # Whole optimizer steps per epoch: the last k-1 micro-batches at most are
    # left out, as a partial batch is.
    steps = train_examples // batch.global_batch // k * k
    _require(steps >= 1,
             f"{name} has {train_examples} training examples, fewer than one effective "
             f"batch ({batch.global_batch * k}); lower the batch. Received: "
             f"per_replica_batch={batch.per_replica}, replicas={replicas}, accumulate={k}")
    _check_accumulation_works(k)
    lr = scale_learning_rate(config.base_lr, BASE_BATCH, batch.global_batch * k,
                             config.lr_scaling)
    spe = _steps_per_execution(config, steps, replicas)
    val_batch, val_steps = _validation_plan(batch, val_examples, spe, name)
    return TrainPlan(batch=batch, steps=steps, lr=lr,
                     warmup_steps=int(round(config.warmup_epochs * steps / k)),
                     steps_per_execution=spe, val_batch=val_batch, val_steps=val_steps,
                     accumulate=k)


def resolve_accumulation(config: TrainConfig, replicas: int) -> tuple[BatchSize, int]:
    """The batch of one step and K, the micro-batches per optimizer step.

    ``global_batch`` with ``per_replica_batch`` asks for K = global / (per
    replica x replicas); ``global_batch`` with ``accumulate`` splits the
    global batch into K micro-batches; either alone is as without accumulation.

    Raises:
        UserInputError: the three numbers do not fit (named, with what would).

    Example:
        >>> batch, k = resolve_accumulation(
        ...     TrainConfig(per_replica_batch=32, global_batch=256), replicas=2)
        >>> batch.global_batch, k
        (64, 4)
    """
    b, g, k = config.per_replica_batch, config.global_batch, config.accumulate
    received = (f"Received: global_batch={g}, per_replica_batch={b}, replicas={replicas}, "
                f"accumulate={k}")
    if g is not None and b is not None:
        step = b * replicas
        _require(g % step == 0,
                 f"--global-batch {g} is not --per-replica-batch {b} x {replicas} replicas x "
                 f"a whole number K of accumulated micro-batches; "
                 f"{nearest_multiple(g, step)}. {received}")
        _require(k is None or k == g // step,
                 f"--accumulate {k} disagrees with --global-batch {g} = {b} per replica x "
                 f"{replicas} replicas x {g // step}; drop one of them. {received}")
        return resolve_batch(per_replica_batch=b, replicas=replicas), g // step
    k = k or 1
    if g is not None:
        _require(k == 1 or g % (replicas * k) == 0,
                 f"--global-batch {g} does not split into {replicas} replicas x {k} "
                 f"micro-batches; {nearest_multiple(g, replicas * k)}. {received}")
        return resolve_batch(global_batch=g // k, replicas=replicas), k
    return resolve_batch(per_replica_batch=b or DEFAULT_PER_REPLICA_BATCH, replicas=replicas), k


def nearest_multiple(value: int, unit: int) -> str:
    """Advice naming the multiples of ``unit`` around ``value``.

    Example:
        >>> nearest_multiple(30, 4)
        'use a multiple of 4: 28 or 32'
    """
    low = value // unit * unit
    return (f"use a multiple of {unit}: {low} or {low + unit}" if low
            else f"use a multiple of {unit}, e.g. {unit}")


def _check_accumulation_works(k: int) -> None:
    from mirrorkit import compat

    if k > 1 and compat.decisions()["gradient-accumulation"]["status"] in (compat.DISABLED,
                                                                            compat.UNAVAILABLE):
        raise UserInputError(
            "Gradient accumulation fails in Keras 3 under tf.distribute (keras#20582) and "
            "mirrorkit's 'gradient-accumulation' compat fix is off or cannot apply here "
            "(MIRRORKIT_COMPAT / MIRRORKIT_COMPAT_DISABLE, `mirrorkit info`). "
            f"Received: accumulate={k}")


def lr_text(config: TrainConfig, plan: TrainPlan) -> str:
    """The ``lr`` summary line: base rate, scaling rule, result and warmup.

    Example:
        >>> plan = make_plan(TrainConfig(), train_examples=640, val_examples=64, replicas=2)
        >>> lr_text(TrainConfig(), plan)
        'adam 0.002 for batch 32 -> 0.004 (linear scaling to global batch 64)'
    """
    global_batch, lr = plan.effective_batch, plan.lr
    what = "effective batch" if plan.accumulate > 1 else "global batch"
    text = f"{config.optimizer} {config.base_lr:g} for batch {BASE_BATCH}"
    if config.lr_scaling == "none" or global_batch == BASE_BATCH:
        text += f" -> {lr:g} (not scaled: {config.lr_scaling} rule, {what} {global_batch})"
    else:
        text += f" -> {lr:g} ({config.lr_scaling} scaling to {what} {global_batch})"
    if plan.warmup_steps:
        text += f", warmup {config.warmup_epochs:g} epochs ({plan.warmup_steps} steps)"
    return text


def auto_steps_per_execution(steps: int, cap: int = 16) -> int:
    """The largest number up to ``cap`` that divides ``steps`` (the steps of an epoch).

    A divisor, because Keras runs whole executions: at 8 steps per execution
    an epoch of 44 steps silently becomes 48. The cap keeps callbacks and the
    progress bar lively; beyond ~16 steps the per-step Python work is
    already negligible. (A prime step count gets itself, up to the cap.)

    Example:
        >>> auto_steps_per_execution(44), auto_steps_per_execution(32), auto_steps_per_execution(7)
        (11, 16, 7)
        >>> auto_steps_per_execution(22), auto_steps_per_execution(17)
        (11, 1)
    """
    return max(d for d in range(1, min(cap, steps) + 1) if steps % d == 0)


def _steps_per_execution(config: TrainConfig, steps: int, replicas: int) -> int:
    from mirrorkit import compat

    works = compat.works("multi-step", replicas)
    if config.steps_per_execution is None:
        return auto_steps_per_execution(steps) if works else 1
    if config.steps_per_execution > 1 and not works:
        if compat.status()["multi-step"] == compat.UNAVAILABLE:
            # The fix cannot apply to this Keras: turn the feature off, don't crash.
            logger.warning("steps_per_execution=%d needs mirrorkit's 'multi-step' compat fix "
                           "(keras#19246) with %d replicas, which cannot apply to this Keras; "
                           "using 1 step per call.", config.steps_per_execution, replicas)
            return 1
        raise UserInputError(
            "steps_per_execution > 1 fails in Keras 3 fit under a strategy with 2+ replicas "
            "(keras-team/keras#19246) and mirrorkit's 'multi-step' compat fix is disabled "
            f"(MIRRORKIT_COMPAT / MIRRORKIT_COMPAT_DISABLE); use 1 here ({replicas} replicas). "
            f"Received: steps_per_execution={config.steps_per_execution}")
    return config.steps_per_execution


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise UserInputError(message)


def _validation_plan(batch: BatchSize, val_examples: int, spe: int,
                     name: str) -> tuple[BatchSize, int]:
    """The per-epoch validation batch and step count: whole batches, ``spe`` steps per call.

    Keras runs validation with the training's ``steps_per_execution`` and only
    whole executions, so the step count is a multiple of ``spe`` (else it would
    read past the intended batches). The batch is then sized to cover as many
    validation examples as that allows, with at least one example per replica:
    a partial or empty replica batch breaks BatchNormalization under a strategy.
    """
    natural = max(1, val_examples // batch.global_batch)
    val_steps = spe * max(1, round(natural / spe))
    while val_steps > spe and val_examples // (val_steps * batch.replicas) < 1:
        val_steps -= spe
    per_replica = val_examples // (val_steps * batch.replicas)
    _require(per_replica >= 1,
             f"{name} has {val_examples} validation examples, too few for "
             f"{val_steps} validation steps ({spe} per call) on {batch.replicas} replicas; "
             f"lower steps_per_execution. Received: val_examples={val_examples}")
    if val_steps == natural and per_replica >= batch.per_replica:
        return batch, val_steps
    return resolve_batch(per_replica_batch=per_replica, replicas=batch.replicas), val_steps
