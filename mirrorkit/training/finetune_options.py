"""The fine-tuning options of a TrainConfig, checked without TensorFlow (see training.finetune).

Example:
    >>> default_head_epochs(10), default_head_epochs(1)
    (5, 1)
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from mirrorkit.errors import UserInputError


def default_head_epochs(epochs: int) -> int:
    """Phase-1 epochs when ``--head-epochs`` is not given: half of ``epochs``, at least 1.

    Example:
        >>> default_head_epochs(3), default_head_epochs(4)
        (1, 2)
    """
    return max(1, epochs // 2)


def check_fine_tune(config: Any) -> None:
    """Validate the fine-tuning fields of a TrainConfig (no TensorFlow).

    Raises:
        UserInputError: ``weights`` on a model without a backbone, fine-tuning
            options without ``weights``, or a bad value (named).

    Example:
        >>> from mirrorkit.training import TrainConfig
        >>> TrainConfig(model="cnn", weights="imagenet")
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: `weights` needs a keras.applications model (e.g. resnet50, mobilenet_v2); 'cnn' has no pretrained backbone. Received: model='cnn'
    """
    from mirrorkit.training.backbones import APPLICATIONS
    from mirrorkit.training.pretrained import check_weights_spec

    if config.weights is None:
        given = [f"{name}={getattr(config, name)!r}" for name in
                 ("head_epochs", "fine_tune_lr", "fine_tune_layers")
                 if getattr(config, name) is not None]
        if given:
            raise UserInputError(f"{', '.join(given)} set the phases of fine-tuning, which needs "
                                 f"--weights imagenet|PATH. Received: weights=None")
        return
    check_weights_spec(config.weights)
    if config.model not in APPLICATIONS:
        raise UserInputError(f"`weights` needs a keras.applications model (e.g. resnet50, "
                             f"mobilenet_v2); {config.model!r} has no pretrained backbone. "
                             f"Received: model={config.model!r}")
    head = config.head_epochs
    if head is not None and (isinstance(head, bool) or not isinstance(head, numbers.Integral)
                             or not 0 <= head <= config.epochs):
        raise UserInputError(f"`head_epochs` must be an integer from 0 to epochs "
                             f"({config.epochs}). Received: head_epochs={head!r}")
    lr = config.fine_tune_lr
    if lr is not None and (isinstance(lr, bool) or not isinstance(lr, numbers.Real)
                           or not 0 < lr < math.inf):
        raise UserInputError(f"`fine_tune_lr` must be a positive finite number. "
                             f"Received: fine_tune_lr={lr!r}")
    layers = config.fine_tune_layers
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, numbers.Integral)
                               or layers < 1):
        raise UserInputError(f"`fine_tune_layers` must be a positive integer. "
                             f"Received: fine_tune_layers={layers!r}")
    if config.warmup_epochs:
        raise UserInputError(f"`warmup_epochs` is for single-phase training; with --weights each "
                             f"phase starts at its own rate (--lr, --fine-tune-lr). "
                             f"Received: warmup_epochs={config.warmup_epochs!r}")
