"""What every dataset source returns, the options they read, and shared helpers.

Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import dataclasses
import numbers
import re
from typing import Any, Callable

from mirrorkit._checks import check_positive_int  # noqa: F401 -- the sources import it from here
from mirrorkit.errors import UserInputError

# Validation is held out with this seed, never with the training seed, so the
# validation set (and so every reported accuracy) is the same from run to run.
SPLIT_SEED = 0


def tf_error_text(err: BaseException) -> str:
    """The first line of a TensorFlow error without its op/device decorations.

    Example:
        >>> tf_error_text(ValueError("{{function_node x}} Invalid PNG. [Op:DecodeImage] name: "))
        'Invalid PNG.'
    """
    text = (getattr(err, "message", None) or str(err) or type(err).__name__).splitlines()[0]
    text = re.sub(r"\{\{[^}]*\}\}|\[Op:[^\]]*\]|\bname:\s*\S*\s*$", "", text)
    return " ".join(text.split()) or type(err).__name__


def normalize_image_size(value: Any) -> tuple[int, int] | None:
    """Turn ``32``, ``(32, 48)`` or ``"32x48"`` into ``(height, width)``.

    Example:
        >>> normalize_image_size("32x48"), normalize_image_size(28), normalize_image_size(None)
        ((32, 48), (28, 28), None)
    """
    if value is None:
        return None
    raw = value
    if isinstance(value, str):
        parts = value.lower().replace(",", "x").split("x")
        try:
            value = tuple(int(p) for p in parts)
        except ValueError:
            value = ()
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = (int(value), int(value))
    if (not isinstance(value, (tuple, list)) or len(value) not in (1, 2)
            or any(isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1
                   for v in value)):
        raise UserInputError(
            "`image_size` must be a positive integer N (N x N) or HEIGHTxWIDTH. "
            f"Received: image_size={raw!r}"
        )
    return (int(value[0]), int(value[-1]))


@dataclasses.dataclass(frozen=True)
class DataOptions:
    """How to read a dataset; each source uses only the options that concern it.

    Attributes:
        image_size: ``(height, width)`` (or N, or ``"HxW"``) every image is
            resized to. Defaults to None: the source's own size (``folder:`` and
            ``files:``: the first image's; ``synthetic``: 32x32).
        channels: 1 (grayscale) or 3 (RGB) channels to convert images to.
            Defaults to None: the source's own (``synthetic``: 3).
        classes: classes of ``synthetic`` data. Defaults to 10.
        examples: training examples of ``synthetic`` data (validation gets a
            fifth as many). Defaults to 1024.
        data_dir: ``tfds:`` data directory. Defaults to TFDS's own
            (``TFDS_DATA_DIR``, else ``~/tensorflow_datasets``).
        download: let ``tfds:`` download and prepare a dataset that is not on
            disk. Defaults to False: never touch the network.
        train_split: ``tfds:`` split to train on. Defaults to ``"train"``.
        val_split: ``tfds:`` split to validate on. Defaults to ``validation``,
            else ``test``, else the last 10% of the training split.
        val_fraction: ``folder:`` without ``train/`` and ``val/`` subfolders:
            the fraction of every class held out for validation. Defaults to 0.2.
        val_files: ``files:`` glob of the validation shards. Defaults to the
            ``val`` shards listed by ``mirrorkit export``'s metadata file.
        augment: ``folder:`` and ``files:``: ``"crop"`` decodes training
            images to a random-resized-crop (the flip that goes with it is
            a model layer: ``mirrorkit train`` adds it) and validation
            images to a center crop (:mod:`mirrorkit.datasets.jpeg_crops`). Defaults to
            ``"none"``: the whole image, resized.
        cache: ``folder:`` and ``files:``: keep the encoded images in memory
            after the first epoch. Defaults to False.
        uint8: ``folder:`` and ``files:``: give uint8 pixels 0..255 (a
            quarter of float32's bytes to batch and to copy to the device;
            :attr:`ImageData.pixel_max` is then 255 and ``mirrorkit train``'s
            model rescales them itself) instead of float32 in [0, 1].
            Defaults to False.

    Example:
        >>> DataOptions(image_size="32x32").image_size
        (32, 32)
    """

    image_size: tuple[int, int] | None = None
    channels: int | None = None
    classes: int = 10
    examples: int = 1024
    data_dir: str | None = None
    download: bool = False
    train_split: str = "train"
    val_split: str | None = None
    val_fraction: float = 0.2
    val_files: str | None = None
    augment: str = "none"
    cache: bool = False
    uint8: bool = False

    def __post_init__(self) -> None:
        from mirrorkit.datasets.jpeg_crops import check_augment

        object.__setattr__(self, "image_size", normalize_image_size(self.image_size))
        check_augment(self.augment)
        if self.channels is not None and self.channels not in (1, 3):
            raise UserInputError(
                "`channels` must be 1 (grayscale) or 3 (RGB). "
                f"Received: channels={self.channels!r}")
        check_positive_int("classes", self.classes)
        check_positive_int("examples", self.examples)
        frac = self.val_fraction
        if isinstance(frac, bool) or not isinstance(frac, numbers.Real) or not 0 < frac < 1:
            raise UserInputError(
                f"`val_fraction` must be a number between 0 and 1 (exclusive). "
                f"Received: val_fraction={frac!r}")


@dataclasses.dataclass(frozen=True)
class ImageData:
    """An image-classification dataset, ready for :mod:`mirrorkit.data` pipelines.

    ``train`` and ``val`` are what :func:`mirrorkit.data.train_pipeline` takes:
    a tuple ``(x, y)`` of NumPy arrays, or an unbatched ``tf.data.Dataset`` of
    ``(x, label)``. ``x`` may still be encoded (bytes) or at the source's
    size: ``map_fn`` turns one example into ``(image, label)`` with an
    ``image`` of :attr:`image_shape`: float32 in [0, 1], or uint8 0..255
    (:attr:`pixel_max` 255, ``DataOptions(uint8=True)``). Pipelines apply it after
    shuffling, so the shuffle buffer holds small encoded examples. A
    ``map_fn`` with a ``train_fn`` attribute that is not None
    (:class:`~mirrorkit.datasets.jpeg_crops.ImageDecoder`) has a random
    training variant ``train_fn(x, label, seed)``.

    Attributes:
        name: the dataset spec, e.g. ``"digits"`` or ``"tfds:mnist"``.
        train: training examples (see above).
        val: validation examples (see above).
        image_shape: ``(height, width, channels)`` after ``map_fn``.
        num_classes: number of classes; labels are ``0 .. num_classes - 1``.
        train_examples: examples in ``train``.
        val_examples: examples in ``val``.
        map_fn: per-example decode/resize function, or None.
        class_names: names of the classes, in label order.
        train_files: files ``train`` reads, when it reads files one after the
            other (enables FILE sharding: each worker reads its own files).
        description: where the data comes from, in a few words.
        pixel_max: the value of a white pixel in the images ``map_fn``
            gives: 1.0 (float32 in [0, 1]) or 255 (uint8). A model for them
            divides by it first (``build_model(pixel_max=...)``).

    Example:
        >>> import mirrorkit.datasets as mds
        >>> data = mds.load("digits")
        >>> data.image_shape, data.num_classes, data.train_examples + data.val_examples
        ((8, 8, 1), 10, 1797)
    """

    name: str
    train: Any
    val: Any
    image_shape: tuple[int, int, int]
    num_classes: int
    train_examples: int
    val_examples: int
    map_fn: Callable[..., Any] | None = None
    class_names: tuple[str, ...] = ()
    train_files: int | None = None
    description: str = ""
    pixel_max: float = 1.0

    def summary(self) -> str:
        """One line: name, sizes, shape, classes.

        Example:
            >>> import mirrorkit.datasets as mds
            >>> print(mds.load("digits").summary())  # doctest: +NORMALIZE_WHITESPACE
            digits: 1,438 train / 359 val images, 8x8x1, 10 classes (UCI handwritten digits,
            embedded)
        """
        h, w, c = self.image_shape
        text = (f"{self.name}: {self.train_examples:,} train / {self.val_examples:,} val "
                f"images, {h}x{w}x{c}, {self.num_classes} classes")
        return f"{text} ({self.description})" if self.description else text

    def examples(self, split: str = "train") -> Any:
        """The decoded, unbatched ``tf.data.Dataset`` of ``(image, label)`` of a split.

        Args:
            split: ``"train"`` or ``"val"``.

        Example:
            >>> import mirrorkit.datasets as mds
            >>> image, label = next(iter(mds.load("digits").examples("val")))
            >>> tuple(image.shape)
            (8, 8, 1)
        """
        import tensorflow as tf

        if split not in ("train", "val"):
            raise ValueError(f"`split` must be 'train' or 'val'. Received: split={split!r}")
        source = self.train if split == "train" else self.val
        ds = source if isinstance(source, tf.data.Dataset) else (
            tf.data.Dataset.from_tensor_slices(tuple(source)))
        return ds.map(self.map_fn, num_parallel_calls=tf.data.AUTOTUNE) if self.map_fn else ds


def stratified_split(labels: Any, fraction: float, seed: int = SPLIT_SEED) -> tuple[Any, Any]:
    """Indices ``(train, val)`` holding out ``fraction`` of every class.

    Deterministic for a given ``seed``; both index arrays come back sorted.

    Example:
        >>> import numpy as np
        >>> train, val = stratified_split(np.array([0, 0, 0, 0, 1, 1, 1, 1, 1]), 0.25)
        >>> len(train), len(val)
        (7, 2)
    """
    import numpy as np

    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    train, val = [], []
    for label in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == label))
        n_val = int(round(len(idx) * fraction))
        val.append(idx[:n_val])
        train.append(idx[n_val:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


def convert_fn(image_size: tuple[int, int] | None, channels: int | None,
               source_channels: int) -> Callable[..., Any] | None:
    """A ``map_fn`` resizing float images and converting their channels, or None.

    Example:
        >>> convert_fn(None, None, 1) is None
        True
        >>> image, _ = convert_fn((4, 4), 3, 1)(tf.zeros((8, 8, 1)), 0)  # doctest: +SKIP
        >>> tuple(image.shape)                                          # doctest: +SKIP
        (4, 4, 3)
    """
    if image_size is None and (channels is None or channels == source_channels):
        return None

    def convert(image: Any, label: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        image = _to_channels(tf, image, source_channels, channels)
        if image_size is not None:
            image = tf.image.resize(image, image_size)
        return image, label

    return convert


def decode_fn(image_size: tuple[int, int], channels: int) -> Callable[..., Any]:
    """A ``map_fn`` decoding PNG/JPEG/BMP/GIF bytes to float32 ``image_size x channels``.

    Example:
        >>> decode = decode_fn((32, 32), 3)
        >>> image, label = decode(tf.io.read_file("cat.png"), 0)   # doctest: +SKIP
        >>> tuple(image.shape)                                      # doctest: +SKIP
        (32, 32, 3)
    """

    def decode(encoded: Any, label: Any) -> tuple[Any, Any]:
        import tensorflow as tf

        # dtype=float32 scales to [0, 1]; expand_animations=False gives a GIF's
        # first frame as one 3-D image, as Keras's image loaders do.
        image = tf.io.decode_image(encoded, channels=channels, dtype=tf.float32,
                                   expand_animations=False)
        image.set_shape([None, None, channels])
        image = tf.image.resize(image, image_size)
        image.set_shape([image_size[0], image_size[1], channels])
        return image, label

    return decode


def _to_channels(tf: Any, image: Any, have: int, want: int | None) -> Any:
    if want is None or want == have:
        return image
    if want == 3:
        return tf.image.grayscale_to_rgb(image)
    return tf.image.rgb_to_grayscale(image)
