"""``files:GLOB`` TFRecord shards of encoded images, and :func:`export_tfrecords` to write them.

Schema of one record (a ``tf.train.Example``):

=============  ==========  =============================================
feature        type        meaning
=============  ==========  =============================================
``image``      bytes       the image, PNG-encoded (JPEG also decodes)
``label``      int64       class index, ``0 .. num_classes - 1``
``height``     int64       image height in pixels
``width``      int64       image width in pixels
``channels``   int64       1 (grayscale) or 3 (RGB)
=============  ==========  =============================================

``mirrorkit export`` writes ``train-00000-of-0000K.tfrecord`` ...,
``val-00000-of-0000K.tfrecord`` ... and ``mirrorkit-dataset.json`` (classes,
image shape, the files and example count of each split) into one directory.

Multi-worker training shards these by file (tf.data's FILE auto-shard
policy): with at least as many training files as workers, each worker reads
only its own files; see :func:`mirrorkit.data.shard_policy`.

Example:
    >>> export_tfrecords("digits", "/tmp/digits-shards", shards=4)       # doctest: +SKIP
    >>> load_files("/tmp/digits-shards").train_files                      # doctest: +SKIP
    4
"""

from __future__ import annotations

import glob
import json
from pathlib import Path
from typing import Any

from mirrorkit.datasets._base import (
    DataOptions,
    ImageData,
    check_positive_int,
    tf_error_text,
)
from mirrorkit.datasets.jpeg_crops import ImageDecoder
from mirrorkit.errors import UserInputError

METADATA = "mirrorkit-dataset.json"
FORMAT = "mirrorkit-tfrecord-v1"


def _feature_spec(tf: Any) -> dict[str, Any]:
    return {
        "image": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "height": tf.io.FixedLenFeature([], tf.int64, default_value=0),
        "width": tf.io.FixedLenFeature([], tf.int64, default_value=0),
        "channels": tf.io.FixedLenFeature([], tf.int64, default_value=0),
    }


def _glob(pattern: str) -> list[str]:
    return sorted(glob.glob(str(Path(pattern).expanduser())))


def _read_metadata(folder: Path) -> dict[str, Any] | None:
    path = folder / METADATA
    if not path.is_file():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UserInputError(f"Cannot read {path}: {err}") from err
    if meta.get("format") != FORMAT:
        raise UserInputError(f"{path} is not a {FORMAT} metadata file. Received: "
                             f"format={meta.get('format')!r}")
    return meta


def _scan(tf: Any, files: list[str]) -> dict[str, Any]:
    """Count examples and classes and take the first image's shape, file by file."""
    spec = _feature_spec(tf)
    count, top, shape = 0, -1, None
    for path in files:
        try:
            for record in tf.data.TFRecordDataset(path).batch(1024):
                ex = tf.io.parse_example(record, spec)
                labels = ex["label"].numpy()
                count += len(labels)
                top = max(top, int(labels.max()))
                if shape is None:
                    first = tf.io.decode_image(ex["image"][0], expand_animations=False)
                    shape = [int(d) for d in first.shape]
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as err:
            raise UserInputError(
                f"Cannot read TFRecord file {path} as mirrorkit image records "
                f"(image bytes + label int64): {tf_error_text(err)}") from err
    return {"examples": count, "num_classes": top + 1, "image_shape": shape}


def _resolve(pattern: str, options: DataOptions,
             spec: str) -> tuple[list[str], list[str], dict[str, Any] | None]:
    root = Path(pattern).expanduser()
    if root.is_dir():
        meta = _read_metadata(root)
        if meta is not None:
            train = [str(root / f) for f in meta["splits"]["train"]["files"]]
            val = [str(root / f) for f in meta["splits"]["val"]["files"]]
        else:
            train, val = _glob(str(root / "train-*.tfrecord")), _glob(str(root / "val-*.tfrecord"))
        if options.val_files:
            val = _glob(options.val_files)
        if not train:
            raise FileNotFoundError(
                f"No training shards in {root}: expected {METADATA} or train-*.tfrecord "
                f"(written by `mirrorkit export`). Received: dataset={spec!r}")
    else:
        train = _glob(pattern)
        if not train:
            raise FileNotFoundError(f"No files match {pattern!r}. Received: dataset={spec!r}")
        meta = _read_metadata(Path(train[0]).parent)
        listed = set()
        if meta is not None:
            listed = {str(Path(train[0]).parent / f) for f in meta["splits"]["train"]["files"]}
        if options.val_files:
            val = _glob(options.val_files)
        elif meta is not None and set(train) == listed:
            val = [str(Path(train[0]).parent / f) for f in meta["splits"]["val"]["files"]]
        else:
            val = []
        if meta is not None and set(train) != listed:
            meta = None  # a subset: its counts do not apply.
    if not val:
        raise FileNotFoundError(
            f"No validation shards for {spec}: pass --val-files GLOB (val_files=...). "
            f"Received: val_files={options.val_files!r}")
    overlap = sorted(set(train) & set(val))
    if overlap:
        raise UserInputError(f"Files are both training and validation shards: {overlap[0]}. "
                             f"Received: dataset={spec!r}, val_files={options.val_files!r}")
    return train, val, meta


def load_files(pattern: str, options: DataOptions | None = None) -> ImageData:
    """Load ``files:GLOB`` (or ``files:DIR`` written by :func:`export_tfrecords`).

    Args:
        pattern: a glob of training shards, or a directory written by
            ``mirrorkit export`` (its metadata lists both splits).
        options: ``val_files`` (required for a bare glob without metadata),
            ``image_size`` (default: the first image's size) and ``channels``
            (default: the first image's), ``augment`` (``"crop"``: JPEG
            records are decoded only inside the crop window) and ``cache`` apply.

    Returns:
        An :class:`ImageData` whose training data reads its files one after the
        other (``train_files`` set, so multi-worker runs shard by file).

    Raises:
        FileNotFoundError: when nothing matches or no validation shards are found.
        UserInputError: for files that are not mirrorkit image records.

    Example:
        >>> options = DataOptions(val_files="/data/shards/val-*.tfrecord")
        >>> data = load_files("/data/shards/train-*.tfrecord", options)  # doctest: +SKIP
    """
    import tensorflow as tf

    options = options or DataOptions()
    spec = f"files:{pattern}"
    train, val, meta = _resolve(pattern, options, spec)
    if meta is not None and not options.val_files:
        counts = {s: meta["splits"][s]["examples"] for s in ("train", "val")}
        num_classes, shape = int(meta["num_classes"]), list(meta["image_shape"])
        names = tuple(meta.get("class_names") or ())
    else:
        train_scan, val_scan = _scan(tf, train), _scan(tf, val)
        counts = {"train": train_scan["examples"], "val": val_scan["examples"]}
        num_classes = max(train_scan["num_classes"], val_scan["num_classes"])
        shape, names = train_scan["image_shape"], ()
    if not counts["train"] or shape is None:
        raise UserInputError(f"The training shards of {spec} hold no examples.")
    if num_classes < 2:
        raise UserInputError(f"{spec} has labels of a single class; a classifier needs at "
                             f"least 2. Received: num_classes={num_classes}")
    size = options.image_size or (shape[0], shape[1])
    channels = options.channels or (1 if shape[2] in (1, 2) else 3)
    parse_spec = _feature_spec(tf)

    def read(files: list[str]) -> Any:
        # Files first, then records: tf.data's FILE auto-shard policy finds the
        # file list at the root and gives each worker its own files.
        ds = tf.data.Dataset.from_tensor_slices(files)
        ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

        def parse(record: Any) -> tuple[Any, Any]:
            ex = tf.io.parse_single_example(record, parse_spec)
            return ex["image"], ex["label"]

        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        return ds.cache() if options.cache else ds

    decoder = ImageDecoder(size, channels, augment=options.augment, uint8=options.uint8)
    notes = [f"{len(train)} train / {len(val)} val files", decoder.describe()]
    if options.cache:
        megabytes = sum(Path(f).stat().st_size for f in train + val) / 1e6
        notes.append(f"records cached in memory ({megabytes:,.0f} MB)")

    return ImageData(
        name=spec,
        train=read(train),
        val=read(val),
        image_shape=(int(size[0]), int(size[1]), channels),
        num_classes=num_classes,
        train_examples=int(counts["train"]),
        val_examples=int(counts["val"]),
        map_fn=decoder,
        class_names=names,
        train_files=len(train),
        description="TFRecord shards, " + "; ".join(notes),
        pixel_max=decoder.pixel_max,
    )


def export_tfrecords(data: ImageData, output_dir: str | Path, *, shards: int = 4) -> dict[str, Any]:
    """Write a dataset as TFRecord shards that ``files:`` reads (schema above).

    Examples are dealt round-robin to the shards, so shards hold nearly equal
    counts and every class. Images are written as PNG after the dataset's own
    decoding and resizing (what training would see, rounded to 8 bits).

    Args:
        data: a loaded dataset (:func:`mirrorkit.datasets.load`).
        output_dir: a new or empty directory.
        shards: files per split. Use at least as many as the workers that
            will read them, so each worker gets its own files. Defaults to 4.

    Returns:
        The metadata written to ``mirrorkit-dataset.json``: ``num_classes``,
        ``class_names``, ``image_shape``, ``source`` and per split its
        ``files`` and ``examples``.

    Raises:
        UserInputError: for ``shards`` < 1, a split with fewer examples than
            shards, or an ``output_dir`` that already holds shards or metadata.

    Example:
        >>> import mirrorkit.datasets as mds
        >>> meta = mds.export_tfrecords(mds.load("digits"), "/tmp/d", shards=2)  # doctest: +SKIP
        >>> meta["splits"]["train"]["files"]                                    # doctest: +SKIP
        ['train-00000-of-00002.tfrecord', 'train-00001-of-00002.tfrecord']
    """
    import tensorflow as tf

    shards = check_positive_int("shards", shards)
    out = Path(output_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(
            f"Not a directory: {out}. Received: output_dir={str(output_dir)!r}")
    if out.is_dir() and (list(out.glob("*.tfrecord")) or (out / METADATA).exists()):
        raise UserInputError(
            f"{out} already holds TFRecord shards; choose a new directory (nothing "
            f"was overwritten). Received: output_dir={str(output_dir)!r}")
    for split, n in (("train", data.train_examples), ("val", data.val_examples)):
        if n < shards:
            raise UserInputError(f"The {split} split has {n} examples, fewer than shards={shards}. "
                                 f"Received: shards={shards}")
    out.mkdir(parents=True, exist_ok=True)
    h, w, c = data.image_shape
    meta: dict[str, Any] = {
        "format": FORMAT, "source": data.name, "num_classes": data.num_classes,
        "class_names": list(data.class_names), "image_shape": [h, w, c], "splits": {},
    }

    def encode(image: Any, label: Any) -> tuple[Any, Any]:
        if image.dtype == tf.uint8:   # DataOptions(uint8=True): the pixels already
            return tf.io.encode_png(image), label
        # Round to the nearest 8-bit value (convert_image_dtype truncates).
        pixels = tf.cast(tf.round(tf.clip_by_value(image, 0.0, 1.0) * 255.0), tf.uint8)
        return tf.io.encode_png(pixels), label

    for split in ("train", "val"):
        names = [f"{split}-{i:05d}-of-{shards:05d}.tfrecord" for i in range(shards)]
        writers = [tf.io.TFRecordWriter(str(out / n)) for n in names]
        count = 0
        try:
            ds = data.examples(split).map(encode, num_parallel_calls=tf.data.AUTOTUNE)
            for png, label in ds.as_numpy_iterator():
                example = tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[png])),
                    "label": _int64(tf, label), "height": _int64(tf, h),
                    "width": _int64(tf, w), "channels": _int64(tf, c),
                }))
                writers[count % shards].write(example.SerializeToString())
                count += 1
        finally:
            for writer in writers:
                writer.close()
        meta["splits"][split] = {"files": names, "examples": count}
    (out / METADATA).write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def _int64(tf: Any, value: Any) -> Any:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
