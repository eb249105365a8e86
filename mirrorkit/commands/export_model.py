"""``mirrorkit export-model``: a finished run's model as a SavedModel for serving."""

from __future__ import annotations

from pathlib import Path

import click

from mirrorkit.commands._common import user_errors
from mirrorkit.errors import UserInputError


@click.command("export-model")
@click.argument("run_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["saved_model"]), default="saved_model",
              show_default=True, help="What to write.")
@click.option("--output", type=click.Path(path_type=Path), default=None, metavar="DIR",
              help="Where to write it (must not exist). Default: RUN_DIR/saved_model.")
def export_model(run_dir: Path, fmt: str, output: Path | None) -> None:
    """Export RUN_DIR/model.keras for serving: uint8 images in, class probabilities out.

    The SavedModel's serving_default signature takes a batch of uint8 images
    of any size with the model's channels, scales and resizes them as
    training did, and returns {"probabilities": [batch, classes]}. It loads
    with tf.saved_model.load or TensorFlow Serving, without mirrorkit.
    Nothing is overwritten. An empty, truncated or damaged model.keras is
    named in one line before TensorFlow starts.

    \b
    Examples:
      mirrorkit export-model runs/20261203-101500-cnn-digits
      mirrorkit export-model runs/a --output serving/digits/1
    """
    from mirrorkit import _env

    _env.quiet_tensorflow()
    with user_errors():
        source = run_dir / "model.keras"
        if not source.is_file():
            raise FileNotFoundError(
                f"Not a mirrorkit run: {source} does not exist (a run directory holds the "
                f"model.keras that `mirrorkit train` wrote). Received: RUN_DIR={str(run_dir)!r}")
        target = output if output is not None else run_dir / "saved_model"
        if target.exists():
            raise FileExistsError(f"{target} already exists; nothing was overwritten. Pass "
                                  "--output with a new folder.")
        from mirrorkit.training.run_files import check_model_archive

        # Before TensorFlow loads: Keras calls an empty or cut-short file "not found".
        check_model_archive(source)
        import keras

        import mirrorkit.schedules  # noqa: F401 -- registers WarmupSchedule for load_model
        from mirrorkit.training.serving import export_saved_model

        try:
            model = keras.models.load_model(source)   # safe mode: no code from the file
        except (ValueError, TypeError, KeyError, OSError) as err:
            # A whole archive whose content Keras cannot rebuild (edited config, other model).
            raise UserInputError(f"{source} is a zip archive Keras cannot load as a model: "
                                 f"{type(err).__name__}: {' '.join(str(err).split())[:300]}") \
                from err
        export_saved_model(model, target)
    click.echo(f"wrote {target}/ ({fmt}: serving_default takes uint8 images "
               f"[batch, height, width, {model.input_shape[-1]}])")
