"""The ``symbolic-build-names`` fix: the first ``fit`` under a strategy names tensors as plain Python does.

Keras names every symbolic tensor from one process-wide counter
(``keras_tensor``, ``keras_tensor_1``, ...). Under any ``tf.distribute``
strategy, and only there, ``fit``/``evaluate``/``predict`` first build the
model symbolically (``Trainer._symbolic_build``): it makes symbolic copies of
a data batch and turns each output spec of the model, its metrics and its
loss back into symbolic tensors. Those tensors are thrown away, but they
advance the counter, so every tensor named afterwards gets another name than
under ``python``: TensorFlow's image-classification tutorial converts its
model with ``TFLiteConverter`` and calls the signature runner with the input
name ``keras_tensor_15``, which is ``keras_tensor_21`` after a distributed
``fit`` (``ValueError: Invalid Input name``). A ``Sequential`` model built
lazily by that ``fit`` even gets another name for its own input tensor.

The fix counts only what plain Python creates too: the tensors made while
the model, metrics or loss run (a lazily built ``Sequential`` makes its
input there, exactly as on its first call without a strategy). The throwaway
copies made around those calls leave the counter where it was.

Example:
    >>> from keras.src.trainers.trainer import Trainer               # doctest: +SKIP
    >>> patched = make(Trainer._symbolic_build)                     # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

from mirrorkit.patching import engine

NAME = "symbolic-build-names"
_PREFIX = "keras_tensor"  # naming.auto_name("KerasTensor")


def _uids() -> Any:
    import collections

    from keras.src.backend.common import global_state

    return global_state.get_global_attribute(
        "object_name_uids", default=collections.defaultdict(int), set_to_default=True)


def _count() -> int | None:
    # None: no tensor named yet (the first one gets the bare prefix).
    return _uids().get(_PREFIX)


def _set_count(value: int | None) -> None:
    if value is None:
        _uids().pop(_PREFIX, None)
    else:
        _uids()[_PREFIX] = value


class _Counter:
    """The ``keras_tensor`` count plain Python would have, kept through one symbolic build."""

    def __init__(self) -> None:
        self.real = _count()
        self.depth = 0

    def around(self, spec: Callable[..., Any]) -> Callable[..., Any]:
        def compute_output_spec(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            if self.depth:
                return spec(fn, *args, **kwargs)  # nested: what plain Python runs too

            def counted(*a: Any, **k: Any) -> Any:
                # The symbolic inputs were made before this call: undo their count.
                _set_count(self.real)
                self.depth += 1
                try:
                    return fn(*a, **k)
                finally:
                    self.depth -= 1
                    self.real = _count()

            return spec(counted, *args, **kwargs)

        return compute_output_spec


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``Trainer._symbolic_build`` (``original``) with the fix."""

    def _symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        from keras.src import backend

        counter = _Counter()
        try:
            # Only for this build: the model's own layers call
            # compute_output_spec too, and those calls count (depth > 0).
            with engine.applied(NAME, [(backend, "compute_output_spec", counter.around)]):
                return original(self, iterator=iterator, data_batch=data_batch)
        finally:
            _set_count(counter.real)

    return _symbolic_build
