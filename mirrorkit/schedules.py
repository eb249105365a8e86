"""Learning-rate scaling and warmup, at the path saved models and ``mirrorkit train`` name.

The code lives in :mod:`mirrorkit.training.schedules`. ``import
mirrorkit.schedules`` registers :class:`WarmupSchedule` with Keras, which
``keras.models.load_model`` of a ``model.keras`` trained with warmup needs
(``mirrorkit train`` prints that note).

Example:
    >>> import mirrorkit.schedules                                  # doctest: +SKIP
    >>> model = keras.models.load_model("runs/a/model.keras")      # doctest: +SKIP
"""

from mirrorkit.training.schedules import WarmupSchedule, scale_learning_rate  # noqa: F401

__all__ = ["WarmupSchedule", "scale_learning_rate"]
