"""Decode encoded images straight to the training crop: random-resized-crop, center crop.

The standard recipe for photos (Szegedy et al. 2015, "Inception"; what
tensorflow/models' ResNet preprocessing and torchvision's
``RandomResizedCrop`` do):

* training: a random window covering 8% to 100% of the image with an aspect
  ratio between 3/4 and 4/3 (``sample_distorted_bounding_box`` on the JPEG's
  shape, read from its header by ``extract_jpeg_shape``), decoded alone by
  ``decode_and_crop_jpeg``, resized to the image size; the recipe's random
  left-right flip is the model's first layer (``mirrorkit train`` adds a
  ``RandomFlip``), not the pipeline's: flipping copies every pixel, which
  costs the host's cores about 8% of a decode (``tf.reverse`` in a
  ``tf.cond``; measured, benchmarks/RESULTS.md section 11) and the
  accelerator next to nothing, and the host's cores are what a JPEG
  pipeline runs short of;
* validation: the central 87.5% (224 of 256) of the image at the target's
  aspect ratio, also decoded alone, resized.

Decoding only the window skips the inverse DCT, colour conversion and copy of
the pixels outside it, so the crop costs less than the full decode it
replaces. PNG, BMP and GIF files have no such decoder: they are decoded whole
and cut with the same window math.

:class:`ImageDecoder` is the ``map_fn`` an :class:`~mirrorkit.datasets.ImageData`
carries: calling it gives the validation image; its :attr:`~ImageDecoder.train_fn`
(None without augmentation) gives the training crop from a per-example seed,
so a seeded run repeats however many threads decode.

Example:
    >>> decoder = ImageDecoder((224, 224), 3, augment="crop")
    >>> decoder.train_fn is not None, decoder.augment
    (True, 'crop')
    >>> center_window(375, 500, (224, 224))
    (24, 86, 328, 328)
"""

from __future__ import annotations

from typing import Any, Callable

from mirrorkit.errors import UserInputError

#: Augmentations a source of encoded images applies in its input pipeline.
AUGMENTS = ("none", "crop")
#: Random-resized-crop: fraction of the image's area, and width/height ratio.
AREA_RANGE = (0.08, 1.0)
ASPECT_RANGE = (3 / 4, 4 / 3)
#: Validation keeps this fraction of the image's side (224 of 256).
CENTER_FRACTION = 0.875
# Windows tried before the whole image is used (tensorflow/models uses 10).
_MAX_ATTEMPTS = 10


def check_augment(value: Any) -> str:
    """Validate a data augmentation name.

    Example:
        >>> check_augment("crop")
        'crop'
        >>> check_augment("zoom")
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: Unknown augment. Valid: none, crop. Received: augment='zoom'
    """
    if value not in AUGMENTS:
        raise UserInputError(
            f"Unknown augment. Valid: {', '.join(AUGMENTS)}. Received: augment={value!r}")
    return value


def center_window(height: int, width: int, size: tuple[int, int],
                  fraction: float = CENTER_FRACTION) -> tuple[int, int, int, int]:
    """``(y, x, h, w)`` of the validation crop of a ``height`` x ``width`` image.

    The largest window of the target's aspect ratio that fits, scaled by
    ``fraction`` and centred (rounding the offset up, as tensorflow/models does).
    Plain Python on ints, or TensorFlow on int32 scalars.

    Example:
        >>> center_window(256, 256, (224, 224))
        (16, 16, 224, 224)
    """
    scale = _minimum(height / size[0], width / size[1])
    crop_h = _maximum(_floor(fraction * size[0] * scale), 1)
    crop_w = _maximum(_floor(fraction * size[1] * scale), 1)
    return (height - crop_h + 1) // 2, (width - crop_w + 1) // 2, crop_h, crop_w


def _is_tensor(*values: Any) -> bool:
    return any(type(v).__module__.startswith("tensorflow") for v in values)


def _minimum(a: Any, b: Any) -> Any:
    if _is_tensor(a, b):
        import tensorflow as tf

        return tf.minimum(a, b)
    return min(a, b)


def _maximum(a: Any, b: Any) -> Any:
    if _is_tensor(a, b):
        import tensorflow as tf

        return tf.maximum(a, b)
    return max(a, b)


def _floor(value: Any) -> Any:
    if _is_tensor(value):
        import tensorflow as tf

        return tf.cast(tf.floor(value), tf.int32)
    return int(value // 1)


def random_window(height: Any, width: Any, seed: Any) -> tuple[Any, Any, Any, Any]:
    """``(y, x, h, w)`` of a random-resized-crop window, from a ``[2]`` int seed.

    Example:
        >>> y, x, h, w = random_window(375, 500, tf.constant([1, 2]))  # doctest: +SKIP
    """
    import tensorflow as tf

    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.stack([height, width, 1]), tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed,
        min_object_covered=0.1, aspect_ratio_range=ASPECT_RANGE, area_range=AREA_RANGE,
        max_attempts=_MAX_ATTEMPTS, use_image_if_no_bounding_boxes=True)
    return begin[0], begin[1], size[0], size[1]


def decode_window(encoded: Any, channels: int,
                  window: Callable[[Any, Any], tuple[Any, Any, Any, Any]]) -> Any:
    """Decode the ``window(height, width)`` part of an encoded image, as uint8.

    JPEG: the window is computed from the header and decoded alone
    (``decode_and_crop_jpeg``); other formats are decoded whole and sliced.

    Example:
        >>> image = decode_window(tf.io.read_file("a.jpg"), 3,
        ...                       lambda h, w: (0, 0, h // 2, w // 2))   # doctest: +SKIP
    """
    import tensorflow as tf

    def jpeg() -> Any:
        shape = tf.io.extract_jpeg_shape(encoded)
        y, x, h, w = window(shape[0], shape[1])
        return tf.io.decode_and_crop_jpeg(encoded, tf.stack([y, x, h, w]), channels=channels)

    def other() -> Any:
        # expand_animations=False gives a GIF's first frame, as Keras's loaders do.
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        shape = tf.shape(image)
        y, x, h, w = window(shape[0], shape[1])
        return image[y:y + h, x:x + w, :]

    image = tf.cond(tf.io.is_jpeg(encoded), jpeg, other)
    image.set_shape([None, None, channels])
    return image


class ImageDecoder:
    """The ``map_fn`` of a source of encoded images: ``(file or bytes, label) -> (image, label)``.

    Calling it gives the validation image: the whole image resized
    (``augment="none"``) or the center crop resized (``"crop"``), float32 in
    [0, 1] (uint8 0..255 with ``uint8``). :attr:`train_fn` ``(x, label, seed)`` gives the training image
    (random-resized-crop; its flip is a model layer, see the module
    docstring); :func:`mirrorkit.data.train_pipeline` uses it
    when it is not None, with a per-example seed. Reading the file in the same
    function keeps the shuffle buffer to file names and reads in parallel with
    decoding.

    Args:
        size: ``(height, width)`` of the output.
        channels: 1 or 3.
        augment: ``"none"`` or ``"crop"``. Defaults to ``"none"``.
        from_path: the examples are file paths (else encoded bytes).
        uint8: give uint8 pixels 0..255 (rounded) instead of float32 in
            [0, 1]: batching and copying a quarter of the bytes makes the
            pipeline ~5% cheaper per image (benchmarks/RESULTS.md section 11).

    Example:
        >>> decoder = ImageDecoder((32, 32), 3, from_path=True)
        >>> image, label = decoder(tf.constant("cat.jpg"), 0)            # doctest: +SKIP
        >>> tuple(image.shape)                                          # doctest: +SKIP
        (32, 32, 3)
    """

    def __init__(self, size: tuple[int, int], channels: int, *, augment: str = "none",
                 from_path: bool = False, uint8: bool = False) -> None:
        self.size = (int(size[0]), int(size[1]))
        self.channels = int(channels)
        self.augment = check_augment(augment)
        self.from_path = bool(from_path)
        self.uint8 = bool(uint8)
        self.train_fn = self._train if self.augment == "crop" else None

    def describe(self) -> str:
        """The augmentation in words, for the dataset's summary line.

        Example:
            >>> ImageDecoder((224, 224), 3, augment="crop").describe()
            'train: random-resized-crop (flip in the model), val: center crop 0.875'
        """
        pixels = ", uint8 pixels" if self.uint8 else ""
        if self.augment == "none":
            return f"whole image resized{pixels}"
        return (f"train: random-resized-crop (flip in the model), val: center crop "
                f"{CENTER_FRACTION:g}{pixels}")

    def encoded(self, x: Any) -> Any:
        """The encoded bytes of an example (reads the file when given a path)."""
        import tensorflow as tf

        return tf.io.read_file(x) if self.from_path else x

    def whole(self, x: Any) -> Any:
        """The whole image decoded (uint8): ``decode_image`` is ``decode_jpeg`` for a JPEG.

        The ``whole`` floor of ``mirrorkit bench --input-only`` is this alone.
        """
        import tensorflow as tf

        image = tf.io.decode_image(self.encoded(x), channels=self.channels,
                                   expand_animations=False)
        image.set_shape([None, None, self.channels])
        return image

    def window(self, x: Any, seed: Any = None) -> Any:
        """The decoded (uint8) pixels :attr:`train_fn` (with a seed) or the call resizes.

        The decode floor of ``mirrorkit bench --input-only`` is this alone.
        """
        if self.augment == "none":
            return self.whole(x)
        if seed is None:
            def chooser(h: Any, w: Any) -> Any:
                return center_window(h, w, self.size)
        else:
            def chooser(h: Any, w: Any) -> Any:
                return random_window(h, w, seed)
        return decode_window(self.encoded(x), self.channels, chooser)

    @property
    def pixel_max(self) -> float:
        """A white pixel's value in the images this gives: 255 (uint8) or 1.0.

        Example:
            >>> ImageDecoder((32, 32), 3, uint8=True).pixel_max
            255.0
        """
        return 255.0 if self.uint8 else 1.0

    def resize(self, pixels: Any) -> Any:
        """Bilinear resize of decoded uint8 pixels to :attr:`size`: float32 in [0, 1] or uint8."""
        import tensorflow as tf

        image = tf.image.resize(pixels, self.size)
        # A bilinear mix of 0..255 stays in 0..255: + 0.5 then truncation rounds.
        image = tf.cast(image + 0.5, tf.uint8) if self.uint8 else image * (1.0 / 255.0)
        image.set_shape([self.size[0], self.size[1], self.channels])
        return image

    def __call__(self, x: Any, label: Any) -> tuple[Any, Any]:
        return self.resize(self.window(x)), label

    def _train(self, x: Any, label: Any, seed: Any) -> tuple[Any, Any]:
        return self.resize(self.window(x, seed)), label
