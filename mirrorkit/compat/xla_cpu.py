"""The ``xla-cpu-replicas`` fix: ``jit_compile=True`` trains on replicas that are CPU devices.

keras.io's "Image classification from scratch" compiles with
``jit_compile=True``. On one CPU that is XLA on the CPU, and it trains. On
several replicas whose devices are CPUs (logical CPUs under
``MirroredStrategy``, CPU workers under ``MultiWorkerMirroredStrategy``)
TensorFlow cannot compile the step: "Trying to access resource
conv2d/kernel/replica_1 ... located in device CPU:1 from device CPU:0" (one
process), "Collectives are not yet implemented for CPU devices when
compiling with XLA" and a crash (workers). GPU replicas compile as usual.

The fix wraps Keras's ``model_supports_jit``, which the ``jit_compile``
setter consults: for a model whose strategy has 2+ replicas, all on CPU
devices, it answers False, so Keras proceeds without XLA (its own warning),
and one log line says why. The step's numbers are then TensorFlow's
non-XLA kernels' (float rounding apart from the XLA run).

Example:
    >>> from keras.src.trainers import trainer                         # doctest: +SKIP
    >>> trainer.model_supports_jit = make(trainer.model_supports_jit)  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from typing import Any, Callable

logger = logging.getLogger(__name__)


def cpu_replicas(strategy: Any) -> int:
    """The replica count of ``strategy`` when it is 2+ and every device is a CPU, else 0.

    Example:
        >>> import tensorflow as tf
        >>> cpu_replicas(tf.distribute.get_strategy())
        0
    """
    import tensorflow as tf

    replicas = getattr(strategy, "num_replicas_in_sync", 1)
    if replicas < 2:
        return 0
    try:
        devices = tuple(strategy.extended.worker_devices)
    except (AttributeError, RuntimeError):  # a strategy that does not say: keep XLA
        return 0
    on_cpu = all(tf.DeviceSpec.from_string(d).device_type == "CPU" for d in devices)
    return replicas if on_cpu else 0


def make(original: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """Wrap ``model_supports_jit`` (``original``): no XLA for replicas on CPU devices."""

    def model_supports_jit(model: Any) -> bool:
        replicas = cpu_replicas(getattr(model, "distribute_strategy", None))
        if replicas:
            logger.warning(
                "jit_compile=True is off for model %r: TensorFlow's XLA cannot compile a "
                "step whose %d replicas are CPU devices (GPU replicas compile); it trains "
                "without XLA", getattr(model, "name", "?"), replicas)
            return False
        return original(model)

    return model_supports_jit
