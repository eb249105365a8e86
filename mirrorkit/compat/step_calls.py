"""A Keras step function wrapped so that code runs around each replica's call of it.

Fixes that must know they are inside Keras's step (``fit``'s, ``evaluate``'s,
not a custom loop's ``strategy.run``) wrap ``TensorFlowTrainer._make_function``'s
step with :func:`around`: the step is autograph-converted exactly as
``strategy.run`` would have converted it, the fix's code runs in the
replica's own thread (MirroredStrategy runs each replica in a thread), and
:func:`in_keras_step` is True meanwhile.

Example:
    >>> step = around(lambda data: data + 1, lambda call, data: call(data) * 2)
    >>> step(1)
    4
"""

from __future__ import annotations

import threading
from typing import Any, Callable

# This thread's depth of Keras step calls (each replica's step runs in its own thread).
_local = threading.local()


def in_keras_step() -> bool:
    """True inside a replica's call of a Keras step function wrapped by :func:`around`.

    Example:
        >>> in_keras_step()
        False
    """
    return getattr(_local, "depth", 0) > 0


def around(step_function: Callable[[Any], Any],
           body: Callable[[Callable[[Any], Any], Any], Any]) -> Callable[[Any], Any]:
    """``step_function`` with ``body(call, data)`` run in its place; ``call`` runs the step.

    Example:
        >>> around(str, lambda call, data: call(data) + "!")(3)
        '3!'
    """
    from tensorflow.python.autograph.core import ag_ctx
    from tensorflow.python.autograph.impl import api as autograph

    @autograph.do_not_convert
    def step(data: Any) -> Any:
        # Converted as strategy.run would have converted the step itself.
        converted = autograph.tf_convert(step_function, ag_ctx.control_status_ctx(),
                                         convert_by_default=False)
        _local.depth = getattr(_local, "depth", 0) + 1
        try:
            return body(converted, data)
        finally:
            _local.depth -= 1

    return step
