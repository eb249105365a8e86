"""Fine-tuning a pretrained backbone in two phases (``mirrorkit train --weights``).

The standard schedule of Keras's transfer-learning guide:

* **phase 1, head** (``--head-epochs`` K, default half of ``--epochs``):
  the backbone is frozen; only the new head (Dropout + Dense) trains, at
  the run's learning rate.
* **phase 2, fine-tune** (the remaining epochs): the backbone is unfrozen
  (all of it, or its top ``--fine-tune-layers`` N layers) and the whole
  model trains at ``--fine-tune-lr`` (default a tenth of the phase-1 rate)
  with a fresh optimizer state, as recompiling with a new optimizer gives.

In both phases the backbone's BatchNormalization layers stay frozen, which
in Keras 3 keeps them in inference mode: their moving statistics never
change (small per-replica batches cannot wreck them, and replicas cannot
drift apart), as Keras's EfficientNet fine-tuning example does. (The
guide's ``backbone(x, training=False)`` alone does not do it in Keras 3:
keras-team/keras#20285.) Each phase
start prints one line (what is frozen, trainable parameters, learning
rate, epochs) and writes a ``phase_start`` event; ``metrics.json`` holds
``fine_tune`` with the phases and one record per epoch with its ``phase``.

The optimizer is built once over phase 2's trainable variables (phase 1's
head is a subset), so its state has the same shape in both phases: the per-epoch backup of either
phase loads into the model, and ``--resume`` (or a restart under
``mirrorkit launch``) continues in the phase of the backup's epoch (the
chief's epoch, agreed by every worker).

Example:
    >>> Phases(2, 5, 0.002, 0.0002, None).span(1)
    (0, 2)
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Sequence

logger = logging.getLogger(__name__)

__all__ = ["Phases", "fit_model", "load_pretrained", "make_phases"]


@dataclasses.dataclass(frozen=True)
class Phases:
    """The two phases of a fine-tuning run.

    Attributes:
        head_epochs: epochs of phase 1 (0: none).
        epochs: all epochs.
        head_lr: phase-1 learning rate (the plan's, scaled).
        fine_tune_lr: phase-2 learning rate (scaled like the plan's).
        fine_tune_layers: backbone layers unfrozen in phase 2 (None: all).

    Example:
        >>> Phases(2, 5, 0.002, 0.0002, None).phase_of(2)
        2
    """

    head_epochs: int
    epochs: int
    head_lr: float
    fine_tune_lr: float
    fine_tune_layers: int | None

    def phase_of(self, epoch: int) -> int:
        """The phase (1 or 2) of the 0-based ``epoch``.

        Example:
            >>> [Phases(1, 3, 1.0, 0.1, None).phase_of(e) for e in range(3)]
            [1, 2, 2]
        """
        return 1 if epoch < self.head_epochs else 2

    def span(self, phase: int) -> tuple[int, int]:
        """``(first, end)`` 0-based epochs of ``phase`` (end exclusive).

        Example:
            >>> Phases(2, 5, 1.0, 0.1, None).span(2)
            (2, 5)
        """
        return (0, self.head_epochs) if phase == 1 else (self.head_epochs, self.epochs)


def make_phases(config: Any, plan: Any) -> Phases:
    """The :class:`Phases` of ``config`` with ``plan``'s batch (the phase-2 rate is scaled alike).

    Example:
        >>> from mirrorkit.training import TrainConfig
        >>> from mirrorkit.training.plan import make_plan
        >>> config = TrainConfig(model="mobilenet_v2", weights="imagenet", epochs=4)
        >>> make_phases(config, make_plan(config, train_examples=640, val_examples=64,
        ...                               replicas=2))
        Phases(head_epochs=2, epochs=4, head_lr=0.004, fine_tune_lr=0.0004, fine_tune_layers=None)
    """
    from mirrorkit.training.config import BASE_BATCH
    from mirrorkit.training.finetune_options import default_head_epochs
    from mirrorkit.training.schedules import scale_learning_rate

    head = config.head_epochs if config.head_epochs is not None else \
        default_head_epochs(config.epochs)
    if config.fine_tune_lr is None:
        lr = plan.lr / 10
    else:
        lr = scale_learning_rate(config.fine_tune_lr, BASE_BATCH, plan.effective_batch,
                                 config.lr_scaling)
    return Phases(head, config.epochs, plan.lr, lr, config.fine_tune_layers)


def load_pretrained(config: Any, image_shape: tuple[int, ...]) -> list[Any] | None:
    """The backbone's pretrained weights (NumPy arrays), or None without ``--weights``.

    Call outside the strategy's scope (see :mod:`mirrorkit.training.pretrained`).

    Example:
        >>> load_pretrained(TrainConfig(), (8, 8, 1)) is None    # doctest: +SKIP
        True
    """
    if config.weights is None:
        return None
    from mirrorkit.training.backbones import APPLICATIONS
    from mirrorkit.training.pretrained import backbone_arrays

    return backbone_arrays(config.weights, APPLICATIONS[config.model], tuple(image_shape[:2]))


def _set_phase(model: Any, phases: Phases, phase: int) -> int:
    """Freeze or unfreeze the backbone; return the trainable parameters."""
    import keras

    backbone = model.get_layer("backbone")
    backbone.trainable = phase == 2
    if phase == 2:
        if phases.fine_tune_layers:
            for layer in backbone.layers[:-phases.fine_tune_layers]:
                layer.trainable = False
        # A frozen BatchNormalization runs in inference mode in Keras 3. The
        # guide's `backbone(x, training=False)` does not hold it there: the
        # functional model passes fit's training=True down to every nested
        # layer (keras-team/keras#20285), so unfrozen BN layers would
        # update their statistics from each replica's small batch.
        for layer in _all_layers(backbone):
            if isinstance(layer, keras.layers.BatchNormalization):
                layer.trainable = False
    return int(sum(math.prod(w.shape) for w in model.trainable_weights))


def _all_layers(model: Any) -> list[Any]:
    found = []
    for layer in getattr(model, "layers", []):
        found += [layer, *_all_layers(layer)]
    return found


def _recompile(model: Any, plan: Any, strategy: Any) -> None:
    # The train step reads the trainable variables when it is traced: trace
    # again. The same (built) optimizer keeps its variables, so backups of
    # either phase load into the model.
    with strategy.scope():
        model.compile(optimizer=model.optimizer, loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"], steps_per_execution=plan.steps_per_execution,
                      jit_compile=False)


def _agreed_start(run: Any) -> int:
    """The epoch the run resumes at: the chief's verified backup, agreed by every worker."""
    start = 0
    if run.config.resume and run.runtime.is_chief:
        from mirrorkit.training.backup_manifest import choose

        backup = choose(run.out / "backup")
        start = backup.epoch if backup is not None else 0
    if run.runtime.is_multi_worker:
        import tensorflow as tf

        from mirrorkit.training.chief import broadcast_from_chief

        (value,) = broadcast_from_chief(run.strategy, [tf.constant(start, tf.int64)])
        start = int(value.numpy())
    return start


def _describe(phases: Phases, phase: int, trainable: int) -> tuple[str, dict[str, Any]]:
    first, end = phases.span(phase)
    if phase == 1:
        what, frozen = "head only", "backbone frozen"
        lr = phases.head_lr
    else:
        what = "fine-tune"
        frozen = (f"top {phases.fine_tune_layers} backbone layers unfrozen"
                  if phases.fine_tune_layers else "whole model unfrozen")
        frozen += " except BatchNormalization"
        lr = phases.fine_tune_lr
    line = (f"phase {phase}/2  {what}: {frozen} (BatchNormalization in inference mode), "
            f"{trainable:,} trainable parameters, lr {lr:g}, epochs {first + 1}-{end}")
    return line, {"phase": phase, "name": what, "trainable": frozen, "trainable_params": trainable,
                  "learning_rate": lr, "first_epoch": first + 1, "last_epoch": end}


def fit_model(run: Any, model: Any, plan: Any, train_ds: Any, val_ds: Any,
              extra: Sequence[Any], events: Any, reset_lr: float | None = None) -> Any:
    """:func:`~mirrorkit.training.fit_loop.fit`, in two phases when ``run.config.weights`` is set.

    Returns:
        The :class:`~mirrorkit.training.fit_loop.Fitted` of the whole run;
        its ``phases`` (``metrics.json``'s ``fine_tune``) describe the phases.

    Example:
        >>> fitted = fit_model(run, model, plan, train_ds, val_ds, [], events)  # doctest: +SKIP
        >>> [r["phase"] for r in fitted.phases["epochs"]]                      # doctest: +SKIP
        [1, 2]
    """
    from mirrorkit.training.fit_loop import fit

    if run.config.weights is None:
        return fit(run, model, plan, train_ds, val_ds, extra, events, reset_lr=reset_lr)
    from mirrorkit.training.phase_switch import PhaseSwitch

    phases = make_phases(run.config, plan)
    # Built over phase 2's variables (phase 1's are a subset): one optimizer
    # state shape for both phases, and the saved model.keras reloads it.
    _set_phase(model, phases, 2)
    with run.strategy.scope():
        model.optimizer.build(model.trainable_variables)
    start = _agreed_start(run)
    switch = PhaseSwitch(phases, reset=reset_lr is not None)
    record: dict[str, Any] = {"weights": run.config.weights, "head_epochs": phases.head_epochs,
                              "phases": [], "epochs": switch.records}
    parts = []
    for phase in (1, 2):
        first, end = phases.span(phase)
        if end <= first or (phase == 1 and start >= end):
            continue  # no epochs in this phase, or resumed past it
        trainable = _set_phase(model, phases, phase)
        _recompile(model, plan, run.strategy)
        line, fields = _describe(phases, phase, trainable)
        run.tell(line)
        events.write("phase_start", **fields)
        record["phases"].append(fields)
        switch.phase = phase
        if parts:  # phase 2 after phase 1 in this process: history.csv goes on
            run = dataclasses.replace(run, config=dataclasses.replace(run.config, resume=True))
        parts.append(fit(run, model, plan, train_ds, val_ds, extra, events,
                         reset_lr=reset_lr if phase == 1 else None, epochs=end,
                         initial_epoch=first, before_rollback=[switch]))
    return _merge(parts, record)


def _merge(parts: list[Any], record: dict[str, Any]) -> Any:
    last = parts[-1]
    for earlier in parts[:-1]:
        last.epoch[:0] = earlier.epoch
        last.meter.rates[:0] = earlier.meter.rates
        last.monitor.epochs[:0] = earlier.monitor.epochs
        last.rollback.incidents[:0] = earlier.rollback.incidents
    last.phases = record
    return last
