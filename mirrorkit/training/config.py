"""What a ``mirrorkit train`` run is: :class:`TrainConfig` in, :class:`TrainResult` out.

Both are plain frozen dataclasses validated without TensorFlow, so the CLI
checks every flag before any TensorFlow start-up.

Example:
    >>> TrainConfig(epochs=3, optimizer="sgd").base_lr
    0.05
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from pathlib import Path
from typing import Any, Sequence

from mirrorkit.datasets import DataOptions, parse_spec
from mirrorkit.datasets._base import check_positive_int
from mirrorkit.errors import UserInputError
from mirrorkit.training.finetune_options import check_fine_tune
from mirrorkit.training.models import model_spec
from mirrorkit.training.serving import check_format
from mirrorkit.training.targets import parse_target

OPTIMIZERS = ("sgd", "momentum", "adam")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
LR_SCALINGS = ("linear", "sqrt", "none")
# ``lr`` is the rate for a global batch of BASE_BATCH (the default per-replica
# batch: on one device nothing is scaled); it is scaled to the real global batch.
BASE_BATCH = 32
DEFAULT_LR = {"sgd": 0.05, "momentum": 0.0125, "adam": 0.002}
DEFAULT_EPOCHS = 10
DEFAULT_PER_REPLICA_BATCH = 32


def _choice(name: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise UserInputError(
            f"Unknown {name}. Valid: {', '.join(choices)}. Received: {name}={value!r}")


def check_rollback(max_rollbacks: Any, lr_factor: Any, spike_factor: Any = None) -> None:
    """Validate the rollback settings (see :class:`TrainConfig`).

    Example:
        >>> check_rollback(2, 0.5)
        >>> check_rollback(-1, 0.5)
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: `max_rollbacks` must be an integer >= 0. Received: max_rollbacks=-1
    """
    if (isinstance(max_rollbacks, bool) or not isinstance(max_rollbacks, numbers.Integral)
            or max_rollbacks < 0):
        raise UserInputError(f"`max_rollbacks` must be an integer >= 0. "
                             f"Received: max_rollbacks={max_rollbacks!r}")
    if (isinstance(lr_factor, bool) or not isinstance(lr_factor, numbers.Real)
            or not 0 < lr_factor <= 1):
        raise UserInputError(f"`rollback_lr_factor` must be above 0 and at most 1. "
                             f"Received: rollback_lr_factor={lr_factor!r}")
    if spike_factor is not None and (isinstance(spike_factor, bool)
                                     or not isinstance(spike_factor, numbers.Real)
                                     or not 1 < spike_factor < math.inf):
        raise UserInputError(f"`spike_factor` must be a number above 1. "
                             f"Received: spike_factor={spike_factor!r}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs; validated on construction (no TensorFlow).

    Attributes:
        dataset: ``digits`` (default), ``synthetic``, ``tfds:NAME``,
            ``folder:PATH`` or ``files:GLOB`` (see :mod:`mirrorkit.datasets`).
        data: how to read it (image size, TFDS data_dir, splits, ...).
        model: ``cnn`` (default), ``resnet20``, ``resnet56`` or a
            ``keras.applications`` model such as ``resnet50``, ``mobilenet_v2``
            or ``efficientnet_b0`` (see :mod:`mirrorkit.training.models`).
        augment: random flip and translation layers inside the model. The
            random-resized-crop of JPEG folders and shards is ``data``'s
            (``DataOptions(augment="crop")``, ``folder:`` and ``files:`` only).
        epochs: epochs to train. Defaults to 10 (digits: >= 0.95 val accuracy).
        per_replica_batch: examples per replica per step. Defaults to 32 when
            ``global_batch`` is not given.
        global_batch: examples per optimizer step over all replicas (must
            divide by the replicas). With ``per_replica_batch`` too, a
            ``global_batch`` above per replica x replicas is reached by
            accumulating gradients over K = global / (per replica x replicas)
            micro-batches (it must divide).
        accumulate: K, micro-batches whose gradients are averaged into one
            optimizer step (the effective batch is per replica x replicas x
            K). Defaults to 1, or to what ``global_batch`` and
            ``per_replica_batch`` imply; given with both, it must agree.
        optimizer: ``sgd``, ``momentum`` (SGD, momentum 0.9) or ``adam`` (default).
        lr: learning rate for a global batch of 32 (:data:`BASE_BATCH`).
            Defaults to 0.05 (sgd), 0.0125 (momentum) or 0.002 (adam; twice
            Keras's default, which the default digits run needs to reach 0.95
            in a few epochs).
        lr_scaling: scale ``lr`` to the global batch: ``linear`` (default;
            Goyal et al. 2017), ``sqrt`` or ``none``.
        warmup_epochs: ramp the rate linearly over this many epochs, from the
            unscaled ``lr`` (from 0 when nothing is scaled) to the scaled one.
            Defaults to 0.
        precision: ``float32`` (default), ``mixed_float16`` or ``mixed_bfloat16``.
        seed: seeds weights, shuffling and augmentation. Defaults to 0, so
            runs repeat; the validation split never depends on it.
        steps_per_execution: training steps per ``tf.function`` call.
            Defaults to ``None`` = automatic: the largest number up to 16 that
            divides the steps of an epoch (see :func:`auto_steps_per_execution`),
            which amortises Keras's per-step Python work over several steps.
            Callbacks then see one batch end per call; per-epoch validation
            runs a multiple of it. Above 1 with 2+ replicas needs mirrorkit's ``multi-step``
            compat fix (keras#19246; applied by :func:`mirrorkit.get_strategy`).
        strategy: ``auto`` (default, also ``MIRRORKIT_STRATEGY``), ``default``,
            ``mirrored`` or ``multi_worker``.
        simulate_cpus: split a GPU-less CPU into N logical devices
            (default ``MIRRORKIT_SIMULATE_CPUS``).
        output: run directory. Defaults to a new ``runs/<time>-<model>-<dataset>``.
            An existing directory holding a run is refused unless ``resume``.
        resume: continue the run in ``output`` from its backup.
        targets: goals such as ``"val_accuracy>=0.95"`` (any number in
            metrics.json; operators >=, <=, >, <), checked at the end and
            recorded in metrics.json's ``targets``. Defaults to none.
        spike_factor: roll back when one call's loss exceeds this many times
            the median of the recent ones (above 1). Defaults to None: only a
            NaN/inf loss triggers a rollback.
        max_rollbacks: divergences to recover from by rolling back to the last
            good epoch (:mod:`mirrorkit.training.rollback`); the next one stops
            the run. Defaults to 2; 0 stops at the first.
        rollback_lr_factor: each rollback multiplies the learning rate by this
            (above 0, at most 1). Defaults to 0.5.
        export: also write ``output/saved_model`` for serving (``"saved_model"``:
            :mod:`mirrorkit.training.serving`), on the chief. Defaults to None.
        weights: fine-tune a ``keras.applications`` model from ``"imagenet"``
            or a file (:mod:`mirrorkit.training.pretrained`), in two phases
            (:mod:`mirrorkit.training.finetune`). Defaults to None (random).
        head_epochs: phase-1 epochs (backbone frozen). Defaults to half of ``epochs``.
        fine_tune_lr: phase-2 rate for a global batch of 32, scaled like
            ``lr``. Defaults to a tenth of the scaled phase-1 rate.
        fine_tune_layers: unfreeze only the backbone's top N layers in phase 2.
            Defaults to None (all).

    Raises:
        UserInputError: for any invalid value, naming it (``Received: epochs=0``).

    Example:
        >>> TrainConfig(epochs=3).epochs
        3
        >>> TrainConfig(epochs=0)
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: `epochs` must be a positive integer. Received: epochs=0
    """

    dataset: str = "digits"
    data: DataOptions = dataclasses.field(default_factory=DataOptions)
    model: str = "cnn"
    augment: bool = False
    epochs: int = DEFAULT_EPOCHS
    per_replica_batch: int | None = None
    global_batch: int | None = None
    accumulate: int | None = None
    optimizer: str = "adam"
    lr: float | None = None
    lr_scaling: str = "linear"
    warmup_epochs: float = 0.0
    precision: str = "float32"
    seed: int = 0
    steps_per_execution: int | None = None
    strategy: str | None = None
    simulate_cpus: int | None = None
    output: str | None = None
    resume: bool = False
    targets: tuple[str, ...] = ()
    export: str | None = None
    spike_factor: float | None = None
    max_rollbacks: int = 2
    rollback_lr_factor: float = 0.5
    weights: str | None = None
    head_epochs: int | None = None
    fine_tune_lr: float | None = None
    fine_tune_layers: int | None = None

    def __post_init__(self) -> None:
        from mirrorkit.distribute.selection import KINDS

        kind, _ = parse_spec(self.dataset)
        model_spec(self.model)
        if not isinstance(self.data, DataOptions):
            raise ValueError(f"`data` must be a mirrorkit.datasets.DataOptions. "
                             f"Received: data={self.data!r}")
        if self.data.augment != "none" and kind not in ("folder", "files"):
            raise UserInputError(f"augment={self.data.augment!r} decodes encoded images: it "
                                 "applies to folder:PATH and files:GLOB datasets only (use "
                                 f"--augment flip-shift here). Received: dataset={self.dataset!r}")
        check_positive_int("epochs", self.epochs)
        for name in ("per_replica_batch", "global_batch", "accumulate", "simulate_cpus"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        if self.steps_per_execution is not None:
            check_positive_int("steps_per_execution", self.steps_per_execution)
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("precision", self.precision, PRECISIONS)
        _choice("lr_scaling", self.lr_scaling, LR_SCALINGS)
        if self.strategy is not None:
            _choice("strategy", self.strategy, KINDS)
        lr = self.lr
        if lr is not None and (isinstance(lr, bool) or not isinstance(lr, numbers.Real)
                               or not 0 < lr < math.inf):
            raise UserInputError(f"`lr` must be a positive finite number. Received: lr={lr!r}")
        warm = self.warmup_epochs
        if isinstance(warm, bool) or not isinstance(warm, numbers.Real) or not 0 <= warm < math.inf:
            raise UserInputError(
                f"`warmup_epochs` must be a number >= 0. Received: warmup_epochs={warm!r}")
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise UserInputError(f"`seed` must be an integer >= 0. Received: seed={self.seed!r}")
        if isinstance(self.targets, str):
            object.__setattr__(self, "targets", (self.targets,))
        object.__setattr__(self, "targets", tuple(self.targets or ()))
        for target in self.targets:
            parse_target(target)
        if self.export is not None:
            check_format(self.export)
        check_rollback(self.max_rollbacks, self.rollback_lr_factor, self.spike_factor)
        check_fine_tune(self)
        if self.resume and not self.output:
            raise UserInputError("`resume` continues the run in `output`: pass --output DIR "
                                 "(output=...) too. Received: output=None")

    @property
    def load_options(self) -> DataOptions:
        """:attr:`data` as the job loads it: encoded images (``folder:``, ``files:``) as uint8.

        uint8 batches are a quarter of float32's bytes to batch and to copy
        to the device (~4.5% less CPU per image on a JPEG folder;
        benchmarks/RESULTS.md section 11); the model starts by rescaling
        them (``build_model(pixel_max=255)``), on the device.

        Example:
            >>> TrainConfig(dataset="folder:photos").load_options.uint8
            True
        """
        if parse_spec(self.dataset)[0] in ("folder", "files"):
            return dataclasses.replace(self.data, uint8=True)
        return self.data

    @property
    def model_augment(self) -> str:
        """The augmentation layers the model starts with (``build_model(augment=...)``).

        ``--augment crop`` crops in the input pipeline and flips in the model:
        a horizontal flip copies every pixel, which costs the host's cores
        about 8% of a JPEG decode and the accelerator next to nothing
        (benchmarks/RESULTS.md, section 11).

        Example:
            >>> TrainConfig(augment=True).model_augment
            'flip-shift'
        """
        if self.augment:
            return "flip-shift"
        return "flip" if self.data.augment == "crop" else "none"

    @property
    def base_lr(self) -> float:
        """``lr``, or the optimizer's default, before scaling.

        Example:
            >>> TrainConfig(optimizer="sgd").base_lr
            0.05
        """
        return float(self.lr) if self.lr is not None else DEFAULT_LR[self.optimizer]


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        val_accuracy: accuracy on the validation split after training.
        val_loss: loss on the validation split.
        epochs: epochs of the run in total (``config.epochs``).
        epochs_run: epochs this call trained (fewer when resumed).
        images_per_second: training throughput over all replicas.
        images_per_second_per_replica: the same, per replica.
        output_dir: the run directory (written by the chief only).
        metrics: the content of ``metrics.json``.
        runtime: the strategy description (:class:`mirrorkit.Runtime`).
        model: the trained ``keras.Model``.

    Example:
        >>> result = train(TrainConfig(epochs=1))       # doctest: +SKIP
        >>> result.metrics["global_batch"]              # doctest: +SKIP
        32
    """

    val_accuracy: float
    val_loss: float
    epochs: int
    epochs_run: int
    images_per_second: float | None
    images_per_second_per_replica: float | None
    output_dir: Path
    metrics: dict[str, Any]
    runtime: Any = dataclasses.field(repr=False)
    model: Any = dataclasses.field(repr=False)
