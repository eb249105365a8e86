"""The crop recipe of JPEG folders and shards (mirrorkit.datasets.jpeg_crops), on real files.

Real JPEG and PNG files written with Pillow (tools/make_jpeg_folder.py's
photo-like images, small), read through ``folder:`` and ``files:`` and the
training pipeline; expected crops are computed by hand with NumPy slicing of
a full decode.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io

import numpy as np
import pytest
from conftest import REPO
from PIL import Image

import mirrorkit.datasets as mds
from mirrorkit.datasets import DataOptions
from mirrorkit.datasets.jpeg_crops import (
    AREA_RANGE,
    ASPECT_RANGE,
    ImageDecoder,
    center_window,
    check_augment,
)

SIZE = (32, 32)


def _maker():
    spec = importlib.util.spec_from_file_location("make_jpeg_folder",
                                                  REPO / "tools" / "make_jpeg_folder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """20 photo-like JPEGs of 2 classes, 64-128 px a side."""
    root = tmp_path_factory.mktemp("photos")
    _maker().write_folder(root, images=20, classes=2, min_side=64, max_side=128)
    return root


# -- pure functions ------------------------------------------------------------

@pytest.mark.fast
def test_center_window_by_hand():
    # 375x500 to 224x224: the largest square is 375; 0.875 of it is 328.125 -> 328,
    # centred: y = (375 - 328 + 1) // 2 = 24, x = (500 - 328 + 1) // 2 = 86.
    assert center_window(375, 500, (224, 224)) == (24, 86, 328, 328)
    # A target 2:1 (HxW 100x200) in a 300x300 image: scale min(3, 1.5) = 1.5.
    assert center_window(300, 300, (100, 200)) == (85, 19, 131, 262)
    assert center_window(256, 256, (224, 224), fraction=1.0) == (0, 0, 256, 256)
    assert check_augment("none") == "none"
    with pytest.raises(ValueError, match="Valid: none, crop. Received: augment='zoom'"):
        check_augment("zoom")
    with pytest.raises(ValueError, match="Unknown augment"):
        DataOptions(augment="flip-shift")


@pytest.mark.fast
def test_crop_on_data_that_is_not_encoded_is_one_line():
    from mirrorkit.training import TrainConfig

    with pytest.raises(ValueError, match="folder:PATH and files:GLOB datasets only"):
        TrainConfig(dataset="digits", data=DataOptions(augment="crop"))
    TrainConfig(dataset="folder:anywhere", data=DataOptions(augment="crop"))


# -- decoding ------------------------------------------------------------------

def test_random_windows_vary_and_stay_inside_the_image():
    import tensorflow as tf

    from mirrorkit.datasets.jpeg_crops import random_window

    windows = {tuple(int(v) for v in random_window(375, 500, tf.constant([s, 7])))
               for s in range(100)}
    assert len(windows) > 80   # random: (almost) every seed its own window
    for y, x, h, w in windows:
        assert 0 <= y and 0 <= x and y + h <= 375 and x + w <= 500
        assert AREA_RANGE[0] * 0.9 <= h * w / (375 * 500) <= AREA_RANGE[1]
        assert ASPECT_RANGE[0] * 0.9 <= w / h <= ASPECT_RANGE[1] * 1.1


def test_decode_and_crop_equals_decode_then_crop(photos):
    import tensorflow as tf

    from mirrorkit.datasets.jpeg_crops import decode_window, random_window

    for i, path in enumerate(sorted(photos.rglob("*.jpg"))[:6]):
        encoded = tf.io.read_file(str(path))
        full = tf.io.decode_jpeg(encoded, channels=3).numpy()
        height, width = full.shape[:2]
        seed = tf.constant([i, 1])
        y, x, h, w = (int(v) for v in random_window(height, width, seed))
        crop = decode_window(encoded, 3, lambda hh, ww: random_window(hh, ww, seed)).numpy()
        assert crop.shape == (h, w, 3)
        expected = full[y:y + h, x:x + w]
        # libjpeg's fancy chroma upsampling sees other neighbours at the crop's
        # left and right edge columns only; everything inside is the same decode.
        np.testing.assert_array_equal(crop[:, 1:-1], expected[:, 1:-1])
        assert np.abs(crop.astype(int) - expected.astype(int)).max() < 64


def _png_bytes(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def test_validation_center_crop_is_deterministic_and_computed_by_hand(photos):
    import tensorflow as tf

    rng = np.random.default_rng(0)
    known = rng.integers(0, 256, (60, 90, 3), dtype=np.uint8)
    decoder = ImageDecoder(SIZE, 3, augment="crop")
    # PNG (lossless): the known pixels, center window 0.875 * 60 = 52.5 -> 52.
    y, x, h, w = center_window(60, 90, SIZE)
    assert (y, x, h, w) == (4, 19, 52, 52)
    expected = tf.image.resize(known[y:y + h, x:x + w], SIZE).numpy() / 255.0
    image, label = decoder(tf.constant(_png_bytes(known)), 3)
    np.testing.assert_allclose(image.numpy(), expected, atol=1e-6)
    assert int(label) == 3
    # JPEG: the same window of its full decode (inner columns, see above).
    path = sorted(photos.rglob("*.jpg"))[0]
    encoded = tf.io.read_file(str(path))
    full = tf.io.decode_jpeg(encoded, channels=3).numpy()
    y, x, h, w = center_window(*full.shape[:2], SIZE)
    first = decoder.window(encoded).numpy()
    np.testing.assert_array_equal(first[:, 1:-1], full[y:y + h, x + 1:x + w - 1])
    np.testing.assert_array_equal(first, decoder.window(encoded).numpy())


def test_png_takes_the_same_window_math_as_jpeg():
    import tensorflow as tf

    from mirrorkit.datasets.jpeg_crops import random_window

    known = np.random.default_rng(1).integers(0, 256, (80, 100, 3), dtype=np.uint8)
    decoder = ImageDecoder(SIZE, 3, augment="crop")
    seed = tf.constant([5, 9])
    y, x, h, w = (int(v) for v in random_window(80, 100, seed))
    np.testing.assert_array_equal(decoder.window(tf.constant(_png_bytes(known)), seed).numpy(),
                                  known[y:y + h, x:x + w])


# -- sources and the training pipeline -------------------------------------------

def _batches(data, seed=0, batch=8, take=2):
    from mirrorkit.data import resolve_batch, train_pipeline

    ds = train_pipeline(data.train, batch=resolve_batch(global_batch=batch, replicas=1),
                        seed=seed, map_fn=data.map_fn, num_workers=1)
    return [x for x, _ in ds.take(take).as_numpy_iterator()]


def test_folder_crop_pipeline_shapes_randomness_and_repeatability(photos):
    data = mds.load(f"folder:{photos}", DataOptions(image_size=SIZE, augment="crop"))
    assert data.image_shape == (32, 32, 3) and data.train_examples == 16
    assert "random-resized-crop (flip in the model)" in data.summary()
    first = _batches(data)
    assert first[0].shape == (8, 32, 32, 3) and first[0].dtype == np.float32
    assert 0.0 <= min(b.min() for b in first) and max(b.max() for b in first) <= 1.0
    # The same seed repeats the run exactly.
    np.testing.assert_array_equal(np.concatenate(first), np.concatenate(_batches(data)))
    assert not np.array_equal(np.concatenate(first), np.concatenate(_batches(data, seed=1)))
    # A shuffling pipeline gets the random crops, an unshuffled one (per-epoch
    # validation) the center crops: same files in the same order, other pixels.
    from mirrorkit.data import resolve_batch, train_pipeline

    def in_order(training):
        ds = train_pipeline(data.train, batch=resolve_batch(global_batch=8, replicas=1),
                            shuffle=False, training=training, seed=0, map_fn=data.map_fn,
                            num_workers=1)
        return next(ds.as_numpy_iterator())[0]

    center = next(data.examples("train").batch(8).as_numpy_iterator())[0]
    np.testing.assert_array_equal(in_order(None), center)
    assert not np.array_equal(in_order(True), center)
    # Every epoch crops anew: the same file under two per-example seeds.
    import tensorflow as tf

    path = tf.constant(str(sorted(photos.rglob("*.jpg"))[0]))
    a, _ = data.map_fn.train_fn(path, 0, tf.constant([1, 2], tf.int64))
    b, _ = data.map_fn.train_fn(path, 0, tf.constant([3, 4], tf.int64))
    assert a.shape == b.shape == (32, 32, 3) and not np.array_equal(a.numpy(), b.numpy())
    # Validation is deterministic and needs no seed.
    val = [x for x, _ in data.examples("val").batch(4).as_numpy_iterator()]
    again = [x for x, _ in data.examples("val").batch(4).as_numpy_iterator()]
    np.testing.assert_array_equal(np.concatenate(val), np.concatenate(again))


def test_uint8_pixels_are_the_float_images_rounded(photos):
    """DataOptions(uint8=True): the same crops as 0..255 integers (train's choice)."""
    options = DataOptions(image_size=SIZE, augment="crop")
    unit = mds.load(f"folder:{photos}", options)
    pixels = mds.load(f"folder:{photos}", dataclasses.replace(options, uint8=True))
    assert (unit.pixel_max, pixels.pixel_max) == (1.0, 255.0)
    assert "uint8 pixels" in pixels.summary() and "uint8" not in unit.summary()
    got, want = np.concatenate(_batches(pixels)), np.concatenate(_batches(unit))
    assert got.dtype == np.uint8 and got.max() > 200
    assert np.abs(got.astype("float32") - want * 255.0).max() <= 0.5 + 1e-3
    val = next(pixels.examples("val").batch(4).as_numpy_iterator())[0]
    assert val.dtype == np.uint8


def test_cached_folder_gives_the_same_images(photos):
    plain = mds.load(f"folder:{photos}", DataOptions(image_size=SIZE, augment="crop"))
    cached = mds.load(f"folder:{photos}", DataOptions(image_size=SIZE, augment="crop",
                                                      cache=True))
    assert "cached in memory" in cached.summary() and "cached" not in plain.summary()
    np.testing.assert_array_equal(np.concatenate(_batches(plain)),
                                  np.concatenate(_batches(cached)))


def test_tfrecord_shards_of_jpegs_crop_like_the_folder(photos, tmp_path):
    import tensorflow as tf

    files = sorted(photos.rglob("*.jpg"))
    for split, part in (("train", files[:16]), ("val", files[16:])):
        with tf.io.TFRecordWriter(str(tmp_path / f"{split}-00000-of-00001.tfrecord")) as writer:
            for path in part:
                label = 0 if path.parent.name == "ellipses" else 1
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[path.read_bytes()])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                })).SerializeToString())
    data = mds.load(f"files:{tmp_path}", DataOptions(image_size=SIZE, augment="crop"))
    batches = _batches(data)
    assert batches[0].shape == (8, 32, 32, 3)
    # Validation: the center crop of each record equals the folder decoder's on the same file.
    folder_decoder = ImageDecoder(SIZE, 3, augment="crop", from_path=True)
    records = [x for x, _ in data.examples("val").as_numpy_iterator()]
    expected = [folder_decoder(tf.constant(str(p)), 0)[0].numpy() for p in files[16:]]
    np.testing.assert_array_equal(np.stack(records), np.stack(expected))
