"""The pure parts of fine-tuning, in this process: options, phases, names, preprocessing.

The runs themselves (phases, resume, replicas, errors) are in test_finetune.py.
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

from mirrorkit.training import TrainConfig
from mirrorkit.training.backbones import APPLICATIONS, build_classifier, preprocessing_map
from mirrorkit.training.finetune import Phases, make_phases
from mirrorkit.training.finetune_options import default_head_epochs
from mirrorkit.training.models import MODELS
from mirrorkit.training.plan import make_plan
from mirrorkit.training.pretrained import check_weights_spec

pytestmark = pytest.mark.fast


@pytest.mark.parametrize("kwargs, received", [
    ({"model": "cnn", "weights": "imagenet"}, "model='cnn'"),
    ({"model": "resnet50", "weights": "backbone.pt"}, "weights='backbone.pt'"),
    ({"model": "resnet50", "head_epochs": 2}, "weights=None"),
    ({"model": "resnet50", "fine_tune_lr": 1e-4}, "weights=None"),
    ({"model": "resnet50", "weights": "imagenet", "epochs": 3, "head_epochs": 4},
     "head_epochs=4"),
    ({"model": "resnet50", "weights": "imagenet", "fine_tune_lr": -1.0}, "fine_tune_lr=-1.0"),
    ({"model": "resnet50", "weights": "imagenet", "fine_tune_lr": math.inf},
     "fine_tune_lr=inf"),
    ({"model": "resnet50", "weights": "imagenet", "fine_tune_layers": 0}, "fine_tune_layers=0"),
    ({"model": "resnet50", "weights": "imagenet", "warmup_epochs": 1.0}, "warmup_epochs=1.0"),
])
def test_bad_fine_tuning_options_are_one_value_error_naming_the_value(kwargs, received):
    with pytest.raises(ValueError, match="Received: " + received):
        TrainConfig(**kwargs)


def test_the_default_split_and_the_phase_rates():
    assert [default_head_epochs(e) for e in (1, 2, 3, 10)] == [1, 1, 1, 5]
    config = TrainConfig(model="mobilenet_v2", weights="x.weights.h5", epochs=4)
    plan = make_plan(config, train_examples=640, val_examples=64, replicas=2)
    phases = make_phases(config, plan)
    assert (phases.head_epochs, phases.head_lr, phases.fine_tune_lr) == (2, 0.004, 0.0004)
    assert [phases.phase_of(e) for e in range(4)] == [1, 1, 2, 2]
    # --fine-tune-lr is for a global batch of 32 and scales like --lr.
    config = TrainConfig(model="mobilenet_v2", weights="imagenet", epochs=4, head_epochs=0,
                         fine_tune_lr=1e-4)
    phases = make_phases(config, make_plan(config, train_examples=640, val_examples=64,
                                           replicas=2))
    assert phases == Phases(0, 4, 0.004, 2e-4, None)
    assert phases.span(1) == (0, 0) and phases.span(2) == (0, 4)


def test_weights_spec_accepts_imagenet_and_the_two_file_kinds():
    for spec in ("imagenet", "b.weights.h5", "resnet50_notop.h5", "runs/a/model.keras"):
        assert check_weights_spec(spec) == spec
    for spec in ("ImageNet", "b.pt", "", None):
        with pytest.raises(ValueError, match="must be 'imagenet', a backbone's .weights.h5"):
            check_weights_spec(spec)


def test_every_name_is_a_keras_applications_constructor_with_its_preprocess_input():
    import keras

    for app in APPLICATIONS.values():
        assert app.name in MODELS
        assert callable(getattr(keras.applications, app.constructor)), app
        module = importlib.import_module(f"keras.applications.{app.module}")
        assert callable(module.preprocess_input), app


@pytest.mark.parametrize("name, mode", [
    ("resnet50", "caffe"), ("mobilenet_v2", "tf"), ("densenet121", "torch"),
    ("efficientnet_b0", "identity"),
])
def test_preprocessing_is_the_modules_own_affine_map(name, mode):
    from keras.applications import imagenet_utils

    kernel, bias = preprocessing_map(APPLICATIONS[name])
    x = np.random.default_rng(1).uniform(0, 255, (5, 3))
    want = (x if mode == "identity" else
            imagenet_utils.preprocess_input(x.reshape(1, 5, 1, 3).copy(), mode=mode).reshape(5, 3))
    np.testing.assert_allclose(x @ kernel + bias, want, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("channels", [1, 3])
def test_the_model_carries_the_preprocessing_and_turns_grayscale_into_rgb(channels):
    from keras.applications import mobilenet

    model = build_classifier(APPLICATIONS["mobilenet_025"], input_shape=(32, 32, channels),
                             num_classes=3)
    assert model.name == "mobilenet_025" and model.output_shape == (None, 3)
    assert not model.get_layer("preprocess").trainable
    images = np.random.default_rng(2).uniform(0, 1, (2, 32, 32, channels)).astype("float32")
    rgb = np.repeat(images, 3, axis=-1) if channels == 1 else images
    got = model.get_layer("preprocess")(images)
    want = mobilenet.preprocess_input(255.0 * rgb)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def test_control_training_false_does_not_hold_a_nested_batchnorm_in_inference_mode():
    """Why the phases freeze BatchNormalization instead (keras-team/keras#20285)."""
    import keras

    inner_in = keras.Input((4,))
    inner = keras.Model(inner_in, keras.layers.BatchNormalization()(inner_in), name="inner")
    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inner(inputs, training=False)))
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    norm = inner.layers[-1]
    x = np.random.default_rng(3).normal(5.0, 1.0, (16, 4)).astype("float32")
    model.train_on_batch(x, np.zeros((16, 1)))
    moved = not np.allclose(norm.moving_mean.numpy(), 0.0)
    norm.moving_mean.assign(np.zeros(4))
    norm.trainable = False
    model.compile(optimizer="sgd", loss="mse", jit_compile=False)
    model.train_on_batch(x, np.zeros((16, 1)))
    # training=False is overridden by fit's training=True; a frozen layer is not.
    assert moved and np.allclose(norm.moving_mean.numpy(), 0.0)


def test_phases_freeze_the_backbone_then_unfreeze_its_top_layers_but_never_batchnorm():
    import keras

    from mirrorkit.training.finetune import _set_phase

    model = build_classifier(APPLICATIONS["mobilenet_025"], input_shape=(32, 32, 3),
                             num_classes=3)
    backbone = model.get_layer("backbone")
    head = model.get_layer("predictions").count_params()
    assert _set_phase(model, Phases(1, 2, 1.0, 0.1, None), 1) == head
    norms = [l for l in backbone.layers if isinstance(l, keras.layers.BatchNormalization)]
    every = _set_phase(model, Phases(1, 2, 1.0, 0.1, None), 2)
    convs = sum(l.count_params() for l in backbone.layers
                if isinstance(l, (keras.layers.Conv2D, keras.layers.DepthwiseConv2D)))
    assert every == head + convs and not any(l.trainable for l in norms)
    assert not model.get_layer("preprocess").trainable
    # The top 6 layers of MobileNet end with its last pointwise conv (then BN, ReLU, pooling).
    top = _set_phase(model, Phases(1, 2, 1.0, 0.1, 6), 2)
    last = [l for l in backbone.layers[-6:] if isinstance(l, keras.layers.Conv2D)]
    assert top == head + sum(l.count_params() for l in last) and head < top < every
