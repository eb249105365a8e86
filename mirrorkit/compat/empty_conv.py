"""Exact ``predict``/``evaluate`` when a replica's share of a batch is empty.

With N replicas, a global batch of fewer than N examples -- ``predict`` on
one image on 2 replicas, the last batch of 33 images at ``batch_size=32`` --
leaves a replica with an empty batch. Keras handles that correctly (an empty
replica adds nothing to the outputs, the metrics or the loss tracker, which
Keras weights by batch size), except that TensorFlow's oneDNN CPU
convolution kernels (``tensorflow/core/kernels/mkl/mkl_conv_ops.cc``; an
earlier instance: tensorflow/tensorflow#30968) return the *input* unchanged
for an empty batch: ``Conv2D(16, 3)`` on ``[0, 8, 8, 8]`` yields
``[0, 8, 8, 8]``, not ``[0, 6, 6, 16]``. The next shape-sensitive op fails,
typically ``BatchNormalization``: ``Incompatible shapes: [16] vs.
[0,8,8,8]``. Conv1D/2D/3D and depthwise convolutions are affected; so is
eager execution.

The fix (``empty-conv`` in :data:`mirrorkit.compat.FIXES`) guards Keras's
TensorFlow-backend convolutions: on an empty batch they convolve one row of
zeros and return its first 0 rows, so the output has the right shape; on any
other batch they run unchanged. Being a fix of the operation rather than of
the data, it is exact for every input Keras accepts (arrays, tensors, dicts,
``tf.data.Dataset`` of unknown length, generators), under a local
MirroredStrategy and across workers: no example is padded, dropped or
counted twice.

The guard (a ``tf.cond`` on the batch size) is only traced into Keras's
``predict``/``evaluate`` functions of models with 2+ replicas, so single-device
graphs and training graphs (where a ``tf.cond`` would stop TensorFlow from
fusing convolution, bias and activation) are exactly upstream's. ``fit``
is not covered on purpose: BatchNormalization cannot *train* on an empty
batch (its batch statistics are NaN), which is why ``mirrorkit run`` trims
the training data instead.

On first use the fix checks, once, that the installed TensorFlow really
returns the wrong shape (one tiny CPU convolution); when it does not (oneDNN
off with ``TF_ENABLE_ONEDNN_OPTS=0``, or fixed upstream), nothing is guarded.

Example:
    >>> from mirrorkit import compat
    >>> compat.apply()["empty-conv"]                         # doctest: +SKIP
    'applied'
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from mirrorkit.patching import engine
from mirrorkit.strategy_facts import model_replicas

logger = logging.getLogger(__name__)


# > 0 while a multi-replica predict/test function runs (and so traces). A
# plain counter, not thread-local: MirroredStrategy traces each replica's
# function in its own thread.
_inference_depth = 0
_broken: bool | None = None   # the probe's answer, once known


def _kernel_is_broken() -> bool:
    """True when an empty-batch CPU convolution returns a wrongly shaped result."""
    global _broken
    if _broken is None:
        import tensorflow as tf

        try:
            with tf.init_scope(), tf.device("/CPU:0"):
                out = tf.nn.conv2d(tf.zeros((0, 3, 3, 1)), tf.zeros((3, 3, 1, 2)), 1, "VALID")
            _broken = tuple(out.shape) != (0, 1, 1, 2)
        except Exception as err:  # noqa: BLE001 -- never fail the user's program here
            logger.warning("mirrorkit: could not probe empty-batch convolutions (%s); "
                           "guarding them anyway.", err)
            _broken = True
        if _broken:
            logger.info("mirrorkit: this TensorFlow's CPU convolutions mis-shape empty "
                        "batches; predict/evaluate on 2+ replicas guard them.")
    return _broken


def guard_op(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a Keras TF-backend convolution (its batch is the first argument) with the guard."""

    def op(inputs: Any, *args: Any, **kwargs: Any) -> Any:
        import tensorflow as tf

        shape = getattr(inputs, "shape", None)
        static = shape[0] if shape is not None and len(shape) else 1
        if tf.executing_eagerly():
            # Eager (run_eagerly=True): the batch size is known now.
            if static == 0 and _broken is not False and _kernel_is_broken():
                return _on_one_zero_row(original, inputs, args, kwargs)
            return original(inputs, *args, **kwargs)
        if _inference_depth <= 0 or static not in (None, 0):
            return original(inputs, *args, **kwargs)
        return tf.cond(tf.shape(inputs)[0] > 0,
                       lambda: original(inputs, *args, **kwargs),
                       lambda: _on_one_zero_row(original, inputs, args, kwargs))

    return op


def _on_one_zero_row(original: Callable[..., Any], inputs: Any, args: tuple, kwargs: dict) -> Any:
    import tensorflow as tf

    inputs = tf.convert_to_tensor(inputs)
    row = tf.zeros(tf.concat([[1], tf.shape(inputs)[1:]], 0), inputs.dtype)
    row.set_shape([1, *inputs.shape[1:]])
    return original(row, *args, **kwargs)[:0]


def _guard_maker(original: Callable[..., Any], attr: str) -> Callable[..., Any]:
    def make(self: Any, force: bool = False) -> Any:
        result = original(self, force=force)
        # make_test_function returns nothing; both store the function.
        function = getattr(self, attr, None)
        if function is None or engine.patched_by(function) == "empty-conv" \
                or not model_replicas(self) > 1 or not _kernel_is_broken():
            return result

        @functools.wraps(function)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            global _inference_depth
            _inference_depth += 1
            try:
                return function(*args, **kwargs)
            finally:
                _inference_depth -= 1

        if not engine.on_object("empty-conv", self, attr, guarded):
            return result
        return guarded if result is not None else None

    return make


def guard_predict_function(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``make_predict_function``: its multi-replica function traces the guard in."""
    return _guard_maker(original, "predict_function")


def guard_test_function(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``make_test_function``: its multi-replica function traces the guard in."""
    return _guard_maker(original, "test_function")
