"""``mirrorkit report``: summarise and plot finished runs from their files (no TensorFlow)."""

from __future__ import annotations

from pathlib import Path

import click

from mirrorkit.commands._common import user_errors


@click.command()
@click.argument("run_dirs", nargs=-1, required=True, metavar="RUN_DIR...",
                type=click.Path(path_type=Path))
@click.option("--png", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", help="Where to draw loss, accuracy and images/s over epochs, "
              "every run overlaid. Default: RUN_DIR/report.png for one run, report.png here "
              "for several; a folder that cannot be written gets it in a new temporary folder "
              "instead (said in the last line). Without matplotlib (a base install) and no --png, "
              "the report is the text alone.")
def report(run_dirs: tuple[Path, ...], png: Path | None) -> None:
    """Summarise runs (config, result, targets, throughput per epoch) and plot them.

    Reads each run's metrics.json and history.csv only; does not import
    TensorFlow, so it answers at once, also while another run trains.

    \b
    Examples:
      mirrorkit report runs/20261203-101500-cnn-digits
      mirrorkit report runs/a runs/b --png compare.png
    """
    from mirrorkit.training.run_report import check_png, load_run, summary, write_plot

    with user_errors():
        # Everything is checked before anything is printed or written.
        runs = [load_run(path) for path in run_dirs]
        target = check_png(runs, png)
    for i, run in enumerate(runs):
        if i:
            click.echo()
        click.echo(summary(run))
    # After the summary nothing fails: an unwritable folder moves or skips the plot.
    _, line = write_plot(runs, target)
    click.echo(f"\n{line}")
