"""Image-classification data sources by name: digits, synthetic, tfds:, folder:, files:.

=================  ==========================================================
spec               data
=================  ==========================================================
``digits``         embedded: the UCI 1,797 8x8 grayscale handwritten digits
                   (as scikit-learn ships them), 10 classes, fixed 80/20
                   stratified split; :func:`digits_arrays` gives the arrays
``synthetic``      random images of ``image_size`` x ``channels``, ``classes``,
                   ``examples``; generated on the fly (benchmarks)
``tfds:NAME``      a TensorFlow Datasets dataset in ``data_dir``; offline
                   unless ``download``
``folder:PATH``    one subfolder per class of JPEG/PNG/BMP/GIF files
``files:GLOB``     TFRecord shards of PNG images + labels (schema in
                   :mod:`mirrorkit.datasets.tfrecord`); sharded by file
=================  ==========================================================

Every source returns an :class:`ImageData` whose examples become float32
images in [0, 1] and integer labels, ready for
:func:`mirrorkit.data.train_pipeline`. Importing this package does not import
TensorFlow; call :func:`mirrorkit.get_strategy` before :func:`load` (loading
may run TensorFlow ops, after which devices can no longer be split).

Example:
    >>> import mirrorkit.datasets as mds
    >>> data = mds.load("digits")
    >>> data.num_classes, data.image_shape
    (10, (8, 8, 1))
"""

from __future__ import annotations

import difflib
from pathlib import Path

from mirrorkit.datasets._base import DataOptions, ImageData, normalize_image_size
from mirrorkit.datasets.builtin import digits_arrays
from mirrorkit.datasets.tfrecord import METADATA, export_tfrecords
from mirrorkit.errors import UserInputError

__all__ = [
    "DataOptions",
    "ImageData",
    "METADATA",
    "SOURCES",
    "digits_arrays",
    "export_tfrecords",
    "load",
    "normalize_image_size",
    "parse_spec",
]

# How a user names each source, for help text and error messages.
SOURCES = ("digits", "synthetic", "tfds:NAME", "folder:PATH", "files:GLOB")
_PREFIXED = ("tfds", "folder", "files")


def parse_spec(spec: str) -> tuple[str, str]:
    """Split a dataset spec into ``(kind, argument)``.

    Raises:
        UserInputError: for an unknown source or a missing argument, listing the
            valid sources and close matches.

    Example:
        >>> parse_spec("tfds:mnist"), parse_spec("digits")
        (('tfds', 'mnist'), ('digits', ''))
    """
    if not isinstance(spec, str) or not spec.strip():
        raise UserInputError(
            f"`dataset` must be one of {', '.join(SOURCES)}. Received: dataset={spec!r}")
    kind, sep, arg = spec.strip().partition(":")
    if not sep and kind in ("digits", "synthetic"):
        return kind, ""
    if sep and kind in _PREFIXED:
        if not arg:
            example = dict(zip(_PREFIXED, SOURCES[2:]))[kind]
            raise UserInputError(f"`dataset` {kind}: needs a value, e.g. {example}. "
                                 f"Received: dataset={spec!r}")
        return kind, arg
    names = ["digits", "synthetic", "tfds:", "folder:", "files:"]
    close = difflib.get_close_matches(kind + sep, names, n=2, cutoff=0.6)
    if not sep and Path(kind).expanduser().is_dir():
        close = [f"folder:{kind}"]
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    raise UserInputError(
        f"Unknown dataset.{hint} Valid: {', '.join(SOURCES)}. Received: dataset={spec!r}")


def load(spec: str = "digits", options: DataOptions | None = None) -> ImageData:
    """Load a dataset by spec (see the table in the module docstring).

    Args:
        spec: ``"digits"``, ``"synthetic"``, ``"tfds:NAME"``,
            ``"folder:PATH"`` or ``"files:GLOB"``. Defaults to ``"digits"``.
        options: :class:`DataOptions`; each source reads the ones that apply.

    Returns:
        An :class:`ImageData`.

    Raises:
        UserInputError: unknown source or a problem with the data (one clear
            sentence naming the file, folder or dataset).
        FileNotFoundError: a path that does not exist or matches nothing.
        NotADirectoryError: ``folder:`` on a file.

    Example:
        >>> import mirrorkit.datasets as mds
        >>> mds.load("synthetic", mds.DataOptions(image_size=16, examples=64)).train_examples
        64
    """
    kind, arg = parse_spec(spec)
    options = options or DataOptions()
    if kind == "digits":
        from mirrorkit.datasets.builtin import load_digits

        return load_digits(options)
    if kind == "synthetic":
        from mirrorkit.datasets.builtin import load_synthetic

        return load_synthetic(options)
    if kind == "tfds":
        from mirrorkit.datasets.tfds_source import load_tfds

        return load_tfds(arg, options)
    if kind == "folder":
        from mirrorkit.datasets.folder import load_folder

        return load_folder(arg, options)
    from mirrorkit.datasets.tfrecord import load_files

    return load_files(arg, options)
