"""``mirrorkit bench``: training throughput and scaling efficiency on this machine."""

from __future__ import annotations

import click

from mirrorkit.commands._common import user_errors
from mirrorkit.errors import MissingDependency, RunError


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
def bench(model: str, dataset: str, replicas: str, workers: str,
          steps: int, warmup_steps: int, per_replica_batch: int, output: str,
          timeout: float) -> None:
    """Measure training images/s per replica and worker count, and scaling efficiency.

    Each configuration trains in a fresh process (workers > 1: real worker
    processes on loopback ports). Efficiency = images/s(n) / (n x images/s(1));
    1.0 is linear scaling. Without GPUs, replicas share the same CPU cores, so
    the figures measure overhead, not speed-up.

    \b
    Examples:
      mirrorkit bench
      mirrorkit bench --model resnet20 --dataset synthetic --replicas 1,2,4 --steps 50
      mirrorkit bench --workers 1,2 --output bench-mw
    """
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
