"""``tfds:NAME``: a TensorFlow Datasets image-classification dataset, offline by default.

``tensorflow_datasets`` is imported only here, when a ``tfds:`` dataset is
loaded (it takes seconds to import). Nothing is downloaded unless
``download=True``: a dataset that is not prepared in the data directory is an
error that says how to prepare it.

Example:
    >>> data = load_tfds("mnist", DataOptions(data_dir="/data/tfds"))  # doctest: +SKIP
    >>> data.image_shape                                               # doctest: +SKIP
    (28, 28, 1)
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from mirrorkit.datasets._base import DataOptions, ImageData, decode_fn
from mirrorkit.errors import MissingDependency, UserInputError

# Used when the dataset has neither a "validation" nor a "test" split.
_HOLDOUT = "[90%:]"


def _import_tfds() -> Any:
    try:
        import tensorflow_datasets as tfds
    except ImportError as err:  # pragma: no cover - a declared dependency
        raise MissingDependency(
            "tfds: datasets need tensorflow-datasets: pip install 'tensorflow-datasets>=4.9.10' "
            "importlib_resources") from err
    return tfds


def _close_matches(tfds: Any, name: str, data_dir: str | None) -> list[str]:
    known = set(tfds.list_builders(with_community_datasets=False))
    if data_dir and Path(data_dir).is_dir():
        # Datasets written with store_as_tfds_dataset are not registered.
        known.update(p.name for p in Path(data_dir).iterdir() if p.is_dir())
    return difflib.get_close_matches(name, sorted(known), n=5, cutoff=0.6)


def _builder(tfds: Any, name: str, options: DataOptions) -> Any:
    spec = f"tfds:{name}"
    try:
        return tfds.builder(name, data_dir=options.data_dir)
    except tfds.core.registered.DatasetNotFoundError as err:
        matches = _close_matches(tfds, name.split("/")[0].split(":")[0], options.data_dir)
        hint = f" Did you mean: {', '.join('tfds:' + m for m in matches)}?" if matches else (
            " See https://www.tensorflow.org/datasets/catalog for names.")
        where = f" in {options.data_dir}" if options.data_dir else ""
        raise UserInputError(
            f"Unknown TFDS dataset {name!r} (not registered and not found{where})."
            f"{hint} Received: dataset={spec!r}") from err


def _prepare(tfds: Any, builder: Any, name: str, options: DataOptions) -> None:
    if builder.is_prepared():
        return
    root = options.data_dir or str(builder.data_dir_root)
    if not options.download:
        raise UserInputError(
            f"TFDS dataset {name!r} is not prepared in {root}. Prepare it with "
            f"`tfds build {name} --data_dir {root}`, or pass --download "
            f"(download=True) to download it now. Received: dataset='tfds:{name}'")
    builder.download_and_prepare()


def _keys(builder: Any, spec: str) -> tuple[str, str]:
    info = builder.info
    if info.supervised_keys and len(info.supervised_keys) == 2:
        image_key, label_key = info.supervised_keys
        if isinstance(image_key, str) and isinstance(label_key, str):
            return image_key, label_key
    features = info.features
    images = [k for k, f in features.items() if type(f).__name__ == "Image"]
    labels = [k for k, f in features.items() if type(f).__name__ == "ClassLabel"]
    if len(images) != 1 or len(labels) != 1:
        raise UserInputError(
            f"{spec} is not an image-classification dataset mirrorkit can read: it needs "
            f"one Image and one ClassLabel feature (or supervised keys). Received: "
            f"features={list(features)}")
    return images[0], labels[0]


def _splits(builder: Any, options: DataOptions, spec: str) -> tuple[str, str]:
    splits = builder.info.splits
    train = options.train_split
    val = options.val_split
    if val is None:
        val = next((s for s in ("validation", "test") if s in splits), None)
    if val is None:
        # Hold out the end of the training split, and train on the rest.
        base = train.split("[")[0]
        if train != base:
            raise UserInputError(
                f"{spec} has no validation or test split; with a sliced train split "
                f"pass --val-split too. Received: train_split={train!r}")
        train, val = f"{base}[:90%]", f"{base}{_HOLDOUT}"
    for name in (train, val):
        try:
            splits[name].num_examples
        except (KeyError, ValueError, AssertionError) as err:
            raise UserInputError(
                f"{spec} has no split {name!r}; it has {', '.join(sorted(splits))} "
                f"(slices like 'train[:80%]' work too). Received: split={name!r}") from err
    return train, val


def load_tfds(name: str, options: DataOptions | None = None) -> ImageData:
    """Load ``tfds:NAME`` from a data directory, offline unless ``download``.

    Images are read encoded and decoded in the pipeline (after shuffling),
    files are not shuffled (every worker must see the same order for DATA
    sharding; the pipeline shuffles examples).

    Args:
        name: the TFDS name, e.g. ``"mnist"`` or ``"mnist:3.0.1"``.
        options: ``data_dir``, ``download``, ``train_split``, ``val_split``,
            ``image_size`` (required when the dataset's images vary in size)
            and ``channels`` apply.

    Returns:
        An :class:`ImageData` over ``tf.data`` datasets of encoded images.

    Raises:
        UserInputError: unknown name (close matches listed), not prepared and
            ``download`` False (says how to prepare), no such split, not an
            image-classification dataset, or varying image sizes without
            ``image_size``.

    Example:
        >>> load_tfds("mnist", DataOptions(data_dir="/data/tfds")).num_classes  # doctest: +SKIP
        10
    """
    options = options or DataOptions()
    spec = f"tfds:{name}"
    if not name:
        raise UserInputError(
            "Missing TFDS dataset name, e.g. tfds:mnist. Received: dataset='tfds:'")
    tfds = _import_tfds()
    builder = _builder(tfds, name, options)
    _prepare(tfds, builder, name, options)
    image_key, label_key = _keys(builder, spec)
    train_split, val_split = _splits(builder, options, spec)
    feature = builder.info.features[image_key]
    height, width, source_channels = (tuple(feature.shape) + (None,) * 3)[:3]
    size = options.image_size or (height, width)
    if size[0] is None or size[1] is None:
        raise UserInputError(
            f"{spec} has images of varying size; pass --image-size (image_size) to "
            f"resize them. Received: image_shape={tuple(feature.shape)}")
    channels = options.channels or (1 if source_channels == 1 else 3)
    label_feature = builder.info.features[label_key]

    def read(split: str) -> Any:
        ds = builder.as_dataset(split=split, shuffle_files=False,
                                decoders={image_key: tfds.decode.SkipDecoding()})
        return ds.map(lambda ex: (ex[image_key], ex[label_key]))

    return ImageData(
        name=spec,
        train=read(train_split),
        val=read(val_split),
        image_shape=(int(size[0]), int(size[1]), channels),
        num_classes=int(label_feature.num_classes),
        train_examples=int(builder.info.splits[train_split].num_examples),
        val_examples=int(builder.info.splits[val_split].num_examples),
        map_fn=decode_fn((int(size[0]), int(size[1])), channels),
        class_names=tuple(label_feature.names),
        description=f"TFDS, splits {train_split!r}/{val_split!r}, {builder.data_dir}",
    )
