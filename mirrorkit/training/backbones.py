"""``keras.applications`` backbones for ``mirrorkit train``: by name, with their own preprocessing.

:data:`APPLICATIONS` maps a ``--model`` name (``resnet50``, ``mobilenet_v2``,
``efficientnet_b0``, ...) to its ``keras.applications`` constructor.
:func:`build_classifier` makes the model ``train`` fits::

    image (H, W, C) in [0, 1]
      -> [augmentation]
      -> "preprocess": the application's own ``preprocess_input`` (and, for
         C = 1, grayscale -> RGB), as a frozen Dense(3) layer
      -> "backbone": keras.applications.X(include_top=False, pooling="avg",
         input_shape=(H, W, 3)); fine-tuning freezes its BatchNormalization
         layers (inference mode, see mirrorkit.training.finetune)
      -> Dropout(0.2) -> Dense(num_classes, softmax, float32) "predictions"

Every ``preprocess_input`` of ``keras.applications`` is a per-pixel affine
map (``caffe``: RGB->BGR minus the ImageNet mean; ``tf``: to [-1, 1];
``torch``: ImageNet mean and std; identity for models that normalise
inside). :func:`preprocess_layer` measures it on probe pixels and stores it
as the weights of a built-in Dense layer, so ``model.keras`` and the
SavedModel export carry the preprocessing and reload without mirrorkit.

Importing this module does not import TensorFlow.

Example:
    >>> APPLICATIONS["resnet50"].constructor
    'ResNet50'
    >>> APPLICATIONS["mobilenet_025"].options
    {'alpha': 0.25}
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from mirrorkit.errors import UserInputError

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Application:
    """One ``keras.applications`` model as ``--model`` names it.

    Attributes:
        name: the ``--model`` name.
        module: the ``keras.applications`` module holding ``preprocess_input``.
        constructor: the constructor's name in ``keras.applications``.
        options: extra constructor arguments (e.g. ``alpha``).
        min_size: smallest image side Keras accepts for it.

    Example:
        >>> APPLICATIONS["inception_v3"].min_size
        75
    """

    name: str
    module: str
    constructor: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    min_size: int = 32

    @property
    def description(self) -> str:
        """One line for help and the summary.

        Example:
            >>> APPLICATIONS["mobilenet_025"].description
            'keras.applications.MobileNet(alpha=0.25)'
        """
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return f"keras.applications.{self.constructor}({options})"


def _table() -> dict[str, Application]:
    rows: list[Application] = [
        Application("resnet50", "resnet", "ResNet50"),
        Application("resnet101", "resnet", "ResNet101"),
        Application("resnet152", "resnet", "ResNet152"),
        Application("resnet50_v2", "resnet_v2", "ResNet50V2"),
        Application("resnet101_v2", "resnet_v2", "ResNet101V2"),
        Application("resnet152_v2", "resnet_v2", "ResNet152V2"),
        Application("mobilenet", "mobilenet", "MobileNet"),
        Application("mobilenet_025", "mobilenet", "MobileNet", {"alpha": 0.25}),
        Application("mobilenet_v2", "mobilenet_v2", "MobileNetV2"),
        Application("mobilenet_v3_small", "mobilenet_v3", "MobileNetV3Small"),
        Application("mobilenet_v3_large", "mobilenet_v3", "MobileNetV3Large"),
        Application("densenet121", "densenet", "DenseNet121"),
        Application("densenet169", "densenet", "DenseNet169"),
        Application("densenet201", "densenet", "DenseNet201"),
        Application("vgg16", "vgg16", "VGG16"),
        Application("vgg19", "vgg19", "VGG19"),
        Application("xception", "xception", "Xception", min_size=71),
        Application("inception_v3", "inception_v3", "InceptionV3", min_size=75),
        Application("inception_resnet_v2", "inception_resnet_v2", "InceptionResNetV2",
                    min_size=75),
        Application("nasnet_mobile", "nasnet", "NASNetMobile"),
        Application("nasnet_large", "nasnet", "NASNetLarge"),
    ]
    rows += [Application(f"efficientnet_b{i}", "efficientnet", f"EfficientNetB{i}")
             for i in range(8)]
    rows += [Application(f"efficientnet_v2_{s.lower()}", "efficientnet_v2", f"EfficientNetV2{s}")
             for s in ("B0", "B1", "B2", "B3", "S", "M", "L")]
    rows += [Application(f"convnext_{s.lower()}", "convnext", f"ConvNeXt{s}")
             for s in ("Tiny", "Small", "Base", "Large", "XLarge")]
    return {row.name: row for row in rows}


APPLICATIONS: dict[str, Application] = _table()

# Dropout before the new head, as in Keras's transfer-learning guide.
HEAD_DROPOUT = 0.2
BACKBONE = "backbone"


def constructor(app: Application) -> Any:
    """The ``keras.applications`` constructor of ``app``.

    Example:
        >>> constructor(APPLICATIONS["resnet50"]).__name__     # doctest: +SKIP
        'ResNet50'
    """
    import keras

    return getattr(keras.applications, app.constructor)


def make_backbone(app: Application, image_size: tuple[int, int], *, weights: str | None = None,
                  name: str = BACKBONE) -> Any:
    """``keras.applications`` model ``app`` without its top, for RGB images of ``image_size``.

    Example:
        >>> make_backbone(APPLICATIONS["mobilenet_025"], (32, 32)).output_shape   # doctest: +SKIP
        (None, 256)
    """
    height, width = image_size
    return constructor(app)(include_top=False, weights=weights,
                            input_shape=(int(height), int(width), 3), pooling="avg", name=name,
                            **app.options)


def preprocessing_map(app: Application) -> tuple[Any, Any]:
    """``(kernel, bias)`` with ``preprocess_input(x) == x @ kernel + bias`` for RGB ``x`` in 0..255.

    Measured on probe pixels and checked on random ones.

    Raises:
        RuntimeError: the application's ``preprocess_input`` is not a
            per-pixel affine map (no ``keras.applications`` model so far).

    Example:
        >>> kernel, bias = preprocessing_map(APPLICATIONS["mobilenet_v2"])   # doctest: +SKIP
        >>> kernel.diagonal(), bias                                         # doctest: +SKIP
        (array([0.00784314, 0.00784314, 0.00784314]), array([-1., -1., -1.]))
    """
    import importlib

    import numpy as np

    preprocess = importlib.import_module(f"keras.applications.{app.module}").preprocess_input

    def apply(pixels: Any) -> Any:
        out = preprocess(np.asarray(pixels, dtype="float64").reshape(1, -1, 1, 3).copy())
        return np.asarray(out, dtype="float64").reshape(-1, 3)

    probes = np.concatenate([np.zeros((1, 3)), 100.0 * np.eye(3)])
    out = apply(probes)
    bias = out[0]
    kernel = (out[1:] - bias) / 100.0
    check = np.random.default_rng(0).uniform(0, 255, size=(16, 3))
    if not np.allclose(apply(check), check @ kernel + bias, atol=1e-3):
        raise RuntimeError(f"keras.applications.{app.module}.preprocess_input is not a "
                           "per-pixel affine map; mirrorkit cannot carry it in the model")
    return kernel, bias


def set_preprocess(layer: Any, app: Application, channels: int) -> None:
    """Give the built ``preprocess`` Dense(3) the weights of ``app``'s ``preprocess_input``.

    ``channels=1`` also turns grayscale into RGB (the three channels equal).

    Example:
        >>> set_preprocess(model.get_layer("preprocess"), APPLICATIONS["resnet50"], 3)  # doctest: +SKIP
    """
    kernel, bias = preprocessing_map(app)
    # Inputs are in [0, 1]; preprocess_input expects 0..255.
    kernel = 255.0 * kernel
    if channels == 1:
        kernel = kernel.sum(axis=0, keepdims=True)
    layer.set_weights([kernel.astype("float32"), bias.astype("float32")])


def build_classifier(app: Application, *, input_shape: tuple[int, int, int], num_classes: int,
                     augmentation: Any = None, name: str | None = None) -> Any:
    """The model of the module docstring, uncompiled, with a randomly initialised backbone.

    Args:
        app: the application.
        input_shape: ``(height, width, channels)`` of the images (1 or 3 channels).
        num_classes: outputs of the new head.
        augmentation: layers to put first (a callable on the input tensor:
            augmentation, which acts in training only, and rescaling), or None.
        name: the model's name. Defaults to ``app.name``.

    Returns:
        A functional ``keras.Model``; ``model.get_layer("backbone")`` is the backbone.

    Raises:
        UserInputError: images with other than 1 or 3 channels.

    Example:
        >>> model = build_classifier(APPLICATIONS["mobilenet_025"], input_shape=(32, 32, 1),
        ...                          num_classes=4)                 # doctest: +SKIP
        >>> model.get_layer("backbone").count_params()              # doctest: +SKIP
        218544
    """
    import keras
    from keras import layers

    height, width, channels = (int(d) for d in input_shape)
    if channels not in (1, 3):
        raise UserInputError(f"Model {app.name!r} takes images with 1 or 3 channels (--channels "
                             f"3). Received: input_shape={tuple(input_shape)!r}")
    inputs = keras.Input(shape=(height, width, channels), name="image")
    x = augmentation(inputs) if augmentation is not None else inputs
    prepare = layers.Dense(3, trainable=False, name="preprocess")
    x = prepare(x)
    set_preprocess(prepare, app, channels)
    backbone = make_backbone(app, (height, width))
    x = backbone(x)
    x = layers.Dropout(HEAD_DROPOUT, name="head_dropout")(x)
    # float32 softmax: under mixed precision a float16 softmax loses accuracy.
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32",
                           name="predictions")(x)
    return keras.Model(inputs, outputs, name=name or app.name)
