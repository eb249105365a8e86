"""``mirrorkit train``: train a vision model from the zoo on a dataset, on every local device.

Thin: options -> :class:`mirrorkit.training.TrainConfig` ->
:func:`mirrorkit.training.train` -> print. The dataset options are shared with
``mirrorkit export`` through :func:`data_options`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import click

from mirrorkit.commands._common import (
    simulate_cpus_option,
    strategy_option,
    user_errors,
)
from mirrorkit.training import config as defaults
from mirrorkit.training.models import MODELS


class _StepsPerExecution(click.ParamType):
    """``N`` (a positive integer) or ``auto`` (-> None, chosen by ``train``)."""

    name = "N|auto"

    def convert(self, value: Any, param: Any, ctx: Any) -> int | None:
        if value is None or value == "auto" or isinstance(value, int):
            return None if value == "auto" else value
        try:
            number = int(value)
        except ValueError:
            number = 0
        if number < 1:
            self.fail(f"expected a positive integer or 'auto'. Received: {value!r}", param, ctx)
        return number


_STEPS_PER_EXECUTION = _StepsPerExecution()

# --augment: "flip-shift" is TrainConfig.augment (model layers), "crop" the
# data source's own (DataOptions.augment).
AUGMENT_MODES = ("none", "flip-shift", "crop")

_DATA_OPTIONS = ("image_size", "channels", "classes", "examples", "data_dir", "download",
                 "train_split", "val_split", "val_fraction", "val_files")


def data_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--dataset`` and the options that say how to read it.

    Example:
        >>> @click.command()
        ... @data_options
        ... def cmd(dataset, **options): ...
    """
    decorators = [
        click.option("--dataset", default="digits", show_default=True, metavar="SPEC",
                     help="digits (embedded), synthetic, tfds:NAME, folder:PATH or files:GLOB."),
        click.option("--image-size", default=None, metavar="N|HxW",
                     help="Resize images (N x N or HxW). Default: the data's own size "
                     "(synthetic: 32)."),
        click.option("--channels", type=click.Choice(["1", "3"]), default=None,
                     help="Convert images to 1 (grayscale) or 3 (RGB) channels. "
                     "Default: the data's own (synthetic: 3)."),
        click.option("--classes", type=int, default=10, show_default=True,
                     help="synthetic: number of classes."),
        click.option("--examples", type=int, default=1024, show_default=True,
                     help="synthetic: training examples (validation: a fifth)."),
        click.option("--data-dir", default=None, metavar="DIR",
                     help="tfds: data directory. Default: TFDS's (~/tensorflow_datasets)."),
        click.option("--download", is_flag=True,
                     help="tfds: download and prepare the dataset if it is not on disk."),
        click.option("--train-split", default="train", show_default=True,
                     help="tfds: split to train on (slices like train[:80%] work)."),
        click.option("--val-split", default=None,
                     help="tfds: split to validate on. Default: validation, else test, "
                     "else the last 10% of train."),
        click.option("--val-fraction", type=float, default=0.2, show_default=True,
                     help="folder: fraction of every class held out, unless PATH has "
                     "train/ and val/ subfolders."),
        click.option("--val-files", default=None, metavar="GLOB",
                     help="files: validation shards. Default: from the metadata "
                     "`mirrorkit export` writes."),
    ]
    for decorator in reversed(decorators):
        func = decorator(func)
    return func


def build_data_options(kwargs: dict[str, Any]) -> Any:
    """Pop the :func:`data_options` values from ``kwargs`` into a ``DataOptions``.

    Example:
        >>> kwargs = dict(image_size="16", channels="3", classes=10, examples=64, data_dir=None,
        ...               download=False, train_split="train", val_split=None,
        ...               val_fraction=0.2, val_files=None, model="cnn")
        >>> build_data_options(kwargs).image_size, kwargs
        ((16, 16), {'model': 'cnn'})
    """
    from mirrorkit.datasets import DataOptions

    values = {name: kwargs.pop(name) for name in _DATA_OPTIONS}
    if values["channels"] is not None:
        values["channels"] = int(values["channels"])
    return DataOptions(**values)


@click.command()
@data_options
@click.option("--model", default="cnn", show_default=True,
              help=f"{', '.join(MODELS)} (the names after resnet56 are keras.applications "
              "models: with --weights they fine-tune).")
@click.option("--augment", type=click.Choice(AUGMENT_MODES), is_flag=False,
              flag_value="flip-shift", default="none", show_default=True,
              help="flip-shift (also --augment alone): random flip + translation layers "
              "inside the model. crop (folder: and files: only): random-resized-crop "
              "decoded straight from each JPEG, a random flip layer in the model, center "
              "crop for validation. "
              "Example: --augment crop")
@click.option("--cache", is_flag=True,
              help="folder:/files: keep the encoded images in memory after the first epoch.")
@click.option("--epochs", type=int, default=defaults.DEFAULT_EPOCHS, show_default=True,
              help="Epochs to train.")
@click.option("--per-replica-batch", type=int, default=None,
              help=f"Images per replica per step. Default: {defaults.DEFAULT_PER_REPLICA_BATCH} "
              "(unless --global-batch).")
@click.option("--global-batch", type=int, default=None,
              help="Images per optimizer step over all replicas; must divide by the "
              "replicas. Above --per-replica-batch x replicas, gradients are accumulated "
              "over the K micro-batches that make it up (it must divide).")
@click.option("--accumulate", type=int, default=None, metavar="K",
              help="Average the gradients of K micro-batches into each optimizer step "
              "(effective batch = per replica x replicas x K; learning-rate scaling and "
              "warmup use it). Default: 1, or what --global-batch implies.")
@click.option("--optimizer", type=click.Choice(defaults.OPTIMIZERS), default="adam",
              show_default=True, help="momentum = SGD with momentum 0.9.")
@click.option("--lr", type=float, default=None,
              help=f"Learning rate for a global batch of {defaults.BASE_BATCH}. Default: "
              + ", ".join(f"{lr:g} ({name})" for name, lr in defaults.DEFAULT_LR.items()) + ".")
@click.option("--lr-scaling", type=click.Choice(defaults.LR_SCALINGS), default="linear",
              show_default=True, help=f"Scale --lr from batch {defaults.BASE_BATCH} to the global batch.")
@click.option("--warmup-epochs", type=float, default=0.0, show_default=True,
              help="Ramp the learning rate up linearly over this many epochs.")
@click.option("--precision", type=click.Choice(defaults.PRECISIONS),
              default="float32", show_default=True, help="Keras dtype policy.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seeds weights, shuffling and augmentation.")
@click.option("--steps-per-execution", type=_STEPS_PER_EXECUTION, default="auto", show_default=True,
              metavar="N|auto",
              help="Training steps per tf.function call (fewer Python round trips per "
              "step). auto: the largest number up to 16 that divides the steps of an epoch.")
@simulate_cpus_option
@strategy_option
@click.option("--output", default=None, metavar="DIR",
              help="Run directory, locked for the run (DIR/.mirrorkit.lock): a second run "
              "on it is refused, naming the holder. Default: a new "
              "runs/<time>-<model>-<dataset>.")
@click.option("--resume", is_flag=True,
              help="Continue the run in --output from its last epoch backup.")
@click.option("--resume-previous", is_flag=True,
              help="--resume, but from the previous backup (--output's backup/previous) "
              "when the latest one fails verification. Example: --output runs/a --resume-previous")
@click.option("--target", "targets", multiple=True, metavar="METRIC>=N",
              help="A goal the run must meet, e.g. 'val_accuracy>=0.95' or "
              "'wall_time_seconds<=600' (any number in metrics.json; >=, <=, >, <; repeat "
              "for several). Recorded in metrics.json; a miss prints one line and exits "
              "with code 3 after every output is written.")
@click.option("--spike-factor", type=float, default=None, metavar="F",
              help="Also roll back when one step's loss exceeds F times the median of the "
              "recent steps (F > 1, e.g. 10). Default: only a NaN/inf loss rolls back.")
@click.option("--max-rollbacks", type=int, default=2, show_default=True, metavar="N",
              help="On divergence, every worker returns to the last good epoch (weights, "
              "optimizer, epoch) with a lower learning rate, at most N times; the next "
              "divergence stops the run. 0: stop at the first.")
@click.option("--rollback-lr-factor", type=float, default=0.5, show_default=True, metavar="X",
              help="Each rollback multiplies the learning rate by X (0 < X <= 1).")
@click.option("--export", type=click.Choice(["saved_model"]), default=None,
              help="Also write OUTPUT/saved_model: a TensorFlow SavedModel for serving "
              "(uint8 images of any size in, class probabilities out, preprocessing inside).")
@click.option("--weights", default=None, metavar="imagenet|PATH",
              help="Fine-tune a keras.applications --model from pretrained weights: imagenet "
              "(Keras downloads them once per machine into its cache) or a local backbone "
              ".weights.h5, Keras's ImageNet ..._notop.h5, or a .keras model (e.g. an earlier "
              "run's model.keras). Trains in two "
              "phases: the new head with the backbone frozen, then the whole model at "
              "--fine-tune-lr. Example: --model resnet50 --weights imagenet")
@click.option("--head-epochs", type=int, default=None, metavar="K",
              help="With --weights: epochs of phase 1 (backbone frozen). Default: half of "
              "--epochs (at least 1). Example: --epochs 10 --head-epochs 3")
@click.option("--fine-tune-lr", type=float, default=None,
              help="With --weights: phase-2 learning rate for a global batch of "
              f"{defaults.BASE_BATCH}, scaled like --lr. Default: a tenth of phase 1's. "
              "Example: --fine-tune-lr 1e-4")
@click.option("--fine-tune-layers", type=int, default=None, metavar="N",
              help="With --weights: unfreeze only the backbone's top N layers in phase 2. "
              "Default: the whole backbone. Example: --fine-tune-layers 30")
def train(**kwargs: Any) -> None:
    """Train a vision model on every local device (or as one worker of a TF_CONFIG cluster).

    Prints a summary (data, model, strategy and why, batch, learning rate),
    Keras's progress bar, throughput per epoch and the validation accuracy.
    Writes model.keras, metrics.json, history.csv, events.jsonl (the event
    log) and TensorBoard logs/ to --output (in multi-worker runs the chief
    only), which it locks for the run: one writer per folder. A diverging
    loss rolls back to the last good epoch (see --max-rollbacks); with
    several workers, a worker much slower than the others is named each
    epoch.

    \b
    Examples:
      mirrorkit train
      mirrorkit train --simulate-cpus 2 --epochs 5
      mirrorkit train --model resnet20 --dataset synthetic --per-replica-batch 32
      mirrorkit train --simulate-cpus 2 --per-replica-batch 32 --global-batch 256
      mirrorkit train --dataset tfds:mnist --data-dir ~/tensorflow_datasets
      mirrorkit train --dataset folder:photos/ --image-size 64 --augment
      mirrorkit train --dataset folder:photos/ --image-size 224 --augment crop --cache
      mirrorkit train --output runs/a --resume
      mirrorkit train --target 'val_accuracy>=0.95' --target 'wall_time_seconds<=600'
      mirrorkit train --lr 0.05 --spike-factor 10 --max-rollbacks 3
      mirrorkit train --dataset folder:photos/ --model mobilenet_v2 --weights imagenet
      mirrorkit train --model mobilenet_v2 --weights backbone.weights.h5 --head-epochs 2
    """
    from mirrorkit import _env

    _env.quiet_tensorflow()
    with user_errors():
        from mirrorkit.training import TrainConfig
        from mirrorkit.training import train as run_training
        from mirrorkit.training.backup_manifest import FALLBACK

        mode = kwargs.pop("augment")
        data = dataclasses.replace(build_data_options(kwargs), cache=kwargs.pop("cache"),
                                   augment="crop" if mode == "crop" else "none")
        kwargs["augment"] = mode == "flip-shift"
        previous = kwargs.pop("resume_previous")  # the fallback is the library's (env) choice
        config = TrainConfig(data=data, **{**kwargs, "resume": kwargs["resume"] or previous})
        with _env.patch({FALLBACK: "previous"} if previous else {}):
            result = run_training(config, echo=click.echo)
    from mirrorkit.training.targets import MISSED_EXIT_CODE, missed_lines

    missed = missed_lines(result.metrics.get("targets", ()))
    # The chief speaks for the run; under `mirrorkit launch` its exit code 3
    # (with these lines) means "finished, targets missed", not "restart me".
    if missed and result.runtime.is_chief:
        for line in missed:
            click.echo(line, err=True)
        raise SystemExit(MISSED_EXIT_CODE)
