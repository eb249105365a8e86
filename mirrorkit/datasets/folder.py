"""``folder:PATH``: one subfolder per class of image files.

Layouts (``keras.utils.image_dataset_from_directory`` semantics: class names
are the subfolder names in sorted order, labels their index; formats
``.bmp .gif .jpeg .jpg .png``; other files are ignored)::

    PATH/cat/1.png, PATH/dog/2.jpg, ...          validation: --val-fraction of every class
    PATH/train/cat/..., PATH/val/cat/...        validation: PATH/val

Every image is decoded once when the dataset is loaded, so a corrupt or
mislabelled file is named up front rather than failing a training step
later with a bare decode error.

The pipeline reads and decodes each file in one parallel map
(:class:`~mirrorkit.datasets.jpeg_crops.ImageDecoder`); with
``augment="crop"`` a JPEG is decoded only inside its training or validation
crop window. ``cache=True`` keeps the encoded files in memory after the first
epoch (decoding and the random crops still run every epoch).

Example:
    >>> data = load_folder("photos/")                  # doctest: +SKIP
    >>> data.class_names                               # doctest: +SKIP
    ('cat', 'dog')
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mirrorkit.datasets._base import (
    DataOptions,
    ImageData,
    stratified_split,
    tf_error_text,
)
from mirrorkit.datasets.jpeg_crops import ImageDecoder
from mirrorkit.errors import UserInputError

EXTENSIONS = (".bmp", ".gif", ".jpeg", ".jpg", ".png")


def _class_dirs(root: Path) -> list[Path]:
    return sorted((p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
                  key=lambda p: p.name)


def _images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*")
                  if p.is_file() and p.suffix.lower() in EXTENSIONS)


def _scan(root: Path, spec: str,
          classes: list[str] | None = None) -> tuple[list[str], list[str], list[int]]:
    """Return ``(class_names, files, labels)`` of one layout level."""
    dirs = _class_dirs(root)
    names = [d.name for d in dirs]
    if classes is not None:
        unknown = sorted(set(names) - set(classes))
        if unknown:
            raise UserInputError(
                f"{root} has class folders that the training folder lacks: "
                f"{', '.join(unknown)}. Received: dataset={spec!r}")
        names = classes
    files: list[str] = []
    labels: list[int] = []
    for label, name in enumerate(names):
        for path in _images(root / name) if (root / name).is_dir() else []:
            files.append(str(path))
            labels.append(label)
    return names, files, labels


def _check_classes(names: list[str], files: list[str], labels: list[int], root: Path,
                   spec: str) -> None:
    if not files:
        raise UserInputError(
            f"No images found in {root}: expected one subfolder per class holding "
            f"{'/'.join(e.lstrip('.') for e in EXTENSIONS)} files. Received: dataset={spec!r}")
    used = sorted(set(labels))
    if len(used) < 2:
        only = names[used[0]] if used else "none"
        raise UserInputError(
            f"{root} has images of a single class ({only!r}); a classifier needs "
            f"at least 2 class subfolders. Received: dataset={spec!r}")
    empty = [names[i] for i in range(len(names)) if i not in set(used)]
    if empty:
        raise UserInputError(
            f"Class folder(s) without images in {root}: {', '.join(empty)}. Remove them "
            f"or add images. Received: dataset={spec!r}")


def _verify(files: list[str]) -> tuple[int, int, int]:
    """Decode every file; return the first one's (height, width, channels)."""
    import tensorflow as tf

    first = None
    for path in files:
        try:
            image = tf.io.decode_image(tf.io.read_file(path), expand_animations=False)
        except (tf.errors.InvalidArgumentError, tf.errors.NotFoundError,
                tf.errors.DataLossError) as err:
            raise UserInputError(f"Cannot decode image file {path}: {tf_error_text(err)} "
                                 "Remove or replace it.") from err
        if first is None:
            first = tuple(int(d) for d in image.shape)
    return first


def load_folder(path: str, options: DataOptions | None = None) -> ImageData:
    """Load ``folder:PATH``: one subfolder per class (see the module docstring).

    Args:
        path: the folder.
        options: ``image_size`` (default: the first image's size; others are
            resized to it), ``channels`` (default: 1 if the first image is
            grayscale, else 3), ``val_fraction`` (without ``train/`` +
            ``val/``; default 0.2 of every class, fixed seed), ``augment``
            and ``cache`` apply.

    Returns:
        An :class:`ImageData` that reads and decodes the files in the pipeline.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        NotADirectoryError: when it is not a folder.
        UserInputError: no images, a single class, an empty class folder, or a
            file that does not decode (named).

    Example:
        >>> data = load_folder("flowers/", DataOptions(image_size=64))  # doctest: +SKIP
        >>> data.image_shape                                           # doctest: +SKIP
        (64, 64, 3)
    """
    import numpy as np
    import tensorflow as tf

    options = options or DataOptions()
    spec = f"folder:{path}"
    root = Path(path).expanduser()
    if not root.exists():
        raise FileNotFoundError(f"Image folder not found: {root}. Received: dataset={spec!r}")
    if not root.is_dir():
        raise NotADirectoryError(f"Not a folder: {root}. Received: dataset={spec!r}")
    if (root / "train").is_dir() and (root / "val").is_dir():
        names, train_files, train_labels = _scan(root / "train", spec)
        _check_classes(names, train_files, train_labels, root / "train", spec)
        _, val_files, val_labels = _scan(root / "val", spec, classes=names)
        if not val_files:
            raise UserInputError(f"No images found in {root / 'val'}. Received: dataset={spec!r}")
        split_note = "train/ and val/ subfolders"
    else:
        names, files, labels = _scan(root, spec)
        _check_classes(names, files, labels, root, spec)
        train_idx, val_idx = stratified_split(np.array(labels), options.val_fraction)
        if len(val_idx) == 0:
            raise UserInputError(
                f"val_fraction={options.val_fraction} holds out no image of {root}; "
                f"raise it or add images. Received: dataset={spec!r}")
        train_files = [files[i] for i in train_idx]
        train_labels = [labels[i] for i in train_idx]
        val_files = [files[i] for i in val_idx]
        val_labels = [labels[i] for i in val_idx]
        split_note = f"{options.val_fraction:g} of every class held out"
    height, width, first_channels = _verify(train_files + val_files)
    channels = options.channels or (1 if first_channels in (1, 2) else 3)
    size = options.image_size or (height, width)

    cache = options.cache

    def read(files: list[str], labels: list[int]) -> Any:
        # File names, not bytes: the decoder reads each file in the same
        # parallel map that decodes it, and the shuffle buffer holds names.
        ds = tf.data.Dataset.from_tensor_slices((files, np.array(labels, dtype="int32")))
        if not cache:
            return ds
        return ds.map(lambda f, y: (tf.io.read_file(f), y),
                      num_parallel_calls=tf.data.AUTOTUNE).cache()

    decoder = ImageDecoder(size, channels, augment=options.augment, from_path=not cache,
                           uint8=options.uint8)
    notes = [split_note, decoder.describe()]
    if cache:
        megabytes = sum(Path(f).stat().st_size for f in train_files + val_files) / 1e6
        notes.append(f"encoded files cached in memory ({megabytes:,.0f} MB)")
    return ImageData(
        name=spec,
        train=read(train_files, train_labels),
        val=read(val_files, val_labels),
        image_shape=(size[0], size[1], channels),
        num_classes=len(names),
        train_examples=len(train_files),
        val_examples=len(val_files),
        map_fn=decoder,
        class_names=tuple(names),
        description="image files, " + "; ".join(notes),
        pixel_max=decoder.pixel_max,
    )
