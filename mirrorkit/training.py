"""The ``mirrorkit train`` job as a library function: TrainConfig in, TrainResult out.

:func:`train` creates the strategy first (devices can only be split before
any other TensorFlow op), loads the dataset, resolves per-replica and global
batch, scales the learning rate, builds and compiles the model inside the
strategy's scope, trains with Keras ``fit`` and writes, on the chief only::

    OUTPUT/model.keras      the trained model (keras.models.load_model)
    OUTPUT/metrics.json     val_accuracy, val_loss, batch, lr, throughput, ...
    OUTPUT/history.csv      one row per epoch
    OUTPUT/logs/            TensorBoard
    OUTPUT/backup/          the per-epoch backup ``resume=True`` continues from
                            (removed when training finishes)

Example:
    >>> from mirrorkit.training import TrainConfig, train
    >>> result = train(TrainConfig(epochs=3, output="runs/demo"))   # doctest: +SKIP
    >>> round(result.val_accuracy, 2)                               # doctest: +SKIP
    0.97
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import logging
import math
import numbers
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from mirrorkit import _env
from mirrorkit.datasets import DataOptions, parse_spec
from mirrorkit.datasets._base import check_positive_int
from mirrorkit.models import model_spec

logger = logging.getLogger(__name__)

OPTIMIZERS = ("sgd", "momentum", "adam")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
LR_SCALINGS = ("linear", "sqrt", "none")
# ``lr`` is the rate for a global batch of BASE_BATCH (the default per-replica
# batch: on one device nothing is scaled); it is scaled to the real global batch.
BASE_BATCH = 32
DEFAULT_LR = {"sgd": 0.05, "momentum": 0.0125, "adam": 0.002}
DEFAULT_EPOCHS = 10
DEFAULT_PER_REPLICA_BATCH = 32
# What a finished or interrupted run leaves in its output directory.
RUN_FILES = ("model.keras", "metrics.json", "history.csv", "logs", "backup")


def _choice(name: str, value: Any, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"Unknown {name}. Valid: {', '.join(choices)}. Received: {name}={value!r}")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs; validated on construction (no TensorFlow).

    Attributes:
        dataset: ``digits`` (default), ``synthetic``, ``tfds:NAME``,
            ``folder:PATH`` or ``files:GLOB`` (see :mod:`mirrorkit.datasets`).
        data: how to read it (image size, TFDS data_dir, splits, ...).
        model: ``cnn`` (default), ``resnet20``, ``resnet56``, ``resnet50``,
            ``mobilenet_v2`` or ``efficientnet_b0`` (see :mod:`mirrorkit.models`).
        augment: random flip and translation layers inside the model.
        epochs: epochs to train. Defaults to 10 (digits: >= 0.95 val accuracy).
        per_replica_batch: examples per replica per step. Defaults to 32 when
            ``global_batch`` is not given.
        global_batch: examples per step over all replicas (must divide by
            the replicas); exclusive with ``per_replica_batch``.
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

    Raises:
        ValueError: for any invalid value, naming it (``Received: epochs=0``).

    Example:
        >>> TrainConfig(epochs=3).epochs
        3
        >>> TrainConfig(epochs=0)
        Traceback (most recent call last):
        ...
        ValueError: `epochs` must be a positive integer. Received: epochs=0
    """

    dataset: str = "digits"
    data: DataOptions = dataclasses.field(default_factory=DataOptions)
    model: str = "cnn"
    augment: bool = False
    epochs: int = DEFAULT_EPOCHS
    per_replica_batch: int | None = None
    global_batch: int | None = None
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

    def __post_init__(self) -> None:
        from mirrorkit.strategy import KINDS

        parse_spec(self.dataset)
        model_spec(self.model)
        if not isinstance(self.data, DataOptions):
            raise ValueError(f"`data` must be a mirrorkit.datasets.DataOptions. "
                             f"Received: data={self.data!r}")
        check_positive_int("epochs", self.epochs)
        if self.per_replica_batch is not None and self.global_batch is not None:
            raise ValueError(
                "Pass at most one of `per_replica_batch` and `global_batch`. Received: "
                f"per_replica_batch={self.per_replica_batch!r}, global_batch={self.global_batch!r}")
        for name in ("per_replica_batch", "global_batch", "simulate_cpus"):
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
            raise ValueError(f"`lr` must be a positive finite number. Received: lr={lr!r}")
        warm = self.warmup_epochs
        if isinstance(warm, bool) or not isinstance(warm, numbers.Real) or not 0 <= warm < math.inf:
            raise ValueError(
                f"`warmup_epochs` must be a number >= 0. Received: warmup_epochs={warm!r}")
        seed = self.seed
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
            raise ValueError(f"`seed` must be an integer >= 0. Received: seed={self.seed!r}")
        if self.resume and not self.output:
            raise ValueError("`resume` continues the run in `output`: pass --output DIR "
                             "(output=...) too. Received: output=None")

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


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text.split("/")[-1]).strip("_.")


def _default_output(config: TrainConfig) -> Path:
    kind, arg = parse_spec(config.dataset)
    name = kind if not arg else f"{kind}-{_slug(arg) or 'data'}"
    run_id = _env.run_id()
    base = Path("runs") / f"{run_id or time.strftime('%Y%m%d-%H%M%S')}-{config.model}-{name}"
    if run_id:
        # A launched job: every worker and every restart must pick the same folder.
        return base
    path, n = base, 2
    while path.exists():
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    return path


def _has_backup(backup: Path) -> bool:
    return backup.is_dir() and any(backup.iterdir())


def _relaunched_with_backup(config: TrainConfig, path: Path) -> bool:
    """True when ``mirrorkit launch`` restarted this job and a backup exists.

    A restarted group runs the same command line as the first attempt, which
    had no ``--resume``; it must continue from the backup, not be refused.
    """
    return bool(_env.restart_count()) and _has_backup(path / "backup")


def _check_output(config: TrainConfig) -> Path:
    """Refuse anything that could lose a previous run; create nothing yet."""
    path = Path(config.output).expanduser() if config.output else _default_output(config)
    shown = f"output={str(config.output)!r}" if config.output else f"output={str(path)!r}"
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"The output path is a file, not a directory. Received: {shown}")
    if _relaunched_with_backup(config, path):
        return path
    if config.resume:
        if not _has_backup(path / "backup"):
            done = (" (that run finished: see metrics.json)"
                    if (path / "metrics.json").exists() else "")
            raise FileNotFoundError(f"Nothing to resume: no backup in {path / 'backup'}{done}. "
                                    f"Received: {shown}, resume=True")
    elif path.is_dir() and not _env.restart_count():
        # (A relaunched group whose first attempt died before its first backup
        # starts over in the same folder; nothing of value is there yet.)
        found = [name for name in RUN_FILES if (path / name).exists()]
        if found:
            raise ValueError(
                f"{path} already holds a run ({', '.join(found)}); pass --resume (resume=True) "
                f"to continue it, or choose another --output. Nothing was changed. "
                f"Received: {shown}")
    # The nearest existing ancestor must be a writable directory.
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(
            f"Cannot create the output directory: {parent} is a file. Received: {shown}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"The output directory is not writable ({parent}). Received: {shown}")
    return path


def _make_output(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".mirrorkit-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise PermissionError(f"Cannot write to the output directory {path}: "
                              f"{err.strerror or err}. Received: output={str(path)!r}") from err


def _tensorboard_installed() -> bool:
    # tf.summary's writers live in the tensorboard package, which TensorFlow
    # does not require; without it the TensorBoard callback fails mid-epoch.
    return importlib.util.find_spec("tensorboard") is not None


@contextlib.contextmanager
def _dtype_policy(name: str) -> Iterator[None]:
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _optimizer(name: str, learning_rate: Any) -> Any:
    import keras

    if name == "adam":
        return keras.optimizers.Adam(learning_rate)
    return keras.optimizers.SGD(learning_rate, momentum=0.9 if name == "momentum" else 0.0)


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


def _multi_step_works(replicas: int) -> bool:
    if replicas <= 1:
        return True
    from mirrorkit import compat

    fix = compat.FIXES["multi-step"]
    return fix.is_applied() or not fix.needed()


def _steps_per_execution(config: TrainConfig, steps: int, replicas: int) -> int:
    works = _multi_step_works(replicas)
    if config.steps_per_execution is None:
        return auto_steps_per_execution(steps) if works else 1
    if config.steps_per_execution > 1 and not works:
        raise ValueError(
            "steps_per_execution > 1 fails in Keras 3 fit under a strategy with 2+ replicas "
            "(keras-team/keras#19246) and mirrorkit's 'multi-step' compat fix is disabled "
            f"(MIRRORKIT_COMPAT / MIRRORKIT_COMPAT_DISABLE); use 1 here ({replicas} replicas). "
            f"Received: steps_per_execution={config.steps_per_execution}")
    return config.steps_per_execution


def _evaluate_all(model: Any, data: Any, batch_size: int) -> dict[str, float]:
    """Loss and accuracy on every validation example, on this process's first device.

    A copy of the model outside the strategy sees all examples in plain
    batches, exactly as ``keras.models.load_model("model.keras").evaluate``
    will: no replica gets an empty slice and nothing is dropped. Every worker
    computes the same numbers without collectives.
    """
    import keras
    import tensorflow as tf

    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    copy.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"], jit_compile=False)
    # A known size (TFRecord/TFDS sources have none) keeps Keras from warning
    # "Your input ran out of data" at the natural end of the data.
    ds = data.examples("val").apply(tf.data.experimental.assert_cardinality(data.val_examples))
    ds = ds.batch(batch_size).prefetch(tf.data.AUTOTUNE)
    return copy.evaluate(ds, return_dict=True, verbose=0)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _validation_plan(pipelines: Any, batch: Any, data: Any, spe: int) -> tuple[Any, int]:
    """The per-epoch validation batch and step count: whole batches, ``spe`` steps per call.

    Keras runs validation with the training's ``steps_per_execution`` and only
    whole executions, so the step count is a multiple of ``spe`` (else it would
    read past the intended batches). The batch is then sized to cover as many
    validation examples as that allows, with at least one example per replica:
    a partial or empty replica batch breaks BatchNormalization under a strategy.
    """
    natural = max(1, data.val_examples // batch.global_batch)
    val_steps = spe * max(1, round(natural / spe))
    while val_steps > spe and data.val_examples // (val_steps * batch.replicas) < 1:
        val_steps -= spe
    per_replica = data.val_examples // (val_steps * batch.replicas)
    _require(per_replica >= 1,
             f"{data.name} has {data.val_examples} validation examples, too few for "
             f"{val_steps} validation steps ({spe} per call) on {batch.replicas} replicas; "
             f"lower steps_per_execution. Received: val_examples={data.val_examples}")
    if val_steps == natural and per_replica >= batch.per_replica:
        return batch, val_steps
    return pipelines.resolve_batch(per_replica_batch=per_replica,
                                   replicas=batch.replicas), val_steps


def _lr_text(config: TrainConfig, lr: float, global_batch: int, warmup_steps: int) -> str:
    text = f"{config.optimizer} {config.base_lr:g} for batch {BASE_BATCH}"
    if config.lr_scaling == "none" or global_batch == BASE_BATCH:
        text += f" -> {lr:g} (not scaled: {config.lr_scaling} rule, global batch {global_batch})"
    else:
        text += f" -> {lr:g} ({config.lr_scaling} scaling to global batch {global_batch})"
    if warmup_steps:
        text += f", warmup {config.warmup_epochs:g} epochs ({warmup_steps} steps)"
    return text


def train(config: TrainConfig | None = None, *, callbacks: Sequence[Any] = (),
          echo: Callable[[str], Any] | None = None) -> TrainResult:
    """Train ``config.model`` on ``config.dataset`` on every local device (or worker).

    Only the chief reports and writes files; every worker trains. The steps
    are listed in the module docstring.

    Args:
        config: the run. Defaults to ``TrainConfig()`` (cnn on digits).
        callbacks: extra Keras callbacks, run after mirrorkit's own.
        echo: called with each line for the user (summary, per-epoch
            throughput, result); e.g. ``print``. Defaults to logging at INFO.

    Returns:
        A :class:`TrainResult`.

    Raises:
        ValueError: bad dataset/model/batch/learning-rate combination, or an
            output directory that holds a previous run (without ``resume``).
        FileNotFoundError: missing data, or ``resume`` without a backup.
        PermissionError / NotADirectoryError: an output path that cannot be written.
        RuntimeError: the loss became NaN/inf (the epoch and step are named;
            the last good backup is kept), or the strategy cannot be created.

    Example:
        >>> result = train(TrainConfig(epochs=2), echo=print)   # doctest: +SKIP
        >>> sorted(result.metrics)[:3]                         # doctest: +SKIP
        ['augment', 'base_learning_rate', 'class_names']
    """
    config = config or TrainConfig()
    say = echo or logger.info
    started = time.monotonic()
    # The strategy comes first: devices and collectives are configured once,
    # before TensorFlow runs anything (loading a dataset may).
    from mirrorkit.strategy import describe, get_strategy

    strategy = get_strategy(config.strategy, simulate_cpus=config.simulate_cpus)
    runtime = describe(strategy)
    chief = runtime.is_chief
    tell = say if chief else (lambda line: None)

    import keras

    from mirrorkit import data as pipelines
    from mirrorkit import datasets
    from mirrorkit.metering import NonFiniteLossError, NonFiniteLossGuard, ThroughputMeter
    from mirrorkit.models import build_model, check_input
    from mirrorkit.schedules import WarmupSchedule, scale_learning_rate

    batch = pipelines.resolve_batch(
        per_replica_batch=None if config.global_batch else
        (config.per_replica_batch or DEFAULT_PER_REPLICA_BATCH),
        global_batch=config.global_batch, replicas=runtime.replicas)
    # Only the chief checks and creates the run directory; other workers write
    # nothing there (the chief-aware callbacks give them temporary paths).
    out = _check_output(config) if chief else (
        Path(config.output).expanduser() if config.output else _default_output(config))
    if not config.resume and _relaunched_with_backup(config, out):
        config = dataclasses.replace(config, resume=True, output=str(out))
    data = datasets.load(config.dataset, config.data)
    check_input(config.model, data.image_shape)
    steps = data.train_examples // batch.global_batch
    _require(steps >= 1,
             f"{data.name} has {data.train_examples} training examples, fewer than one global "
             f"batch ({batch.global_batch}); lower the batch. Received: "
             f"per_replica_batch={batch.per_replica}, global_batch={batch.global_batch}")
    lr = scale_learning_rate(config.base_lr, BASE_BATCH, batch.global_batch, config.lr_scaling)
    warmup_steps = int(round(config.warmup_epochs * steps))
    schedule: Any = lr
    if warmup_steps:
        schedule = WarmupSchedule(lr, warmup_steps,
                                  initial_lr=config.base_lr if lr > config.base_lr else 0.0)

    spe = _steps_per_execution(config, steps, runtime.replicas)
    # Per-epoch validation runs under the strategy on whole batches only (see
    # _validation_plan); the final, reported score uses every example (see
    # _evaluate_all). Repeated with a fixed step count, so every worker runs
    # the same number of validation steps.
    val_batch, val_steps = _validation_plan(pipelines, batch, data, spe)

    keras.utils.set_random_seed(config.seed)
    with strategy.scope(), _dtype_policy(config.precision):
        model = build_model(config.model, input_shape=data.image_shape,
                            num_classes=data.num_classes, augment=config.augment,
                            seed=config.seed)
        # jit_compile=False: XLA fails on logical (simulated) CPU devices, and
        # "auto" must not pick it silently.
        model.compile(optimizer=_optimizer(config.optimizer, schedule),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                      steps_per_execution=spe, jit_compile=False)
    train_ds = pipelines.train_pipeline(
        data.train, batch=batch, seed=config.seed, map_fn=data.map_fn,
        num_files=data.train_files,
    ).repeat()  # one endless stream; steps_per_epoch (from the global batch) ends epochs
    val_ds = pipelines.train_pipeline(data.val, batch=val_batch, shuffle=False,
                                      map_fn=data.map_fn).repeat()

    reason = f" ({runtime.reason})" if runtime.reason else ""
    workers = f", {runtime.workers} workers" if runtime.is_multi_worker else ""
    for line in (
        f"dataset   {data.summary()}",
        f"model     {config.model}: {model.count_params():,} parameters"
        f"{', augmentation' if config.augment else ''}, {config.precision}, seed {config.seed}",
        f"strategy  {runtime.strategy}, {runtime.replicas} replica"
        f"{'s' if runtime.replicas != 1 else ''}{workers}{reason}",
        f"batch     {batch.per_replica} per replica x {batch.replicas} = {batch.global_batch} "
        f"global; {steps} steps per epoch ({spe} per call), {config.epochs} epochs",
        f"val       per epoch on {val_steps * val_batch.global_batch:,} of {data.val_examples:,} "
        f"images (whole batches of {val_batch.global_batch}); final score on all, one device",
        f"lr        {_lr_text(config, lr, batch.global_batch, warmup_steps)}",
        f"output    {out}{' (resuming from its backup)' if config.resume else ''}",
    ):
        tell(line)

    from mirrorkit.callbacks import BackupAndRestore, TensorBoard, save_model

    if chief:
        _make_output(out)
    guard = NonFiniteLossGuard()
    meter = ThroughputMeter(batch.global_batch, batch.replicas, report=tell)
    # Order matters at epoch end: the progress bar prints first, the meter then
    # adds throughput to the logs the CSV and TensorBoard writers record.
    own: list[Any] = [guard]
    if chief:
        own.append(keras.callbacks.ProgbarLogger())
    own.append(meter)
    if chief:
        own.append(keras.callbacks.CSVLogger(str(out / "history.csv"), append=config.resume))
    if _tensorboard_installed():
        own.append(TensorBoard(log_dir=str(out / "logs")))
    else:
        tell("logs      no TensorBoard logs: the tensorboard package is not installed "
             "(pip install tensorboard)")
    own.append(BackupAndRestore(backup_dir=str(out / "backup")))
    try:
        # shuffle=False: the pipeline already shuffles (Keras would only warn).
        history = model.fit(train_ds, epochs=config.epochs, steps_per_epoch=steps,
                            validation_data=val_ds, validation_steps=val_steps,
                            callbacks=own + list(callbacks), verbose=1 if chief else 0,
                            shuffle=False)
    except NonFiniteLossError as err:
        kept = (f"the backup of epoch {err.last_good_epoch} in {out / 'backup'} is kept; "
                f"continue with --resume after fixing the cause"
                if err.last_good_epoch or _has_backup(out / "backup")
                else "no epoch had finished, so there is no backup")
        raise RuntimeError(
            f"Training stopped: {err}; {kept}. Lower the learning rate (--lr {config.base_lr:g} "
            f"was scaled to {lr:g}) or check the data for NaN/inf values.") from err
    except KeyboardInterrupt:
        # Leading newline: Keras's progress bar leaves the cursor mid-line.
        tell(f"\ninterrupted: the last epoch backup is in {out / 'backup'}; continue with "
             f"--resume --output {out}")
        raise

    scores = _evaluate_all(model, data, val_batch.global_batch)
    ips = meter.images_per_second
    metrics = {
        "val_accuracy": float(scores["accuracy"]),
        "val_loss": float(scores["loss"]),
        "epochs": config.epochs,
        "epochs_run": len(history.epoch),
        "initial_epoch": history.epoch[0] if history.epoch else config.epochs,
        "dataset": data.name,
        "train_examples": data.train_examples,
        "val_examples": data.val_examples,
        "image_shape": list(data.image_shape),
        "num_classes": data.num_classes,
        "class_names": list(data.class_names),
        "model": config.model,
        "params": int(model.count_params()),
        "augment": config.augment,
        "precision": config.precision,
        "strategy": runtime.strategy,
        "strategy_reason": runtime.reason,
        "replicas": runtime.replicas,
        "workers": runtime.workers,
        "per_replica_batch": batch.per_replica,
        "global_batch": batch.global_batch,
        "steps_per_epoch": steps,
        "steps_per_execution": spe,
        "optimizer": config.optimizer,
        "base_learning_rate": config.base_lr,
        "base_batch": BASE_BATCH,
        "lr_scaling": config.lr_scaling,
        "learning_rate": lr,
        "warmup_epochs": config.warmup_epochs,
        "seed": config.seed,
        "images_per_second": ips,
        "images_per_second_per_replica": ips / batch.replicas if ips else None,
        "images_per_second_by_epoch": meter.rates,
        "wall_time_seconds": round(time.monotonic() - started, 3),
    }
    # Every worker saves (reading mirrored variables can run collectives); only
    # the chief's copy lands in the output directory.
    save_model(model, out / "model.keras")
    if chief:
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    written = ", ".join(n + ("/" if (out / n).is_dir() else "") for n in RUN_FILES
                        if (out / n).exists())
    tell(f"val_accuracy={metrics['val_accuracy']:.4f} val_loss={metrics['val_loss']:.4f} "
         f"after {config.epochs} epochs in {metrics['wall_time_seconds']:.1f}s; wrote {out}/ "
         f"({written})")
    if warmup_steps and chief:
        # The saved optimizer holds a WarmupSchedule, which Keras can only
        # deserialize once mirrorkit has registered it.
        tell("note: import mirrorkit.schedules before keras.models.load_model of this "
             "model.keras (its optimizer uses mirrorkit's WarmupSchedule)")
    return TrainResult(
        val_accuracy=metrics["val_accuracy"], val_loss=metrics["val_loss"],
        epochs=config.epochs, epochs_run=metrics["epochs_run"], images_per_second=ips,
        images_per_second_per_replica=metrics["images_per_second_per_replica"],
        output_dir=out, metrics=metrics, runtime=runtime, model=model)
