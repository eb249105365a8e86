"""mirrorkit: existing Keras vision code on every local GPU or several machines.

Importing mirrorkit does not import TensorFlow; the functions below do so
when called.

Example:
    >>> import mirrorkit
    >>> strategy = mirrorkit.get_strategy()          # doctest: +SKIP
    >>> print(mirrorkit.describe().summary())        # doctest: +SKIP
    strategy=default replicas=1 (no GPU visible and no simulated CPUs requested; ...)
"""

from typing import Any

from mirrorkit._version import __version__
from mirrorkit.data import (
    BatchSize,
    distribute_from_function,
    eval_pipeline,
    resolve_batch,
    shard_policy,
    train_pipeline,
)
from mirrorkit.distribute.failure_detection import configure_failure_detection
from mirrorkit.distribute.fixes import apply_fixes as fix_multi_worker
from mirrorkit.distribute.cluster import ClusterSpec, build_tf_config, parse_tf_config
from mirrorkit.distribute.runtime import Runtime
from mirrorkit.distribute.scope import build, scope, sync_batch_norm
from mirrorkit.distribute.strategy import describe, get_strategy, select
from mirrorkit.distribute.sync import weights_in_sync


__all__ = [
    "BatchSize",
    "BenchConfig",
    "ClusterSpec",
    "DataOptions",
    "Runtime",
    "TrainConfig",
    "TrainResult",
    "WarmupSchedule",
    "__version__",
    "build",
    "build_model",
    "build_tf_config",
    "describe",
    "distribute_from_function",
    "configure_failure_detection",
    "eval_pipeline",
    "fix_multi_worker",
    "get_strategy",
    "parse_tf_config",
    "ray_trainer",
    "resolve_batch",
    "run_bench",
    "save_model",
    "scale_learning_rate",
    "scope",
    "select",
    "shard_policy",
    "sync_batch_norm",
    "train",
    "train_pipeline",
    "weights_in_sync",
]

# Names whose module imports Keras (so TensorFlow); loaded on first access.
_LAZY = {"WarmupSchedule": "mirrorkit.training.schedules",
         "scale_learning_rate": "mirrorkit.training.schedules",
         "save_model": "mirrorkit.training.callbacks",
         # The `mirrorkit train` job as a library.
         "TrainConfig": "mirrorkit.training", "TrainResult": "mirrorkit.training",
         "train": "mirrorkit.training", "DataOptions": "mirrorkit.datasets",
         "build_model": "mirrorkit.training.models",
         # `mirrorkit bench` as a library (TensorFlow-free itself; lazy to keep import light).
         "BenchConfig": "mirrorkit.bench", "run_bench": "mirrorkit.bench",
         # A Ray Train trainer for a mirrorkit job (imports Ray when called).
         "ray_trainer": "mirrorkit.launcher.ray_job"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mirrorkit' has no attribute {name!r}")
