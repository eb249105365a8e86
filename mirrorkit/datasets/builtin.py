"""The sources that need no files: the embedded ``digits`` set and ``synthetic`` images.

Example:
    >>> from mirrorkit.datasets import DataOptions
    >>> load_synthetic(DataOptions(image_size=16, classes=4, examples=64)).image_shape
    (16, 16, 3)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mirrorkit.datasets._base import (
    SPLIT_SEED,
    DataOptions,
    ImageData,
    convert_fn,
    stratified_split,
)

DIGITS_VAL_FRACTION = 0.2
# The UCI optical-recognition digits (CC BY 4.0), as scikit-learn ships them:
# 1,797 8x8 images of 0..16 and their labels, as uint8 (45 kB). Shipped with
# mirrorkit rather than read from scikit-learn, because Keras imports
# scikit-learn (its sklearn wrappers) whenever it is installed, which costs
# every TensorFlow process about a second of CPU.
DIGITS_FILE = Path(__file__).with_name("digits.npz")
SYNTHETIC_DEFAULT_SIZE = (32, 32)
SYNTHETIC_DEFAULT_CHANNELS = 3
# Synthetic images up to this many bytes (train + validation, float32) are
# generated once and kept in memory; larger sets are generated on the fly.
SYNTHETIC_CACHE_BYTES = 64 * 2**20


def digits_arrays() -> tuple[Any, Any]:
    """The embedded digits as NumPy arrays: images in [0, 1] and integer labels.

    The 1,797 UCI handwritten digits (8x8 grayscale, 10 classes) that
    scikit-learn also ships, in their original order, for scripts that want
    small real images without a download and without scikit-learn.

    Returns:
        ``(images, labels)``: float32 ``(1797, 8, 8, 1)`` and int32 ``(1797,)``.

    Example:
        >>> images, labels = digits_arrays()
        >>> images.shape, labels[:5].tolist(), float(images.max())
        ((1797, 8, 8, 1), [0, 1, 2, 3, 4], 1.0)
    """
    import numpy as np

    with np.load(DIGITS_FILE) as data:
        images, labels = data["images"], data["target"]
    return (images / 16.0).astype("float32")[..., None], labels.astype("int32")


def load_digits(options: DataOptions | None = None) -> ImageData:
    """The UCI handwritten digits, embedded: 1,797 8x8 grayscale images.

    Pixel values 0..16 are scaled to 0..1; shape ``(8, 8, 1)``; 10 classes.
    20% of every class (359 images) is held out for validation with a fixed
    seed, so the split is the same on every run and every machine.

    Args:
        options: ``image_size`` and ``channels`` apply. Defaults to none.

    Returns:
        An :class:`ImageData` holding NumPy arrays.

    Example:
        >>> data = load_digits()
        >>> data.train[0].shape, data.val[0].shape
        ((1438, 8, 8, 1), (359, 8, 8, 1))
    """
    options = options or DataOptions()
    x, y = digits_arrays()
    train, val = stratified_split(y, DIGITS_VAL_FRACTION)
    channels = options.channels or 1
    height, width = options.image_size or x.shape[1:3]
    return ImageData(
        name="digits",
        train=(x[train], y[train]),
        val=(x[val], y[val]),
        image_shape=(int(height), int(width), channels),
        num_classes=10,
        train_examples=len(train),
        val_examples=len(val),
        map_fn=convert_fn(options.image_size, options.channels, 1),
        class_names=tuple(str(d) for d in range(10)),
        description="UCI handwritten digits, embedded",
    )


def load_synthetic(options: DataOptions | None = None) -> ImageData:
    """Random images for benchmarks: deterministic, generated once when small.

    Every class has a fixed random template; an example is half its class's
    template and half per-example noise, so a model can learn something and a
    benchmark exercises real gradients. Example ``i`` has label
    ``i % classes`` and noise seeded by ``i``: the data is the same on every
    run and every worker.

    Up to :data:`SYNTHETIC_CACHE_BYTES` (64 MB: 5,000+ images of 32x32x3) the
    images are generated once, at load, and handed over as arrays;
    generating them every epoch costs ~90 us of CPU per image, taken from the
    cores that train (measured +0-6 % resnet20 throughput; under DATA
    sharding every worker would generate the whole global batch). Larger
    sets are generated on the fly in constant memory. Both give the same
    pixels.

    Args:
        options: ``image_size`` (default 32x32), ``channels`` (default 3),
            ``classes`` (default 10) and ``examples`` (training examples,
            default 1024; validation gets a fifth, at least one per class).

    Returns:
        An :class:`ImageData`: NumPy arrays when the set is cached, else
        indices that ``map_fn`` turns into images.

    Example:
        >>> data = load_synthetic(DataOptions(examples=100, classes=5))
        >>> data.train_examples, data.val_examples, data.num_classes
        (100, 20, 5)
    """
    import numpy as np
    import tensorflow as tf

    options = options or DataOptions()
    height, width = options.image_size or SYNTHETIC_DEFAULT_SIZE
    channels = options.channels or SYNTHETIC_DEFAULT_CHANNELS
    classes, n_train = options.classes, options.examples
    n_val = max(n_train // 5, classes)
    shape = (height, width, channels)
    templates = tf.constant(
        np.random.default_rng(SPLIT_SEED).uniform(0.0, 1.0, (classes, *shape)).astype("float32"))

    def indices(start: int, count: int) -> tf.data.Dataset:
        ds = tf.data.Dataset.range(start, start + count)
        return ds.map(lambda i: (i, tf.cast(i % classes, tf.int32)))

    def generate(index: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        seed = tf.stack([tf.constant(SPLIT_SEED, tf.int64), index])
        noise = tf.random.stateless_uniform(shape, seed=seed)
        return 0.5 * tf.gather(templates, label) + 0.5 * noise, label

    size = (n_train + n_val) * int(np.prod(shape)) * 4
    train: Any
    val: Any
    map_fn: Any
    # Validation examples follow the training ones, so no image is in both.
    if size <= SYNTHETIC_CACHE_BYTES:
        # One pass now. The pipelines get plain arrays and no map_fn: nothing
        # runs per example on the host while the model trains, and the
        # per-replica host input (mirrorkit.data.replica_input) applies.
        every = indices(0, n_train + n_val).map(generate, num_parallel_calls=tf.data.AUTOTUNE)
        x, y = (np.concatenate(part) for part in zip(*every.batch(4096).as_numpy_iterator()))
        train, val = (x[:n_train], y[:n_train]), (x[n_train:], y[n_train:])
        map_fn, how = None, f"random images, generated once, {size / 2**20:.1f} MB in memory"
    else:
        train, val = indices(0, n_train), indices(n_train, n_val)
        map_fn, how = generate, "random images generated on the fly"

    return ImageData(
        name="synthetic",
        train=train,
        val=val,
        image_shape=shape,
        num_classes=classes,
        train_examples=n_train,
        val_examples=n_val,
        map_fn=map_fn,
        class_names=tuple(str(c) for c in range(classes)),
        description=how,
    )
