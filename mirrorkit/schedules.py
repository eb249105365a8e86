"""Learning-rate scaling and warmup, at the path saved models and ``mirrorkit train`` name.

The code lives in :mod:`mirrorkit.training.schedules`. ``import
mirrorkit.schedules`` registers :class:`WarmupSchedule` with Keras, which
``keras.models.load_model`` of a ``model.keras`` trained with warmup needs
(``mirrorkit train`` prints that note).

Example:
    >>> import mirrorkit.schedules                                  # doctest: +SKIP
    >>> model = keras.models.load_model("runs/a/model.keras")      # doctest: +SKIP
"""

from mirrorkit.training.schedules import (  # noqa: F401
    ScaledSchedule,
    WarmupSchedule,
    scale_learning_rate,
)

__all__ = ["ScaledSchedule", "WarmupSchedule", "scale_learning_rate"]
