"""``mirrorkit run --compare-one-device``: is the distributed step what one device computes?

At the start of each model's first ``fit`` on more than one replica, before
any batch trains:

1. the first global batch of the input is taken without using it up
   (:mod:`mirrorkit.runner.first_batch`);
2. the model's own compiled step (its ``train_function``, the batch fed the
   way ``fit`` feeds it, split across the replicas) trains once on it;
3. a one-device copy (same class and config, weights, optimizer config and
   state, losses, loss weights, metrics; :mod:`mirrorkit.runner.one_device_copy`)
   trains once on the same batch under the default strategy;
4. the losses (total and per output), the metrics and each variable's update
   are compared (:mod:`mirrorkit.runner.one_device_verdict`) and ONE line
   says ``same``, ``differs as expected`` (per-replica BatchNormalization
   statistics) or ``DIFFERENT`` with the value that differs and the likely
   cause, or ``not checked: <reason>``;
5. the model's variables, the optimizer's (``iterations`` included), the
   metrics and Python's and NumPy's random states are put back, and the step
   function traced for the check is dropped: the ``fit`` that follows trains
   exactly as it would without the flag.

Random layers (Dropout, noise, random augmentation) stay on: the copy's seed
generators start from the model's states, and the ``replica-random`` fix
makes each replica draw its rows of one device's draw, so both sides draw the
same numbers. With that fix turned off, Dropout and noise layers are switched
off on both sides for the check's step instead (each replica would draw its
own mask), and the line says so. The check never fails the script: any
error becomes ``not checked: <reason>``.

Under ``mirrorkit launch`` every worker runs the check at the same point
(the distributed step is collective: all workers must run it); each compares
the cluster's step on its global batch with one device and prints its own
line. Workers that feed the same data (the usual script) see the same verdict.

Example:
    >>> from mirrorkit.runner.one_device_check import check_fit   # doctest: +SKIP
    >>> check_fit(model, bound, replicas=2).kind                   # doctest: +SKIP
    'same'
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import random
from typing import Any, Iterator

import numpy as np

from mirrorkit.patching import engine
from mirrorkit.runner import first_batch
from mirrorkit.runner.one_device_copy import (
    QUIET,
    CannotCopy,
    one_device_step,
    one_line,
    run_step,
    seed_states,
)
from mirrorkit.runner.one_device_verdict import PREFIX, Context, Step, Verdict, compare
from mirrorkit.strategy_facts import per_replica_batch_norm

logger = logging.getLogger(__name__)

__all__ = ["check_fit", "single_replica"]


def check_fit(model: Any, bound: inspect.BoundArguments, replicas: int) -> Verdict:
    """Compare ``model``'s first distributed training step with one device's; log one line.

    Args:
        model: the compiled model whose ``fit`` is starting.
        bound: that ``fit``'s bound arguments; a generator input is replaced
            by one that yields the taken batch first.
        replicas: the model's replica count.

    Returns:
        The verdict (``same``, ``explained``, ``different`` or ``not-checked``).

    Example:
        >>> check_fit(model, bound, 2).line                        # doctest: +SKIP
        'mirrorkit: one-device check: same (largest relative difference 3.1e-07 ...)'
    """
    suffix = _suffix(model, replicas)
    try:
        verdict = _check(model, bound, replicas)
    except (first_batch.NotPeekable, CannotCopy) as err:
        verdict = Verdict("not-checked", f"{PREFIX}not checked: {err}")
    except Exception as err:  # noqa: BLE001 -- the check must never break the script
        verdict = Verdict("not-checked", f"{PREFIX}not checked: {type(err).__name__}: "
                                         f"{one_line(err)}")
    level = logging.WARNING if verdict.kind == "different" else logging.INFO
    logger.log(level, "%s", verdict.line + suffix, extra={"verbatim": True})
    return verdict


def single_replica(model: Any) -> Verdict:
    """Say that ``model`` trains on one replica: there is no distributed step to check.

    Example:
        >>> single_replica(model).line                              # doctest: +SKIP
        'mirrorkit: one-device check: not checked: the model trains on 1 replica ...'
    """
    verdict = Verdict("not-checked", f"{PREFIX}not checked: the model trains on 1 replica, "
                                     "nothing to compare (on a CPU host: --simulate-cpus N)")
    logger.info("%s", verdict.line + _suffix(model, 1), extra={"verbatim": True})
    return verdict


def _suffix(model: Any, replicas: int) -> str:
    return f" [model {getattr(model, 'name', type(model).__name__)!r}, {replicas} " \
           f"replica{'' if replicas == 1 else 's'}]"


def _check(model: Any, bound: inspect.BoundArguments, replicas: int) -> Verdict:
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        raise CannotCopy("the model is not compiled")
    if not engine.enabled("one-device-check"):
        raise CannotCopy("the one-device-check patch is turned off")
    batch = first_batch.take(bound)
    class_weight = bound.arguments.get("class_weight")
    same_draws = _replica_random_applied()
    quiet = [] if same_draws else [
        (layer, attr) for layer in model._flatten_layers()
        if (attr := QUIET.get(type(layer).__name__)) and getattr(layer, attr, 0)]
    # The check's trace (with Dropout off) must not become fit's step function.
    changes = [(model, "train_function", lambda _: None)]
    changes += [(layer, attr, lambda _: 0.0) for layer, attr in quiet]
    with _random_states(), engine.applied("one-device-check", changes):
        try:
            model._symbolic_build(data_batch=batch)   # what fit would build first
            with _restored(model) as before:
                distributed = run_step(model, batch, class_weight, model.distribute_strategy)
                names = [getattr(v, "path", v.name) for v in model.weights]
                updates = [np.asarray(v.numpy()) - w
                           for v, w in zip(model.weights, before.weights)]
                one = one_device_step(model, batch, class_weight, before.weights, before.slots,
                                      before.seeds if same_draws else None)
        finally:
            # Back to the value the engine set, so leaving the block restores the script's.
            engine.on_object("one-device-check", model, "train_function", None)
    # Where both sides draw the same numbers, randomness explains no difference.
    randomness = () if same_draws else _random_layers(model, {id(l) for l, _ in quiet})
    context = Context(batch_norm=per_replica_batch_norm(model), randomness=randomness,
                      quieted=tuple(layer.name for layer, _ in quiet),
                      global_batch=_rows(batch))
    return compare(Step(logs=distributed, updates=updates), one, old=before.weights,
                   names=names, replicas=replicas, context=context)


def _rows(batch: Any) -> int | None:
    from keras import tree

    leaves = [t for t in tree.flatten(batch) if t is not None]
    shape = getattr(leaves[0], "shape", None) if leaves else None
    return int(shape[0]) if shape else None


class _State:
    def __init__(self, model: Any) -> None:
        self.weights = [np.asarray(v.numpy()) for v in model.weights]
        self.slots = [np.asarray(v.numpy()) for v in model.optimizer.variables]
        self.seeds = [np.asarray(v.numpy()) for v in seed_states(model)]
        self._all = [(v, np.asarray(v.numpy())) for v in
                     [*model.variables, *model.optimizer.variables, *model.metrics_variables]]

    def restore(self) -> None:
        for variable, value in self._all:
            variable.assign(value)


@contextlib.contextmanager
def _restored(model: Any) -> Iterator[_State]:
    """The model's, optimizer's and metrics' variables as they were, whatever the block did."""
    state = _State(model)
    model.reset_metrics()
    try:
        yield state
    finally:
        state.restore()


@contextlib.contextmanager
def _random_states() -> Iterator[None]:
    # Building the copy draws default seeds from Python's random module.
    python, numpy = random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)


def _replica_random_applied() -> bool:
    from mirrorkit.compat import FIXES

    return FIXES["replica-random"].is_applied()


def _random_layers(model: Any, quieted: set[int]) -> tuple[str, ...]:
    # Layers that draw at training time (seed generators) and were not switched off.
    return tuple(layer.name for layer in model._flatten_layers()
                 if layer is not model and id(layer) not in quieted
                 and getattr(layer, "_seed_generators", None)
                 and not (QUIET.get(type(layer).__name__)))
