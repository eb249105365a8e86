"""The ``symbolic-build-order`` fix: under a strategy, ``fit`` sees its data in plain Python's order.

Under any ``tf.distribute`` strategy, and only there, Keras peeks at one
batch before ``fit``/``evaluate`` to build the model symbolically
(``TensorFlowTrainer._maybe_symbolic_build``), then starts the epoch afresh.
The peek is a whole extra pass over the input's randomness: a
``tf.data.Dataset`` with ``shuffle`` (reshuffled each iteration) draws its
first order for the peek, so epoch 1 trains in the order plain Python uses
for epoch 2; a ``keras.utils.PyDataset`` or generator that shuffles with
Python's ``random`` draws once more. Same model, same seed, another data
order: the numbers differ from plain Python's from the first step
(measured: a PyDataset's first-step loss 1.7106 vs 1.7372, test accuracy
0.375 vs 0.4297), and every later use of ``random`` in the script differs.

A script that makes a strategy of its own (``mirrorkit run`` hands it
mirrorkit's, :func:`keep_kerass_peek`) peeks under plain Python too: its
models keep Keras's peek, or epoch 1 would see another order than plain's
(measured: TensorFlow's "Distributed training with Keras" pattern, epoch-1
accuracy 0.3060 against plain's 0.3687 with the peek removed, 1.4e-7 apart
with it kept).

Keras 3.16 (from its nightlies, :data:`PYDATASET_OWN_SHUFFLE`) narrowed the bug:
a ``PyDataset`` shuffles its batches with a generator of its own seeded by
the epoch (``random.Random(epoch)``), so the peek draws nothing from Python's
``random`` and sees epoch 1's order. A reshuffled ``tf.data`` pipeline, and a
generator that shuffles with Python's or NumPy's ``random``
(``upstream_repros/symbolic_build_order.py``), still move there.

The build needs shapes and dtypes only. The fix builds from the input
pipeline's ``element_spec`` when it gives every dimension but the batch (no
iterator, no randomness drawn). Otherwise (a distributed dataset, unknown
shapes) it keeps Keras's peek and puts Python's and NumPy's random states
back afterwards.

Example:
    >>> from keras.src.backend.tensorflow import trainer            # doctest: +SKIP
    >>> patched = make(trainer.TensorFlowTrainer._maybe_symbolic_build)  # doctest: +SKIP
"""

from __future__ import annotations

import random
import weakref
from typing import Any, Callable


#: Keras versions whose PyDataset shuffles with ``random.Random(epoch)``, not Python's
#: ``random`` (measured: 3.15.1 draws from Python's, 3.16.0.dev2026102704 does not).
PYDATASET_OWN_SHUFFLE = "keras>=3.16.0.dev0"

# Strategies the script itself asked for, whose models peek as in plain Python. Weak,
# not by id(): a freed strategy's id can be reused by an unrelated later one.
_SCRIPTS_OWN: weakref.WeakSet[Any] = weakref.WeakSet()


def keep_kerass_peek(strategy: Any) -> None:
    """The script distributes with ``strategy`` itself: keep Keras's peek for its models.

    Process-wide from the call on: a script that makes its own strategy runs
    under plain Python with that strategy, where Keras peeks, so mirrorkit
    does the same instead of removing the peek.

    Example:
        >>> import tensorflow as tf                                   # doctest: +SKIP
        >>> keep_kerass_peek(tf.distribute.get_strategy())            # doctest: +SKIP
    """
    _SCRIPTS_OWN.add(strategy)


def _spec_batch(iterator: Any) -> Any:
    """The input's element spec when it fixes every dimension but the batch, else None."""
    import tensorflow as tf
    from keras.src import tree

    adapter = getattr(iterator, "data_adapter", None)
    if adapter is None:
        return None
    try:
        dataset = adapter.get_tf_dataset()
    except Exception:  # noqa: BLE001 -- an adapter that cannot say: peek as Keras does
        return None
    if not isinstance(dataset, tf.data.Dataset):
        return None
    specs = tree.flatten(dataset.element_spec)
    if not specs or not all(isinstance(s, tf.TensorSpec) and s.shape.rank is not None
                            and s.shape.rank >= 1 and None not in s.shape.as_list()[1:]
                            for s in specs):
        return None
    return dataset.element_spec


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``TensorFlowTrainer._maybe_symbolic_build`` (``original``) with the fix."""

    def _maybe_symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        strategy = getattr(self, "_distribute_strategy", None)
        if iterator is None or strategy is None or strategy in _SCRIPTS_OWN:
            return original(self, iterator=iterator, data_batch=data_batch)
        spec = _spec_batch(iterator)
        if spec is not None:
            return original(self, iterator=None, data_batch=spec)
        import numpy as np

        python_state, numpy_state = random.getstate(), np.random.get_state()
        try:
            return original(self, iterator=iterator, data_batch=data_batch)
        finally:
            random.setstate(python_state)
            np.random.set_state(numpy_state)

    return _maybe_symbolic_build
