"""``mirrorkit export``: write any dataset source as TFRecord shards that ``files:`` reads."""

from __future__ import annotations

from typing import Any

import click

from mirrorkit.commands._common import user_errors
from mirrorkit.commands.train import build_data_options, data_options


@click.command()
@data_options
@click.option("--output", required=True, metavar="DIR",
              help="New or empty directory for the shards and mirrorkit-dataset.json.")
@click.option("--shards", type=int, default=4, show_default=True,
              help="Files per split; at least the number of workers that will read them.")
def export(**kwargs: Any) -> None:
    """Write a dataset as PNG TFRecord shards (image, label, height, width, channels).

    Train on them with `mirrorkit train --dataset files:DIR`; multi-worker runs
    then shard by file (each worker reads its own shards).

    \b
    Examples:
      mirrorkit export --output shards/digits --shards 4
      mirrorkit export --dataset folder:photos/ --image-size 64 --output shards/photos
      mirrorkit train --dataset files:shards/digits
    """
    from mirrorkit import _env

    _env.quiet_tensorflow()
    output, shards = kwargs.pop("output"), kwargs.pop("shards")
    with user_errors():
        from mirrorkit import datasets

        options = build_data_options(kwargs)
        data = datasets.load(kwargs["dataset"], options)
        meta = datasets.export_tfrecords(data, output, shards=shards)
    train, val = meta["splits"]["train"], meta["splits"]["val"]
    click.echo(f"wrote {len(train['files'])} train shards ({train['examples']:,} examples) and "
               f"{len(val['files'])} val shards ({val['examples']:,} examples) of {data.name} "
               f"to {output}/; train with: mirrorkit train --dataset files:{output}")
