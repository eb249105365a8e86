"""Training blocks and the ``mirrorkit train`` job.

The blocks a user script can take: :mod:`.callbacks` (chief-aware backup,
checkpoint, TensorBoard, ``save_model``), :mod:`.schedules` (learning-rate
scaling and warmup), :mod:`.metering` (throughput, NaN guard), :mod:`.models`
(the vision model zoo). The job: :mod:`.config` (what a run is),
:mod:`.plan` (its numbers), :mod:`.output` (its folder), :mod:`.job`
(``train()`` as a short sequence of named steps).

Importing this package does not import TensorFlow.

Example:
    >>> from mirrorkit.training import TrainConfig, train
    >>> result = train(TrainConfig(epochs=3, output="runs/demo"))   # doctest: +SKIP
"""

from mirrorkit.training.config import (
    BASE_BATCH,
    DEFAULT_EPOCHS,
    DEFAULT_LR,
    DEFAULT_PER_REPLICA_BATCH,
    LR_SCALINGS,
    OPTIMIZERS,
    PRECISIONS,
    TrainConfig,
    TrainResult,
)
from mirrorkit.training.job import train
from mirrorkit.training.output import RUN_FILES
from mirrorkit.training.plan import TrainPlan, auto_steps_per_execution, make_plan

__all__ = [
    "BASE_BATCH",
    "DEFAULT_EPOCHS",
    "DEFAULT_LR",
    "DEFAULT_PER_REPLICA_BATCH",
    "LR_SCALINGS",
    "OPTIMIZERS",
    "PRECISIONS",
    "RUN_FILES",
    "TrainConfig",
    "TrainPlan",
    "TrainResult",
    "auto_steps_per_execution",
    "make_plan",
    "train",
]
