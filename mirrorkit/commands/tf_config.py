"""``mirrorkit tf-config``: print the TF_CONFIG one task of a cluster needs."""

from __future__ import annotations

import shlex

import click

from mirrorkit.commands._common import user_errors


@click.command("tf-config")
@click.option("--workers", required=True, metavar="HOST:PORT,...",
              help="Every worker's host:port, comma-separated, in rank order.")
@click.option("--index", required=True, type=int,
              help="This task's index within its --type (0-based).")
@click.option("--type", "task_type", type=click.Choice(["worker", "chief"]),
              default="worker", show_default=True, help="This task's type.")
@click.option("--chief", default=None, metavar="HOST:PORT",
              help="Address of a separate chief task (Kubeflow style). Without it, "
              "worker 0 is the chief.")
@click.option("--export", "as_export", is_flag=True,
              help="Print a shell line, export TF_CONFIG='...', for eval.")
def tf_config(workers: str, index: int, task_type: str, chief: str | None,
              as_export: bool) -> None:
    """Print the TF_CONFIG JSON (one line) for one task of a multi-worker cluster.

    Run it once per machine with the same --workers and that machine's --index.

    \b
    Examples:
      export TF_CONFIG="$(mirrorkit tf-config --workers localhost:12345,localhost:12346 --index 0)"
      eval "$(mirrorkit tf-config --workers host-a:12345,host-b:12345 --index 1 --export)"
      mirrorkit tf-config --workers w0:2222,w1:2222 --chief c:2222 --type chief --index 0
    """
    from mirrorkit.distribute.cluster import build_tf_config, parse_hosts

    with user_errors():
        text = build_tf_config(parse_hosts(workers), index, task_type=task_type, chief=chief)
    click.echo(f"export TF_CONFIG={shlex.quote(text)}" if as_export else text)
