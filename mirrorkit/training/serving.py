"""A trained model as a TensorFlow SavedModel for serving: images in, probabilities out.

The signature ``serving_default`` takes a batch of ``uint8`` images of any
height and width with the model's channel count (what a camera or an
image decoder gives) and returns ``{"probabilities": [batch, classes]}``. The
preprocessing mirrorkit's pipelines do is inside: scale to ``[0, 1]``, then
resize to the size the model was trained at (skipped when the size already
matches). The model is copied out of its strategy first, so the SavedModel
holds plain variables whatever strategy trained it, and TensorFlow Serving,
``tf.saved_model.load`` or TFLite converters read it without mirrorkit.

Example:
    >>> export_saved_model(model, "runs/a/saved_model")          # doctest: +SKIP
    >>> served = tf.saved_model.load("runs/a/saved_model")      # doctest: +SKIP
    >>> served.signatures["serving_default"](images=uint8_batch)["probabilities"]  # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from mirrorkit.errors import UserInputError

FORMATS = ("saved_model",)
SIGNATURE = "serving_default"


def check_format(fmt: str) -> str:
    """Return ``fmt`` if it is an export format mirrorkit writes, else raise UserInputError.

    Example:
        >>> check_format("saved_model")
        'saved_model'
    """
    if fmt not in FORMATS:
        raise UserInputError(f"Unknown export format. Received: format={fmt!r}; "
                             f"accepted: {', '.join(FORMATS)}")
    return fmt


def export_saved_model(model: Any, path: str | os.PathLike, *, replace: bool = False) -> Path:
    """Write ``model`` as a SavedModel with a uint8-images serving signature.

    Call it outside ``strategy.scope()``; under a multi-worker strategy, on
    the chief only: it copies the weights locally (no collective) into a
    plain model.

    Args:
        model: a built Keras image classifier with a ``(H, W, C)`` input and a
            softmax output.
        path: a folder that must not exist yet, unless ``replace``.
        replace: remove an existing ``path`` first. Defaults to False.

    Returns:
        The folder written.

    Raises:
        FileExistsError: when ``path`` exists and not ``replace`` (nothing is
            overwritten).

    Example:
        >>> export_saved_model(model, "runs/a/saved_model")      # doctest: +SKIP
        PosixPath('runs/a/saved_model')
    """
    import keras
    import tensorflow as tf

    path = Path(path)
    if replace and path.exists():
        shutil.rmtree(path)
    if path.exists():
        raise FileExistsError(f"The export folder already exists; nothing was overwritten. "
                              f"Received: {path}")
    height, width, channels = model.input_shape[1:]
    rescales = any(layer.name == "rescale" for layer in model.layers)
    # A copy made outside the strategy's scope holds plain variables.
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())

    @tf.function(input_signature=[
        tf.TensorSpec([None, None, None, channels], tf.uint8, name="images")])
    def serve(images: Any) -> dict[str, Any]:
        # A model of uint8 data rescales them itself (its first layer).
        x = tf.cast(images, tf.float32) * (1.0 if rescales else 1.0 / 255.0)
        size = tf.shape(x)[1:3]
        x = tf.cond(tf.reduce_all(size == [height, width]), lambda: x,
                    lambda: tf.image.resize(x, (height, width)))
        x = tf.ensure_shape(x, [None, height, width, channels])
        return {"probabilities": copy(x, training=False)}

    archive = keras.export.ExportArchive()
    archive.track(copy)
    archive.add_endpoint(SIGNATURE, serve)
    archive.write_out(str(path), verbose=False)
    return path
