"""Every zoo model builds for a small input and takes a real training step.

The keras.applications models run their step eagerly (``run_eagerly=True``):
tracing their training graph takes 20-50 s each on 2 CPU cores, the eager
step a few seconds, and the weights and optimizer update are the same code.
"""

from __future__ import annotations

import numpy as np
import pytest

from mirrorkit.training.models import (
    MODELS,
    augmentation,
    build_model,
    check_input,
    model_spec,
)


def _one_step(model, shape, classes, *, eager):
    import keras

    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy",
                  run_eagerly=eager, jit_compile=False)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (4, *shape)).astype("float32")
    y = rng.integers(0, classes, 4)
    before = [w.copy() for w in model.get_weights()]
    loss = float(model.train_on_batch(x, y))
    after = model.get_weights()
    changed = sum(not np.array_equal(a, b) for a, b in zip(before, after))
    return loss, changed, model.predict(x, verbose=0)


@pytest.mark.parametrize("name, shape, eager", [
    ("cnn", (8, 8, 1), False),
    ("cnn", (28, 20, 3), False),
    ("resnet20", (8, 8, 1), True),
    ("resnet56", (8, 8, 3), True),
    ("resnet50", (32, 32, 3), True),
    ("mobilenet_v2", (32, 32, 1), True),
    ("efficientnet_b0", (32, 32, 3), True),
])
def test_every_model_builds_and_trains_one_step(name, shape, eager):
    import keras

    # Seeded: ResNet-50 from scratch predicts with BatchNormalization's barely
    # moved statistics after one step, and some initial weights overflow its
    # logits (NaN probabilities once in a CI run, seeded by the tests before).
    keras.utils.set_random_seed(0)
    classes = 5
    model = build_model(name, input_shape=shape, num_classes=classes)
    assert model.name == name
    assert model.input_shape == (None, *shape) and model.output_shape == (None, classes)
    loss, changed, probs = _one_step(model, shape, classes, eager=eager)
    assert np.isfinite(loss)
    assert changed > 0
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-5)


def test_cifar_resnets_have_the_papers_parameter_counts():
    # He et al. 2016, table 6: ResNet-20 0.27M, ResNet-56 0.85M (10 classes, option A).
    for name, params in (("resnet20", 271_098), ("resnet56", 857_082)):
        assert build_model(name, input_shape=(32, 32, 3), num_classes=10).count_params() == params
    # Option B adds the two 1x1 projection convolutions (+ batch norm).
    b = build_model("resnet20", input_shape=(32, 32, 3), num_classes=10, shortcut="B")
    assert b.count_params() == 271_098 + (16 * 32 + 4 * 32) + (32 * 64 + 4 * 64)


def test_option_a_shortcut_pads_channels_with_zeros_and_subsamples():
    import keras

    model = build_model("resnet20", input_shape=(8, 8, 1), num_classes=3)
    concat = [layer for layer in model.layers if isinstance(layer, keras.layers.Concatenate)]
    assert len(concat) == 2  # one per stage transition, 16->32 and 32->64
    probe = keras.Model(model.inputs, concat[0].output)
    out = probe.predict(np.random.default_rng(1).uniform(size=(2, 8, 8, 1)), verbose=0)
    assert out.shape == (2, 4, 4, 32)
    np.testing.assert_array_equal(out[..., 16:], 0.0)
    assert np.abs(out[..., :16]).sum() > 0


def test_unknown_model_lists_the_valid_ones():
    with pytest.raises(ValueError) as info:
        model_spec("resnet21")
    text = str(info.value)
    assert "Did you mean resnet20" in text and "Received: model='resnet21'" in text
    assert "Valid: " + ", ".join(MODELS) in text


def test_too_small_images_are_a_clear_error_before_building():
    with pytest.raises(ValueError, match="needs images of at least 32x32; the dataset gives 8x8. "
                                         "Resize with --image-size 32"):
        check_input("efficientnet_b0", (8, 8, 1))
    check_input("resnet20", (8, 8, 1))
    with pytest.raises(ValueError, match="num_classes"):
        build_model("cnn", input_shape=(8, 8, 1), num_classes=1)


def test_augmentation_is_random_in_training_and_identity_at_inference():
    import keras

    x = np.random.default_rng(0).uniform(size=(8, 16, 16, 3)).astype("float32")
    aug = augmentation(seed=3)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(aug(x, training=False)), x)
    assert not np.allclose(keras.ops.convert_to_numpy(aug(x, training=True)), x)
    model = build_model("cnn", input_shape=(16, 16, 3), num_classes=4, augment=True)
    assert model.layers[1].name == "augmentation"
    assert [type(layer).__name__ for layer in model.layers[1].layers] == [
        "RandomFlip", "RandomTranslation"]


def test_the_flip_of_crop_augmentation_is_a_model_layer_alone():
    from mirrorkit.datasets import DataOptions
    from mirrorkit.training import TrainConfig

    # --augment crop: the pipeline crops, the model flips (and does not shift).
    config = TrainConfig(dataset="folder:photos", data=DataOptions(augment="crop"))
    assert config.model_augment == "flip"
    assert TrainConfig().model_augment == "none"
    assert TrainConfig(augment=True).model_augment == "flip-shift"
    model = build_model("cnn", input_shape=(16, 16, 3), num_classes=4, augment="flip")
    assert [type(layer).__name__ for layer in model.layers[1].layers] == ["RandomFlip"]
    flip = model.layers[1].layers[0]
    assert flip.mode == "horizontal"
    assert not any(layer.name == "augmentation"
                   for layer in build_model("cnn", input_shape=(16, 16, 3), num_classes=4,
                                            augment="none").layers)
    with pytest.raises(ValueError, match="`augment` must be one of False, True, 'none', "
                                         "'flip', 'flip-shift'. Received: augment='zoom'"):
        build_model("cnn", input_shape=(16, 16, 3), num_classes=4, augment="zoom")


def test_uint8_pixels_are_rescaled_by_the_model_and_served_as_they_come(tmp_path):
    """pixel_max=255: a ``rescale`` layer first, so uint8 batches give a [0, 1] model's outputs."""
    import keras
    import tensorflow as tf

    from mirrorkit.training.serving import export_saved_model

    unit = build_model("cnn", input_shape=(8, 8, 3), num_classes=3, seed=0)
    pixels = build_model("cnn", input_shape=(8, 8, 3), num_classes=3, seed=0, pixel_max=255,
                         augment="flip")
    assert [layer.name for layer in pixels.layers[:3]] == ["image", "rescale", "augmentation"]
    assert "rescale" not in [layer.name for layer in unit.layers]
    pixels.set_weights(unit.get_weights())   # the rescale layer has none
    x = np.random.default_rng(0).integers(0, 256, size=(4, 8, 8, 3), dtype=np.uint8)
    want = keras.ops.convert_to_numpy(unit(x.astype("float32") / 255.0, training=False))
    got = keras.ops.convert_to_numpy(pixels(x, training=False))
    np.testing.assert_allclose(got, want, atol=1e-6)
    # The serving signature takes uint8 images for both kinds of model alike.
    for model in (unit, pixels):
        path = export_saved_model(model, tmp_path / model.layers[1].name)
        serve = tf.saved_model.load(str(path)).signatures["serving_default"]
        np.testing.assert_allclose(serve(images=tf.constant(x))["probabilities"].numpy(),
                                   want, atol=1e-6)


def test_mixed_precision_keeps_a_float32_softmax_and_the_model_reloads(tmp_path):
    import keras

    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        model = build_model("resnet20", input_shape=(8, 8, 1), num_classes=3, augment=True)
    finally:
        keras.config.set_dtype_policy(previous)
    assert model.get_layer("predictions").compute_dtype == "float32"
    assert model.layers[2].compute_dtype == "bfloat16"
    x = np.random.default_rng(0).uniform(size=(2, 8, 8, 1)).astype("float32")
    model.save(tmp_path / "m.keras")
    # Built-in layers only: plain Keras reloads it without mirrorkit's help.
    again = keras.models.load_model(tmp_path / "m.keras")
    np.testing.assert_allclose(again.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    assert again.predict(x, verbose=0).dtype == np.float32
