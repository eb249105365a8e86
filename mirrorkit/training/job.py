"""The ``mirrorkit train`` job as a library function: TrainConfig in, TrainResult out.

:func:`train` is a short sequence of named steps: create the strategy first
(devices can only be split before any other TensorFlow op), check the
output folder and lock it for the whole run (:mod:`mirrorkit.training.run_lock`),
load the dataset, plan the batch, steps and learning rate
(:mod:`mirrorkit.training.plan`), build and compile the model inside the
strategy's scope, build the input pipelines, fit with mirrorkit's callbacks,
score on every validation example, and write, on the chief only::

    OUTPUT/model.keras      the trained model (keras.models.load_model)
    OUTPUT/metrics.json     val_accuracy, val_loss, batch, lr, throughput, ...
    OUTPUT/history.csv      one row per epoch
    OUTPUT/events.jsonl     the event log: run start, epochs, stragglers,
                            rollbacks, restarts, run end (training.events)
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
import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from mirrorkit.training.config import BASE_BATCH, TrainConfig, TrainResult
from mirrorkit.training.elastic import describe as describe_change
from mirrorkit.training.finetune import fit_model, load_pretrained
from mirrorkit.training.fit_loop import failure_line, start_events
from mirrorkit.training.output import RUN_FILES, default_output, relaunched_with_backup
from mirrorkit.training.plan import TrainPlan, lr_text, make_plan
from mirrorkit.training.run_lock import RunLock, claim_output
from mirrorkit.training.targets import evaluate, parse_target

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _Run:
    """What the first step establishes: the strategy, where output goes, who reports."""

    config: TrainConfig
    strategy: Any
    runtime: Any
    out: Path
    tell: Callable[[str], Any]
    lock: RunLock   # training.run_lock: the chief's, held for the whole run


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
        UserInputError: bad dataset/model/batch/learning-rate combination, or an
            output directory that holds a previous run (without ``resume``).
        FileNotFoundError: missing data, or ``resume`` without a backup.
        PermissionError / NotADirectoryError: an output path that cannot be written.
        RuntimeError: the loss diverged (NaN/inf, or a spike above
            ``config.spike_factor``) more often than ``config.max_rollbacks``
            rollbacks could repair (the epoch and step are named; the last
            good backup is kept), or the strategy cannot be created.

    Example:
        >>> result = train(TrainConfig(epochs=2), echo=print)   # doctest: +SKIP
        >>> sorted(result.metrics)[:3]                         # doctest: +SKIP
        ['augment', 'base_learning_rate', 'class_names']
    """
    started = time.monotonic()
    run = _start(config or TrainConfig(), echo or logger.info)
    # Held until train ends, however it ends: one writer per run folder.
    with run.lock:
        return _train(run, callbacks, started)


def _train(run: _Run, callbacks: Sequence[Any], started: float) -> TrainResult:
    data = _load_data(run)
    run, change = _elastic(run)
    plan = make_plan(run.config, train_examples=data.train_examples,
                     val_examples=data.val_examples, replicas=run.runtime.replicas,
                     name=data.name)
    model = _build_model(run, data, plan)
    train_ds, val_ds = _pipelines(run, data, plan)
    for line in _summary(run, data, plan, model):
        run.tell(line)
    if change is not None:
        change.update(learning_rate=plan.lr, lr_scaling=run.config.lr_scaling)
        run.tell(describe_change(change))
    events = start_events(run, plan, change)
    fitted = fit_model(run, model, plan, train_ds, val_ds, callbacks, events,
                       reset_lr=plan.lr if change is not None else None)
    try:
        scores = _evaluate_all(model, data, plan.val_batch.global_batch)
        metrics = _metrics(run, data, plan, model, fitted, scores, started, change)
        metrics["weights_in_sync"] = _check_sync(run, model)
        if run.config.targets:
            metrics["targets"] = evaluate([parse_target(t) for t in run.config.targets], metrics)
        _write_results(run, model, metrics, plan)
    except BaseException as err:
        events.write("run_end", status="failed", error=failure_line(err))
        raise
    events.write("run_end", status="finished", val_accuracy=metrics["val_accuracy"],
                 val_loss=metrics["val_loss"], wall_time_seconds=metrics["wall_time_seconds"],
                 rollbacks=len(fitted.rollback.incidents), targets=metrics.get("targets"))
    return TrainResult(
        val_accuracy=metrics["val_accuracy"], val_loss=metrics["val_loss"],
        epochs=run.config.epochs, epochs_run=metrics["epochs_run"],
        images_per_second=metrics["images_per_second"],
        images_per_second_per_replica=metrics["images_per_second_per_replica"],
        output_dir=run.out, metrics=metrics, runtime=run.runtime, model=model)


def _start(config: TrainConfig, say: Callable[[str], Any]) -> _Run:
    # The strategy comes first: devices and collectives are configured once,
    # before TensorFlow runs anything (loading a dataset may).
    from mirrorkit.distribute.strategy import describe, get_strategy

    strategy = get_strategy(config.strategy, simulate_cpus=config.simulate_cpus)
    runtime = describe(strategy)
    # Only the chief checks, locks and creates the run directory; other workers
    # write nothing there (the chief-aware callbacks give them temporary paths).
    out, lock = claim_output(config, say) if runtime.is_chief else (
        Path(config.output).expanduser() if config.output else default_output(config),
        RunLock(None, None))
    if not config.resume and relaunched_with_backup(config, out):
        config = dataclasses.replace(config, resume=True, output=str(out))
    return _Run(config, strategy, runtime, out, say if runtime.is_chief else _silent, lock)


def _elastic(run: _Run) -> tuple[_Run, dict[str, Any] | None]:
    """Adapt the batch when an elastic job resumes on another replica count (training.elastic)."""
    from mirrorkit import _env
    from mirrorkit.training.elastic import adapt, agree

    rule = _env.elastic_batch()
    # Decided alike on every worker from the environment: agree() is a collective.
    if rule is None or not _env.restart_count():
        return run, None
    config, change = adapt(run.config, agree(run), replicas=run.runtime.replicas, rule=rule)
    return dataclasses.replace(run, config=config), change


def _silent(line: str) -> None:
    """Non-chief workers report nothing."""


def _load_data(run: _Run) -> Any:
    from mirrorkit import datasets
    from mirrorkit.training.models import check_input

    data = datasets.load(run.config.dataset, run.config.load_options)
    check_input(run.config.model, data.image_shape)
    return data


def _build_model(run: _Run, data: Any, plan: TrainPlan) -> Any:
    import keras

    from mirrorkit.training.models import build_model

    config = run.config
    keras.utils.set_random_seed(config.seed)
    # Read (or downloaded) before the scope: a throwaway backbone, not mirrored.
    pretrained = load_pretrained(config, data.image_shape)
    with run.strategy.scope(), _dtype_policy(config.precision):
        model = build_model(config.model, input_shape=data.image_shape,
                            num_classes=data.num_classes, augment=config.model_augment,
                            seed=config.seed, pretrained=pretrained,
                            pixel_max=data.pixel_max)
        # jit_compile=False: XLA fails on logical (simulated) CPU devices, and
        # "auto" must not pick it silently.
        model.compile(optimizer=_optimizer(config.optimizer, plan.schedule(config),
                                           plan.accumulate),
                      loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                      steps_per_execution=plan.steps_per_execution, jit_compile=False)
    return model


def _pipelines(run: _Run, data: Any, plan: TrainPlan) -> tuple[Any, Any]:
    from mirrorkit import data as pipelines
    from mirrorkit.data.replica_input import per_replica_train_input

    # One endless stream each; steps_per_epoch (from the global batch) and
    # validation_steps end epochs, so every worker runs the same step counts.
    # Per-epoch validation runs under the strategy on whole batches only (see
    # plan._validation_plan); the final, reported score uses every example.
    # On CPU devices each replica reads its own host pipeline (the same
    # examples per step, without the per-step device fetch); elsewhere one
    # global pipeline that tf.distribute splits and shards.
    train_ds = per_replica_train_input(data.train, batch=plan.batch, strategy=run.strategy,
                                       seed=run.config.seed, map_fn=data.map_fn)
    if train_ds is None:
        train_ds = pipelines.train_pipeline(
            data.train, batch=plan.batch, seed=run.config.seed, map_fn=data.map_fn,
            num_files=data.train_files).repeat()
    val_ds = pipelines.train_pipeline(data.val, batch=plan.val_batch, shuffle=False,
                                      map_fn=data.map_fn).repeat()
    return train_ds, val_ds


def _augment_text(config: TrainConfig) -> str:
    layers = config.model_augment
    return "" if layers == "none" else f", {layers} augmentation layers"


def _summary(run: _Run, data: Any, plan: TrainPlan, model: Any) -> list[str]:
    config, runtime = run.config, run.runtime
    reason = f" ({runtime.reason})" if runtime.reason else ""
    workers = f", {runtime.workers} workers" if runtime.is_multi_worker else ""
    return [
        f"dataset   {data.summary()}",
        f"model     {config.model}: {model.count_params():,} parameters"
        f"{_augment_text(config)}, {config.precision}, seed {config.seed}"
        f"{f', weights {config.weights}' if config.weights else ''}",
        f"strategy  {runtime.strategy}, {runtime.replicas} replica"
        f"{'s' if runtime.replicas != 1 else ''}{workers}{reason}",
        f"batch     {_batch_text(plan)}; {plan.steps} steps per epoch "
        f"({plan.steps_per_execution} per call), {config.epochs} epochs",
        f"val       per epoch on {plan.val_steps * plan.val_batch.global_batch:,} of "
        f"{data.val_examples:,} images (whole batches of {plan.val_batch.global_batch}); "
        f"final score on all, one device",
        f"lr        {lr_text(config, plan)}",
        f"output    {run.out}{' (resuming from its backup)' if config.resume else ''}",
    ]


def _batch_text(plan: TrainPlan) -> str:
    batch = plan.batch
    if plan.accumulate == 1:
        return f"{batch.per_replica} per replica x {batch.replicas} = {batch.global_batch} global"
    return (f"{batch.per_replica} per replica x {batch.replicas} x {plan.accumulate} = "
            f"{plan.effective_batch} effective global ({plan.accumulate} accumulated "
            f"micro-batches of {batch.global_batch} per optimizer step)")


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


def _metrics(run: _Run, data: Any, plan: TrainPlan, model: Any, fitted: Any,
             scores: dict[str, float], started: float,
             change: dict[str, Any] | None) -> dict[str, Any]:
    config, runtime, batch = run.config, run.runtime, plan.batch
    meter, epochs = fitted.meter, fitted.epoch
    ips = meter.images_per_second
    return {
        "val_accuracy": float(scores["accuracy"]),
        "val_loss": float(scores["loss"]),
        "epochs": config.epochs,
        "epochs_run": len(epochs),
        "initial_epoch": epochs[0] if epochs else config.epochs,
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
        "accumulate": plan.accumulate,
        "effective_batch": plan.effective_batch,
        "steps_per_epoch": plan.steps,
        "optimizer_steps_per_epoch": plan.steps // plan.accumulate,
        "steps_per_execution": plan.steps_per_execution,
        "optimizer": config.optimizer,
        "base_learning_rate": config.base_lr,
        "base_batch": BASE_BATCH,
        "lr_scaling": config.lr_scaling,
        "learning_rate": plan.lr,
        "warmup_epochs": config.warmup_epochs,
        "seed": config.seed,
        "images_per_second": ips,
        "images_per_second_per_replica": ips / batch.replicas if ips else None,
        "images_per_second_by_epoch": meter.rates,
        "per_worker": fitted.monitor.epochs,
        "incidents": ([change] if change else []) + fitted.rollback.incidents,
        "rollbacks": len(fitted.rollback.incidents),
        "spike_factor": config.spike_factor,
        "max_rollbacks": config.max_rollbacks,
        "rollback_lr_factor": config.rollback_lr_factor,
        "fine_tune": fitted.phases,
        "wall_time_seconds": round(time.monotonic() - started, 3),
    }


def _check_sync(run: _Run, model: Any) -> dict[str, Any]:
    """Every worker's weights against the chief's (a collective: all workers call it)."""
    from mirrorkit.distribute.sync import weights_in_sync

    report = weights_in_sync(model, run.strategy)
    if not report["identical"]:
        workers = ", ".join(str(i) for i in report["differing_workers"])
        run.tell(f"warning: after training, the weights of worker(s) {workers} differ from "
                 "the chief's; the saved model is the chief's (metrics.json weights_in_sync)")
    return report


def _write_results(run: _Run, model: Any, metrics: dict[str, Any], plan: TrainPlan) -> None:
    from mirrorkit.training.callbacks import save_model

    out = run.out
    # Every worker saves (reading mirrored variables can run collectives); only
    # the chief's copy lands in the output directory.
    save_model(model, out / "model.keras")
    if run.runtime.is_chief:
        if run.config.export:
            from mirrorkit.training.serving import export_saved_model

            # A resumed run replaces its own earlier export.
            export_saved_model(model, out / "saved_model", replace=True)
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        # The run is saved: its backup (kept through fit) has served.
        shutil.rmtree(out / "backup", ignore_errors=True)
    written = ", ".join(n + ("/" if (out / n).is_dir() else "") for n in RUN_FILES
                        if (out / n).exists())
    run.tell(f"val_accuracy={metrics['val_accuracy']:.4f} val_loss={metrics['val_loss']:.4f} "
             f"after {run.config.epochs} epochs in {metrics['wall_time_seconds']:.1f}s; "
             f"wrote {out}/ ({written})")
    if plan.warmup_steps:
        # The saved optimizer holds a WarmupSchedule, which Keras can only
        # deserialize once mirrorkit has registered it.
        run.tell("note: import mirrorkit.schedules before keras.models.load_model of this "
                 "model.keras (its optimizer uses mirrorkit's WarmupSchedule)")


@contextlib.contextmanager
def _dtype_policy(name: str) -> Iterator[None]:
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def _optimizer(name: str, learning_rate: Any, accumulate: int = 1) -> Any:
    import keras

    # Keras's own accumulation; under a strategy the 'gradient-accumulation'
    # compat fix makes it work (keras#20582).
    steps = accumulate if accumulate > 1 else None
    if name == "adam":
        return keras.optimizers.Adam(learning_rate, gradient_accumulation_steps=steps)
    return keras.optimizers.SGD(learning_rate, momentum=0.9 if name == "momentum" else 0.0,
                                gradient_accumulation_steps=steps)
