"""Dataset sources on small real data: digits, synthetic, PNG folders, TFDS, TFRecord shards.

No mocks: folder tests write real PNG files, the TFDS test writes a real
on-disk dataset with ``tfds.dataset_builders.store_as_tfds_dataset`` and reads
it back through ``tfds:NAME``, and the TFRecord tests write shards with
``export_tfrecords`` and check which files each of 2 workers reads with the
same auto-shard rewrite MultiWorkerMirroredStrategy applies per worker.
A real 2-worker training run on such shards is in tests/commands/test_train_cli.py.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import mirrorkit.datasets as mds
from mirrorkit.datasets import DataOptions


@pytest.fixture(scope="module")
def digits():
    return mds.load("digits")


def _pixels(data, split="val"):
    """All images and labels of a split, decoded, as arrays in dataset order."""
    images, labels = [], []
    for image, label in data.examples(split).batch(512).as_numpy_iterator():
        images.append(image)
        labels.append(label)
    return np.concatenate(images), np.concatenate(labels)


def _write_png_classes(root: Path, digits, classes=(0, 1, 2), per_class=10, rgb=False) -> None:
    """Real PNG files of digits, one subfolder per class (named by the digit)."""
    x, y = digits.train
    for label in classes:
        folder = root / f"digit{label}"
        folder.mkdir(parents=True, exist_ok=True)
        for i, idx in enumerate(np.flatnonzero(y == label)[:per_class]):
            pixels = np.round(x[idx, ..., 0] * 255).astype("uint8")
            image = Image.fromarray(pixels)
            (image.convert("RGB") if rgb else image).save(folder / f"{i}.png")


# -- digits and spec parsing -------------------------------------------------

def test_digits_is_embedded_scaled_and_split_the_same_way_every_time(digits):
    x_train, y_train = digits.train
    x_val, y_val = digits.val
    assert x_train.shape == (1438, 8, 8, 1) and x_val.shape == (359, 8, 8, 1)
    assert digits.num_classes == 10 and digits.image_shape == (8, 8, 1)
    assert x_train.dtype == np.float32 and x_train.min() == 0.0 and x_train.max() == 1.0
    # Stratified: every class has ~20% held out.
    counts = np.bincount(y_val, minlength=10) / (np.bincount(y_val, minlength=10)
                                                 + np.bincount(y_train, minlength=10))
    assert np.all(np.abs(counts - 0.2) < 0.01)
    again = mds.load("digits")
    np.testing.assert_array_equal(again.val[0], x_val)
    np.testing.assert_array_equal(again.val[1], y_val)


def test_digits_resized_and_converted_to_rgb(digits):
    data = mds.load("digits", DataOptions(image_size=16, channels=3))
    images, labels = _pixels(data)
    assert data.image_shape == (16, 16, 3) and images.shape == (359, 16, 16, 3)
    np.testing.assert_array_equal(labels, digits.val[1])
    np.testing.assert_allclose(images[..., 0], images[..., 2])  # gray -> RGB copies


@pytest.mark.parametrize("spec, expected", [
    ("digit", "Did you mean digits?"),
    ("tfds", "Did you mean tfds:?"),
    ("imagenet", "Valid: digits, synthetic, tfds:NAME, folder:PATH, files:GLOB"),
    ("folder:", "folder: needs a value"),
])
def test_unknown_or_incomplete_dataset_spec_lists_the_valid_ones(spec, expected):
    with pytest.raises(ValueError, match="Received: dataset=") as info:
        mds.load(spec)
    assert expected in str(info.value)


def test_data_options_are_validated():
    assert DataOptions(image_size="24x32").image_size == (24, 32)
    with pytest.raises(ValueError, match="Received: image_size='big'"):
        DataOptions(image_size="big")
    with pytest.raises(ValueError, match="Received: channels=2"):
        DataOptions(channels=2)
    with pytest.raises(ValueError, match="Received: val_fraction=1.5"):
        DataOptions(val_fraction=1.5)


# -- synthetic ---------------------------------------------------------------

def test_synthetic_has_the_asked_shape_and_is_deterministic_and_learnable():
    options = DataOptions(image_size=(12, 10), channels=1, classes=4, examples=40)
    data = mds.load("synthetic", options)
    assert (data.image_shape, data.num_classes, data.train_examples, data.val_examples) == (
        (12, 10, 1), 4, 40, 8)
    images, labels = _pixels(data, "train")
    assert images.shape == (40, 12, 10, 1) and set(labels) == {0, 1, 2, 3}
    assert 0.0 <= images.min() and images.max() <= 1.0
    again, _ = _pixels(mds.load("synthetic", options), "train")
    np.testing.assert_array_equal(images, again)
    # Same class -> closer than different class (the shared template).
    same = np.abs(images[0] - images[4]).mean()
    other = np.abs(images[0] - images[1]).mean()
    assert same < other


def test_small_synthetic_sets_are_generated_once_with_the_same_pixels(monkeypatch):
    from mirrorkit.datasets import builtin

    options = DataOptions(image_size=8, classes=3, examples=30)
    cached = mds.load("synthetic", options)
    assert "generated once" in cached.description
    monkeypatch.setattr(builtin, "SYNTHETIC_CACHE_BYTES", 0)
    live = mds.load("synthetic", options)
    assert "on the fly" in live.description
    for split in ("train", "val"):
        a, la = _pixels(cached, split)
        b, lb = _pixels(live, split)
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


# -- folder: -----------------------------------------------------------------

def test_folder_of_pngs_loads_every_image_with_its_class(tmp_path, digits):
    _write_png_classes(tmp_path, digits, per_class=10)
    data = mds.load(f"folder:{tmp_path}", DataOptions(val_fraction=0.2))
    assert data.class_names == ("digit0", "digit1", "digit2")
    assert (data.train_examples, data.val_examples, data.num_classes) == (24, 6, 3)
    assert data.image_shape == (8, 8, 1)  # the first image's size, grayscale kept
    images, labels = _pixels(data)
    assert np.bincount(labels).tolist() == [2, 2, 2]  # stratified hold-out
    # PNG is lossless: every pixel is one of the source's 8-bit values.
    x, y = digits.train
    sources = {(int(lbl), np.round(x[i] * 255).astype("uint8").tobytes())
               for lbl in range(3) for i in np.flatnonzero(y == lbl)[:10]}
    for image, label in zip(images, labels):
        assert (int(label), np.round(image * 255).astype("uint8").tobytes()) in sources


def test_folder_with_train_and_val_subfolders_resized_to_rgb(tmp_path, digits):
    _write_png_classes(tmp_path / "train", digits, classes=(3, 5), per_class=6, rgb=True)
    _write_png_classes(tmp_path / "val", digits, classes=(3, 5), per_class=2, rgb=True)
    data = mds.load(f"folder:{tmp_path}", DataOptions(image_size=12))
    assert (data.train_examples, data.val_examples) == (12, 4)
    assert data.image_shape == (12, 12, 3)
    images, labels = _pixels(data)
    assert images.shape == (4, 12, 12, 3) and sorted(labels.tolist()) == [0, 0, 1, 1]


def test_folder_errors_say_what_is_wrong(tmp_path, digits):
    with pytest.raises(FileNotFoundError, match="Image folder not found"):
        mds.load(f"folder:{tmp_path / 'missing'}")
    (tmp_path / "a_file.txt").write_text("x")
    with pytest.raises(NotADirectoryError, match="Not a folder"):
        mds.load(f"folder:{tmp_path / 'a_file.txt'}")
    empty = tmp_path / "empty"
    (empty / "cats").mkdir(parents=True)
    (empty / "cats" / "notes.txt").write_text("not an image")
    with pytest.raises(ValueError, match="No images found"):
        mds.load(f"folder:{empty}")
    single = tmp_path / "single"
    _write_png_classes(single, digits, classes=(7,), per_class=3)
    with pytest.raises(ValueError, match="single class \\('digit7'\\)"):
        mds.load(f"folder:{single}")


def test_folder_names_a_corrupt_image_file(tmp_path, digits):
    _write_png_classes(tmp_path, digits, per_class=4)
    bad = tmp_path / "digit1" / "broken.png"
    good = (tmp_path / "digit1" / "0.png").read_bytes()
    bad.write_bytes(good[: len(good) // 2])  # a truncated PNG: valid header, no data
    with pytest.raises(ValueError) as info:
        mds.load(f"folder:{tmp_path}")
    assert f"Cannot decode image file {bad}" in str(info.value)
    assert "{{" not in str(info.value)


# -- tfds: -------------------------------------------------------------------

@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory, digits):
    """A real TFDS dataset on disk: 3 digit classes, train and test splits."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    root = tmp_path_factory.mktemp("tfds")
    x, y = digits.train
    keep = np.flatnonzero(y < 3)
    pixels = np.round(x[keep] * 255).astype("uint8")
    features = tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(8, 8, 1)),
        "label": tfds.features.ClassLabel(names=["zero", "one", "two"]),
    })

    def split(lo, hi):
        return tf.data.Dataset.from_tensor_slices(
            {"image": pixels[lo:hi], "label": y[keep][lo:hi].astype("int64")})

    tfds.dataset_builders.store_as_tfds_dataset(
        name="mk_digits3", version="1.0.0", features=features,
        split_datasets={"train": split(0, 60), "test": split(60, 80)}, data_dir=str(root))
    return root, pixels[60:80], y[keep][60:80]


def test_tfds_dataset_is_read_back_offline(tfds_dir):
    root, test_pixels, test_labels = tfds_dir
    data = mds.load("tfds:mk_digits3", DataOptions(data_dir=str(root)))
    assert (data.train_examples, data.val_examples, data.num_classes) == (60, 20, 3)
    assert data.class_names == ("zero", "one", "two") and data.image_shape == (8, 8, 1)
    images, labels = _pixels(data)
    # Same multiset of (label, pixels) as written (TFDS may reorder examples).
    got = collections.Counter((int(lbl), np.round(img * 255).astype("uint8").tobytes())
                              for img, lbl in zip(images, labels))
    want = collections.Counter((int(lbl), img.tobytes())
                               for img, lbl in zip(test_pixels, test_labels))
    assert got == want


def test_tfds_split_options_and_missing_split(tfds_dir):
    root, _, _ = tfds_dir
    data = mds.load("tfds:mk_digits3", DataOptions(data_dir=str(root), train_split="train[:50]",
                                                   val_split="train[50:]"))
    assert (data.train_examples, data.val_examples) == (50, 10)
    with pytest.raises(ValueError, match="has no split 'validation'; it has test, train"):
        mds.load("tfds:mk_digits3", DataOptions(data_dir=str(root), val_split="validation"))


def test_tfds_not_prepared_says_how_to_prepare_it(tfds_dir):
    root, _, _ = tfds_dir
    with pytest.raises(ValueError) as info:
        mds.load("tfds:mnist", DataOptions(data_dir=str(root)))
    text = str(info.value)
    assert f"not prepared in {root}" in text
    assert f"tfds build mnist --data_dir {root}" in text and "--download" in text


def test_tfds_unknown_name_lists_close_matches(tfds_dir):
    root, _, _ = tfds_dir
    with pytest.raises(ValueError, match="Did you mean: tfds:mnist") as info:
        mds.load("tfds:mnistt", DataOptions(data_dir=str(root)))
    assert "Unknown TFDS dataset 'mnistt'" in str(info.value)
    with pytest.raises(ValueError, match="tfds:mk_digits3"):  # local, unregistered names too
        mds.load("tfds:mk_digit3", DataOptions(data_dir=str(root)))


# -- files: (TFRecord shards) --------------------------------------------------

@pytest.fixture(scope="module")
def shards(tmp_path_factory, digits):
    out = tmp_path_factory.mktemp("shards") / "digits"
    meta = mds.export_tfrecords(digits, out, shards=4)
    return out, meta


def test_export_writes_balanced_shards_and_metadata(shards):
    out, meta = shards
    assert meta["splits"]["train"]["examples"] == 1438 and meta["splits"]["val"]["examples"] == 359
    names = [f"train-{i:05d}-of-00004.tfrecord" for i in range(4)]
    assert meta["splits"]["train"]["files"] == names
    assert json.loads((out / mds.METADATA).read_text()) == meta
    assert sorted(p.name for p in out.glob("*.tfrecord")) == sorted(
        meta["splits"]["train"]["files"] + meta["splits"]["val"]["files"])


def test_files_read_back_the_same_images(shards, digits):
    out, _ = shards
    data = mds.load(f"files:{out}")
    assert (data.train_examples, data.val_examples, data.num_classes, data.train_files) == (
        1438, 359, 10, 4)
    images, labels = _pixels(data)
    # Round-robin shards interleaved: same examples, other order; 8-bit PNG.
    order = np.lexsort((np.round(images * 255).reshape(359, -1).T[::-1]))
    ref_order = np.lexsort((np.round(digits.val[0] * 255).reshape(359, -1).T[::-1]))
    np.testing.assert_allclose(images[order], digits.val[0][ref_order], atol=0.5 / 255)
    np.testing.assert_array_equal(labels[order], digits.val[1][ref_order])


def test_files_glob_needs_validation_shards_unless_exported(shards):
    out, _ = shards
    data = mds.load(f"files:{out}/train-*.tfrecord")  # metadata next to them names val
    assert data.val_examples == 359
    subset = mds.load(f"files:{out}/train-0000[01]-*.tfrecord",
                      DataOptions(val_files=f"{out}/val-00000-*.tfrecord"))
    assert subset.train_files == 2 and subset.train_examples == 720  # counted by reading
    with pytest.raises(FileNotFoundError, match="No files match"):
        mds.load(f"files:{out}/nothing-*.tfrecord")


def test_files_are_sharded_by_file_across_two_workers(shards):
    """Each of 2 workers reads only its own 2 of the 4 training files."""
    import tensorflow as tf
    from tensorflow.python.distribute import input_ops

    from mirrorkit.data import BatchSize, train_pipeline

    out, meta = shards
    data = mds.load(f"files:{out}")

    def images_in(files):
        spec = {"image": tf.io.FixedLenFeature([], tf.string)}
        ds = tf.data.TFRecordDataset([str(out / f) for f in files])
        return collections.Counter(tf.io.parse_single_example(r, spec)["image"].numpy()
                                   for r in ds)

    # The pipeline training builds, minus the decoding (map_fn), so the
    # elements are the encoded images; batch 1 so drop_remainder drops nothing.
    one = BatchSize(per_replica=1, global_batch=1, replicas=1)
    files = meta["splits"]["train"]["files"]
    seen = []
    for index in range(2):
        pipeline = train_pipeline(data.train, batch=one, seed=0, num_workers=2,
                                  num_files=data.train_files)
        assert pipeline.options().experimental_distribute.auto_shard_policy == (
            tf.data.experimental.AutoShardPolicy.FILE)
        # The rewrite MultiWorkerMirroredStrategy applies on worker `index`.
        worker = input_ops.auto_shard_dataset(pipeline, 2, index, 2)
        got = collections.Counter(bytes(b[0]) for b, _ in worker.as_numpy_iterator())
        mine = [f for i, f in enumerate(files) if i % 2 == index]
        assert got == images_in(mine), f"worker {index} did not read exactly {mine}"
        seen.append(got)
    assert sum(seen[0].values()) + sum(seen[1].values()) == 1438


def test_export_refuses_to_overwrite_and_files_name_a_bad_shard(shards, tmp_path, digits):
    out, _ = shards
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    with pytest.raises(ValueError, match="already holds TFRecord shards"):
        mds.export_tfrecords(digits, out, shards=2)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    bad = tmp_path / "train-00000.tfrecord"
    bad.write_bytes(b"this is not a tfrecord file at all")
    val = tmp_path / "val-00000.tfrecord"
    val.write_bytes(bad.read_bytes())
    with pytest.raises(ValueError, match=f"Cannot read TFRecord file {bad}"):
        mds.load(f"files:{bad}", DataOptions(val_files=str(val)))
