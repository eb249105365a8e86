"""The vision model zoo: pick a model by name, get a Keras model for a dataset's shape.

=====================  =====================================================
name                   model
=====================  =====================================================
``cnn``                small CNN (default): 2-3 conv layers, dense head;
                       ~0.15M parameters on 8x8 digits
``resnet20``           CIFAR ResNet-20 of He et al. 2016 (sec. 4.2): 3 stages
                       of 3 basic blocks, 16/32/64 filters, option-A
                       shortcuts; 0.27M parameters on 10 classes
``resnet56``           the same with 9 blocks per stage; 0.86M parameters
``resnet50``,          any ``keras.applications`` model
``mobilenet_v2``,      (:data:`mirrorkit.training.backbones.APPLICATIONS`):
``efficientnet_b0``,   its own preprocessing, the backbone without its top,
...                    Dropout and a new Dense head; random weights, or
                       pretrained ones with ``pretrained`` (``--weights``)
=====================  =====================================================

Every model takes float32 images in [0, 1] of the dataset's shape, ends in a
float32 softmax over the dataset's classes (also under mixed precision), and
uses only built-in Keras layers, so ``model.keras`` reloads with
``keras.models.load_model`` without importing mirrorkit. The Keras
applications need images of at least 32x32: resize with ``image_size``.

Build under the strategy's scope (``with strategy.scope():``) so variables are
mirrored; :func:`mirrorkit.training.train` does.

Importing this module does not import TensorFlow.

Example:
    >>> from mirrorkit.training.models import build_model
    >>> model = build_model("resnet20", input_shape=(32, 32, 3), num_classes=10)  # doctest: +SKIP
    >>> model.count_params()                                                      # doctest: +SKIP
    271098
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from mirrorkit.errors import UserInputError
from mirrorkit.training.backbones import APPLICATIONS, build_classifier


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What the zoo knows about a model before building it.

    Attributes:
        name: the ``--model`` name.
        description: one line for help and summaries.
        min_size: smallest image height/width it accepts.

    Example:
        >>> MODELS["mobilenet_v2"].min_size
        32
    """

    name: str
    description: str
    min_size: int = 1


MODELS: dict[str, ModelSpec] = {
    spec.name: spec for spec in (
        ModelSpec("cnn", "small CNN (fast; digits in seconds)"),
        ModelSpec("resnet20", "CIFAR ResNet-20 (He et al. 2016), option-A shortcuts"),
        ModelSpec("resnet56", "CIFAR ResNet-56 (He et al. 2016), option-A shortcuts"),
        *(ModelSpec(app.name, app.description, app.min_size) for app in APPLICATIONS.values()),
    )
}

#: ``build_model(augment=...)``: off, on (flip + shift), or by name.
MODEL_AUGMENTS = (False, True, "none", "flip", "flip-shift")
# CIFAR ResNet depth 6n+2 -> n blocks per stage.
_RESNET_BLOCKS = {"resnet20": 3, "resnet56": 9}
# He et al. use weight decay 1e-4 on the gradient; Keras's L2 adds
# l2 * sum(w**2) to the loss, whose gradient is 2 * l2 * w.
_RESNET_L2 = 5e-5


def model_spec(name: str) -> ModelSpec:
    """Return the :class:`ModelSpec` of ``name``.

    Raises:
        UserInputError: for an unknown name, listing the valid ones.

    Example:
        >>> model_spec("resnet50").min_size
        32
    """
    if name in MODELS:
        return MODELS[name]
    close = difflib.get_close_matches(str(name), list(MODELS), n=2, cutoff=0.6)
    hint = f" Did you mean {' or '.join(close)}?" if close else ""
    raise UserInputError(
        f"Unknown model.{hint} Valid: {', '.join(MODELS)}. Received: model={name!r}")


def check_input(name: str, input_shape: tuple[int, ...]) -> None:
    """Raise a clear UserInputError when ``name`` cannot take images of ``input_shape``.

    Example:
        >>> check_input("resnet50", (8, 8, 1))
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: Model 'resnet50' needs images of at least 32x32; the dataset gives 8x8. ...
    """
    spec = model_spec(name)
    if len(input_shape) != 3:
        raise UserInputError(f"`input_shape` must be (height, width, channels). "
                             f"Received: input_shape={tuple(input_shape)!r}")
    height, width = input_shape[:2]
    if min(height, width) < spec.min_size:
        raise UserInputError(
            f"Model {name!r} needs images of at least {spec.min_size}x{spec.min_size}; the "
            f"dataset gives {height}x{width}. Resize with --image-size {spec.min_size} "
            f"(image_size={spec.min_size}). Received: input_shape={tuple(input_shape)!r}")


def augmentation(seed: int | None = None, *, shift: bool = True) -> Any:
    """The in-model augmentation layers: random horizontal flip and translation.

    Keras preprocessing layers, so they run on the device inside the model and
    only while training (identity at inference). Translation by up to 12.5%
    is CIFAR's "pad 4 pixels, random 32x32 crop" for any image size; Keras's
    ``RandomCrop`` is not used because at inference it resizes the padded
    image instead of returning the original. ``shift=False`` keeps the flip
    alone: the flip of ``--augment crop``, whose crop the input pipeline
    decodes straight from each JPEG.

    Example:
        >>> aug = augmentation(seed=0)                 # doctest: +SKIP
        >>> [layer.name for layer in aug.layers]       # doctest: +SKIP
        ['random_flip', 'random_translation']
    """
    import keras
    from keras import layers

    steps = [layers.RandomFlip("horizontal", seed=seed)]
    if shift:
        steps.append(layers.RandomTranslation(0.125, 0.125, fill_mode="constant", seed=seed))
    return keras.Sequential(steps, name="augmentation")


def _cnn(x: Any) -> Any:
    from keras import layers

    # Halve the image until it is at most 8x8, so the dense head stays small
    # for big images, then one more conv + pool; 8x8 digits get the classic
    # conv32-conv64-pool-dense128 net.
    x = layers.Conv2D(32, 3, padding="same", activation="relu")(x)
    size, filters = min(x.shape[1], x.shape[2]), 32
    while size > 8:
        filters = min(filters * 2, 128)
        x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D()(x)
        size //= 2
    x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
    if size >= 2:
        x = layers.MaxPooling2D()(x)
    x = layers.Flatten()(x)
    x = layers.Dropout(0.25)(x)
    return layers.Dense(128, activation="relu")(x)


def _conv_bn(x: Any, filters: int, strides: int = 1, *, relu: bool = True,
             kernel: int = 3) -> Any:
    import keras
    from keras import layers

    x = layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False,
                      kernel_initializer="he_normal",
                      kernel_regularizer=keras.regularizers.L2(_RESNET_L2))(x)
    x = layers.BatchNormalization()(x)
    return layers.ReLU()(x) if relu else x


def _shortcut(x: Any, filters: int, strides: int, option: str) -> Any:
    from keras import layers

    if strides == 1 and x.shape[-1] == filters:
        return x
    if option == "B":
        return _conv_bn(x, filters, strides, relu=False, kernel=1)
    # Option A (the paper's CIFAR choice): parameter-free. Subsample by taking
    # every other pixel (a 1x1 pool with stride 2) and pad the new channels
    # with zeros (Rescaling(0) makes them), with built-in layers only so the
    # saved model reloads anywhere.
    if strides != 1:
        x = layers.MaxPooling2D(pool_size=1, strides=strides)(x)
    # Stages double the filters, so the zeros are exactly as many as the inputs.
    return layers.Concatenate()([x, layers.Rescaling(0.0)(x)])


def _cifar_resnet(x: Any, blocks: int, shortcut: str) -> Any:
    from keras import layers

    x = _conv_bn(x, 16)
    for stage, filters in enumerate((16, 32, 64)):
        for block in range(blocks):
            strides = 2 if stage > 0 and block == 0 else 1
            y = _conv_bn(x, filters, strides)
            y = _conv_bn(y, filters, relu=False)
            x = layers.ReLU()(layers.Add()([_shortcut(x, filters, strides, shortcut), y]))
    return layers.GlobalAveragePooling2D()(x)


def build_model(
    name: str = "cnn",
    *,
    input_shape: tuple[int, int, int],
    num_classes: int,
    augment: bool | str = False,
    shortcut: str = "A",
    seed: int | None = None,
    pretrained: list[Any] | None = None,
    pixel_max: float = 1.0,
) -> Any:
    """Build (uncompiled) model ``name`` for images of ``input_shape``.

    Args:
        name: one of :data:`MODELS`. Defaults to ``"cnn"``.
        input_shape: ``(height, width, channels)`` of the images.
        num_classes: outputs of the softmax head.
        augment: put :func:`augmentation` layers first (training only):
            True or ``"flip-shift"`` both, ``"flip"`` the flip alone (what
            ``--augment crop`` adds to its pipeline's crops); False or
            ``"none"`` none.
        shortcut: CIFAR ResNets only: ``"A"`` (zero-padded identity, the
            paper's CIFAR setting; default) or ``"B"`` (1x1 conv projection
            when the shape changes).
        seed: seed of the augmentation layers.
        pretrained: ``keras.applications`` models only: the backbone's
            weights (:func:`mirrorkit.training.finetune.load_pretrained`).
            Defaults to None (random).
        pixel_max: a white pixel's value in the images the model gets
            (:attr:`mirrorkit.datasets.ImageData.pixel_max`): other than 1, a
            ``Rescaling(1 / pixel_max)`` layer named ``rescale`` comes first,
            so uint8 batches cross to the device as uint8 and become [0, 1]
            there. Defaults to 1.0.

    Returns:
        A functional ``keras.Model`` named ``name``.

    Raises:
        UserInputError: unknown name (valid ones listed), images too small for
            it, fewer than 2 classes, or a bad ``shortcut``.

    Example:
        >>> model = build_model("cnn", input_shape=(8, 8, 1), num_classes=10)  # doctest: +SKIP
        >>> model.output_shape                                                # doctest: +SKIP
        (None, 10)
    """
    check_input(name, input_shape)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
        raise UserInputError(
            f"`num_classes` must be an integer >= 2. Received: num_classes={num_classes!r}")
    if shortcut not in ("A", "B"):
        raise UserInputError(f"`shortcut` must be 'A' or 'B'. Received: shortcut={shortcut!r}")
    if augment not in MODEL_AUGMENTS:
        raise UserInputError(f"`augment` must be one of {', '.join(map(repr, MODEL_AUGMENTS))}. "
                             f"Received: augment={augment!r}")
    import keras
    from keras import layers

    def first(inputs: Any) -> Any:
        x = inputs
        if pixel_max != 1:
            x = layers.Rescaling(1.0 / pixel_max, name="rescale")(x)
        if augment not in (False, "none"):
            x = augmentation(seed, shift=augment != "flip")(x)
        return x

    if name in APPLICATIONS:
        model = build_classifier(APPLICATIONS[name], input_shape=input_shape,
                                 num_classes=num_classes, augmentation=first)
        if pretrained is not None:
            model.get_layer("backbone").set_weights(pretrained)
        return model
    if pretrained is not None:
        raise UserInputError(f"Pretrained weights need a keras.applications model; {name!r} has "
                             f"no backbone. Received: model={name!r}")
    inputs = keras.Input(shape=tuple(int(d) for d in input_shape), name="image")
    x = first(inputs)
    if name == "cnn":
        x = _cnn(x)
    else:
        x = _cifar_resnet(x, _RESNET_BLOCKS[name], shortcut)
    # float32 softmax: under mixed precision a float16 softmax loses accuracy
    # and the loss must be computed in float32.
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32",
                           name="predictions")(x)
    return keras.Model(inputs, outputs, name=name)
