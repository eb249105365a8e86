"""``mirrorkit bench``: training throughput and scaling efficiency on this machine."""

from __future__ import annotations

import click

from mirrorkit.bench.input_only import AUGMENTS
from mirrorkit.commands._common import user_errors
from mirrorkit.errors import MissingDependency, RunError

# Options of the training benchmark that --input-only (one process, no model) has no use for.
_TRAINING_ONLY = ("model", "replicas", "workers", "per_replica_batch", "timeout")


@click.command()
@click.option("--model", default="cnn", show_default=True,
              help="Model name from mirrorkit's zoo (cnn, resnet20, resnet56, a keras.applications name).")
@click.option("--dataset", default="digits", show_default=True,
              help="Dataset name (digits, synthetic, ...).")
@click.option("--replicas", default="1,2", show_default=True,
              help="Replica counts of one process, comma-separated. On a CPU-only machine "
              "each count simulates that many logical CPUs; 1 is always measured.")
@click.option("--workers", default="1", show_default=True,
              help="Worker counts, comma-separated; N > 1 starts N loopback worker "
              "processes with TF_CONFIG (one replica each).")
@click.option("--steps", type=click.IntRange(min=1), default=30, show_default=True,
              help="Timed training steps per configuration (after warm-up), rounded up to "
              "whole tf.function calls.")
@click.option("--warmup-steps", type=click.IntRange(min=0), default=5, show_default=True,
              help="Untimed steps first (tracing, graph optimisation).")
@click.option("--per-replica-batch", type=click.IntRange(min=1), default=32, show_default=True,
              help="Images per replica per step; the global batch grows with replicas.")
@click.option("--output", type=click.Path(file_okay=False), default="bench-results",
              show_default=True, help="Directory for bench.json, bench.csv and bench.png.")
@click.option("--timeout", type=click.FloatRange(min=1), default=600, show_default=True,
              help="Seconds one configuration may take before it is stopped.")
@click.option("--input-only", is_flag=True,
              help="Time the training input pipeline alone (no model) beside the decode "
              "floor of the same files and, for folder:, keras.utils.image_dataset_from_"
              "directory; --steps batches per arm. Example: --input-only --dataset "
              "folder:photos --image-size 224 --augment crop")
@click.option("--image-size", default="224", show_default=True, metavar="N|HxW",
              help="--input-only: the image size train would resize to.")
@click.option("--batch", type=click.IntRange(min=1), default=64, show_default=True,
              help="--input-only: images per batch (train's global batch).")
@click.option("--augment", type=click.Choice(AUGMENTS), default="none", show_default=True,
              help="--input-only: as train --augment (flip-shift runs in the model, so its "
              "input pipeline is none's; crop's flip too, so the pipeline crops only).")
@click.option("--cache", is_flag=True, help="--input-only: as train --cache.")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="--input-only: alternated rounds over the arms; the median is reported.")
@click.pass_context
def bench(ctx: click.Context, model: str, dataset: str, replicas: str, workers: str,
          steps: int, warmup_steps: int, per_replica_batch: int, output: str,
          timeout: float, input_only: bool, image_size: str, batch: int, augment: str,
          cache: bool, rounds: int) -> None:
    """Measure training images/s per replica and worker count, and scaling efficiency.

    Each configuration trains in a fresh process (workers > 1: real worker
    processes on loopback ports). Efficiency = images/s(n) / (n x images/s(1));
    1.0 is linear scaling. Without GPUs, replicas share the same CPU cores, so
    the figures measure overhead, not speed-up.

    With --input-only: the input pipeline train builds, alone, against the
    decode floor of the same files (images/s, per core, ratios), written to
    OUTPUT/input_bench.json; tells whether a job is input-bound and how many
    cores per accelerator it needs.

    \b
    Examples:
      mirrorkit bench
      mirrorkit bench --model resnet20 --dataset synthetic --replicas 1,2,4 --steps 50
      mirrorkit bench --workers 1,2 --output bench-mw
      mirrorkit bench --input-only --dataset folder:photos --image-size 224 --augment crop
    """
    if input_only:
        with user_errors():
            _input_only(ctx, dataset=dataset, steps=steps, warmup_steps=warmup_steps,
                        output=output, image_size=image_size, batch=batch, augment=augment,
                        cache=cache, rounds=rounds)
        return
    from mirrorkit.bench import BenchConfig, run_bench, write_report

    # Lists are parsed here, not by a click type, so a bad one is one line
    # ("Error: ...") rather than click's three-line usage error.
    with user_errors():
        config = BenchConfig(model=model, dataset=dataset, replicas=replicas, workers=workers,
                             steps=steps, warmup_steps=warmup_steps,
                             per_replica_batch=per_replica_batch, timeout=timeout)
        report = run_bench(config, progress=lambda line: click.echo(line, err=True))
        click.echo(report.table())
        try:
            paths = write_report(report, output)
        except MissingDependency as err:
            # JSON and CSV are already written; the plot is the optional part.
            click.echo(f"wrote {output}/bench.json, {output}/bench.csv", err=True)
            raise click.ClickException(str(err)) from err
        click.echo(f"wrote {paths['json']}, {paths['csv']}, {paths['png']}", err=True)
        if report.failed:
            raise RunError(
                f"{len(report.failed)} of {len(report.rows)} configurations failed "
                f"(first: workers={report.failed[0].workers} replicas="
                f"{report.failed[0].replicas}: {report.failed[0].error}); see {paths['json']}"
            )


def _input_only(ctx: click.Context, *, dataset: str, steps: int, warmup_steps: int,
                output: str, **options: object) -> None:
    import json
    from pathlib import Path

    from mirrorkit import _env
    from mirrorkit.bench.input_only import InputBenchConfig, run_input_bench, table

    given = [name for name in _TRAINING_ONLY
             if ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE]
    if given:
        names = ", ".join("--" + name.replace("_", "-") for name in given)
        raise click.UsageError(f"--input-only times one input pipeline, no model: drop {names}.")
    config = InputBenchConfig(dataset=dataset, batches=steps, warmup_batches=warmup_steps,
                              **options)
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--output must be a directory. Received: output={output!r}")
    _env.quiet_tensorflow()
    report = run_input_bench(config, progress=lambda line: click.echo(line, err=True))
    click.echo(table(report))
    out.mkdir(parents=True, exist_ok=True)
    (out / "input_bench.json").write_text(json.dumps(report, indent=2) + "\n")
    click.echo(f"wrote {out / 'input_bench.json'}", err=True)
