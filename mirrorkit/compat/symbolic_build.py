"""The ``symbolic-build`` fix (keras#20585, part 1).

``TensorFlowTrainer._maybe_symbolic_build`` peeks at one batch and calls
``strategy.reduce("MEAN", per_replica_batch, axis=None)`` to get one example
batch. In multi-worker mode that raises ``ValueError: Attempt to convert a
value (PerReplica...)``; under a local MirroredStrategy it fails whenever the
global batch does not divide evenly by the replicas ("Inputs to operation
AddN ... must have the same size and shape"). The build only needs shapes and
dtypes, so the fix hands it this worker's first local replica batch: no
collective, same shapes.

Example:
    >>> from keras.src.backend.tensorflow import trainer            # doctest: +SKIP
    >>> patched = make(trainer.TensorFlowTrainer._maybe_symbolic_build)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any, Callable

from mirrorkit.strategy_facts import local_first, splits_batches


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``TensorFlowTrainer._maybe_symbolic_build`` (``original``) with the fix."""

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if iterator is None or strategy is None or not splits_batches(strategy):
            return original(self, iterator=iterator, data_batch=data_batch)
        from keras.src import tree

        # Same peek as upstream, but take this worker's local batch instead of
        # a cross-worker MEAN of the data: the build needs shapes only.
        for _, _, it in iterator:
            batch = next(it)
            data_batch = tree.map_structure(lambda v: local_first(strategy, v), batch)
            break
        return original(self, iterator=None, data_batch=data_batch)

    return _maybe_symbolic_build
