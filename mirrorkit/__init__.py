"""mirrorkit: existing Keras vision code on every local GPU or several machines.

Importing mirrorkit does not import TensorFlow; the functions below do so
when called.

Example:
    >>> import mirrorkit
    >>> strategy = mirrorkit.get_strategy()          # doctest: +SKIP
    >>> print(mirrorkit.describe().summary())        # doctest: +SKIP
    strategy=default replicas=1 (no GPU visible and no simulated CPUs requested; ...)
"""

from mirrorkit.cluster import ClusterSpec, build_tf_config, parse_tf_config
from mirrorkit.runtime import Runtime
from mirrorkit.strategy import describe, get_strategy, select

__version__ = "0.1.0"

__all__ = [
    "ClusterSpec",
    "Runtime",
    "__version__",
    "build_tf_config",
    "describe",
    "get_strategy",
    "parse_tf_config",
    "select",
]
