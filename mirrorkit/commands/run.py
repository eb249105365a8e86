"""``mirrorkit run``: run an unmodified Keras script on every local device."""

from __future__ import annotations

import logging

import click

from mirrorkit import _env
from mirrorkit.commands._common import (
    logging_to,
    simulate_cpus_option,
    strategy_option,
    user_errors,
)


class _RunLog(logging.Handler):
    """The runner's messages (adopted strategies, trimmed examples) as one stderr line each."""

    def emit(self, record: logging.LogRecord) -> None:
        # A line that carries its own prefix (the one-device check's) is printed as is.
        prefix = "" if getattr(record, "verbatim", False) else "mirrorkit run: "
        click.echo(f"{prefix}{record.getMessage()}", err=True)


def _runner_log():
    # Info level: saying which strategy the script's own construction got is
    # part of the command's output, not a debugging detail.
    return logging_to("mirrorkit.runner", _RunLog())


def _announce(runtime, scale: bool) -> None:
    batch = (f"script batch_size is per replica (x{runtime.replicas})" if scale
             else "script batch_size is the global batch")
    click.echo(f"mirrorkit run: {runtime.summary()}; {batch}", err=True)


def _switch(name: str, envvar: str, text: str):
    """An on/off option that also reads ``envvar`` (unset: None, the config decides)."""
    return click.option(f"--{name}/--no-{name}", default=None, envvar=envvar,
                        show_envvar=True, help=text)


@click.command(context_settings={"ignore_unknown_options": True,
                                 "allow_interspersed_args": False})
@simulate_cpus_option
@strategy_option
@click.option("--scale-batch/--no-scale-batch", default=None,
              envvar="MIRRORKIT_SCALE_BATCH", show_envvar=True,
              help="Treat the batch_size the script passes to fit/evaluate/predict "
              "as per replica (multiplied by the replica count). Default: it is "
              "the global batch, split across replicas.")
@click.option("--speed-up-fit", is_flag=True, default=False,
              help="Apply mirrorkit train's safe speed-ups to the script's fit: several "
              "steps per tf.function call (not when a callback acts per batch: batch-level "
              "callbacks would run once per call) and prefetching of tf.data inputs. Off by "
              "default because it changes what batch-level callbacks see.")
@_switch("compare-one-device", "MIRRORKIT_COMPARE_ONE_DEVICE",
         "At the start of each model's first fit on more than one replica, train one step "
         "on the first global batch both distributed and on a one-device copy, print one "
         "'mirrorkit: one-device check:' line (same / DIFFERENT and why), then put every "
         "variable back so the fit trains as without the flag. "
         "Example: mirrorkit run --compare-one-device --simulate-cpus 2 train.py")
@_switch("sync-batch-norm", "MIRRORKIT_SYNC_BATCH_NORM",
         "Every BatchNormalization the script constructs (its own layers, keras.applications "
         "backbones) synchronises its batch statistics across the replicas, unless the "
         "script passes synchronized itself: one device's numbers for models with "
         "BatchNormalization, at a few small all-reduces per layer and step. "
         "Example: mirrorkit run --sync-batch-norm --simulate-cpus 2 train.py")
@click.argument("script")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def run(simulate_cpus: int | None, strategy: str | None, scale_batch: bool | None,
        speed_up_fit: bool, compare_one_device: bool | None, sync_batch_norm: bool | None,
        script: str, args: tuple[str, ...]) -> None:
    """Run SCRIPT as `python SCRIPT ARGS` would, with every Keras model mirrored.

    The strategy is created and its scope entered before the script starts, so
    models it builds, compiles and fits train on all replicas without a code
    change; tf.distribute.get_strategy() returns it. Options for mirrorkit go
    before SCRIPT; everything after it is the script's own. Exit code and
    traceback are the script's.

    \b
    Scripts that create their own strategy:
      tf.distribute.MirroredStrategy() and (experimental.)MultiWorkerMirroredStrategy(),
      without arguments or with only cross_device_ops/communication options,
      return mirrorkit's strategy (one "mirrorkit run:" line says so).
      A strategy pinned to devices (MirroredStrategy(devices=[...]),
      OneDeviceStrategy) is used as written and mirrorkit's scope is left.

    \b
    Uneven last batch: with N replicas, fit on arrays leaves out the < N
    trailing training examples that would give a replica an empty batch
    (one warning; validation_split is taken first, as Keras does). Batch a
    tf.data.Dataset with drop_remainder=True yourself.

    \b
    One-device check (--compare-one-device): each model's first fit on 2+
    replicas first trains one step on its first global batch both ways (the
    model's own step, and a one-device copy from its config, weights and
    optimizer state), prints one "mirrorkit: one-device check:" line (same,
    differs as expected, DIFFERENT with the likely cause, or not checked),
    then restores every variable: the fit trains as without the flag.

    \b
    BatchNormalization (--sync-batch-norm): by default each replica
    normalises with its own slice's statistics, as tf.distribute does; with
    the flag the script's BatchNormalization layers synchronise them across
    the replicas, and the model trains as on one device.

    \b
    Examples:
      mirrorkit run --simulate-cpus 2 apps/plain_keras_script.py --epochs 3
      mirrorkit run --scale-batch train.py --batch-size 64   # 64 per replica
      mirrorkit run --speed-up-fit --simulate-cpus 2 train.py
      mirrorkit run --compare-one-device --simulate-cpus 2 train.py
      mirrorkit run --sync-batch-norm --simulate-cpus 2 train.py
      mirrorkit launch -n 2 -- mirrorkit run tf_multi_worker_tutorial.py
    """
    from mirrorkit.runner import RunConfig, ScriptFailed, run_script

    if script.startswith("-"):
        # With ignore_unknown_options an unknown mirrorkit option lands here.
        raise click.UsageError(
            f"No such option: {script} (mirrorkit run options go before SCRIPT)")
    config = RunConfig(script=script, args=tuple(args), strategy=strategy,
                       simulate_cpus=simulate_cpus, scale_batch=scale_batch,
                       speed_up_fit=speed_up_fit, compare_one_device=compare_one_device,
                       sync_batch_norm=sync_batch_norm)
    try:
        with user_errors(), _runner_log():
            _env.quiet_tensorflow()
            # Errors raised before the script starts are mirrorkit's to report
            # in one line; the script's own errors come back as ScriptFailed.
            run_script(config, on_start=_announce)
    except ScriptFailed as failed:
        click.echo(failed.traceback_text, err=True, nl=False)
        raise SystemExit(failed.exit_code) from None
