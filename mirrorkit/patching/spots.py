"""The functions several fixes change, and in which order their layers run.

A function two or more fixes change is a *spot*: it is wrapped once
(:func:`mirrorkit.patching.engine.join`), each fix in force adds a layer,
and the layers run in the order written here -- innermost (nearest Keras's
own code) first -- whichever fix was applied first, and whichever are turned
off. This table is the only place that order is decided; a test fails when
two fixes' records name one function that is not listed here with both.

The loss spots follow the model of :mod:`mirrorkit.compat.replica_loss`:
Keras's scaling of a replica's loss is corrected from the inside out -- the
replica's rows (``uneven-batch-losses``), then whether there is a replica's
gradient sum at all (``cross-replica-step``, ``no-gradient-losses``), then
what the logs read of it (``logged-step-losses``).

Example:
    >>> SPOTS["loss-module", "scale_loss_for_distribution"][0]
    'uneven-batch-losses'
"""

from __future__ import annotations

import functools
from typing import Any, Callable

SPOTS: dict[tuple[str, str], tuple[str, ...]] = {
    # Build before the first step: the step's own build first, then the peek
    # around it (symbolic-build-order decides whether a batch is drawn at all).
    ("backend-trainer", "_maybe_symbolic_build"): ("symbolic-build", "symbolic-build-order"),
    ("base-trainer", "_symbolic_build"): ("no-call-build", "symbolic-build-names"),
    # The step function: multi-step's loop inside, the logged shares read per step.
    ("backend-trainer", "_make_function"): ("multi-step", "logged-step-losses"),
    # Both count the step's rows with the same layer (run once).
    ("strategy-base", "run"): ("uneven-batch-losses", "replica-random"),
    # A replica's share of the loss: weighed by its rows; none outside strategy.run;
    # noted for an overridden Loss.__call__; none where no gradient is taken.
    ("loss-module", "scale_loss_for_distribution"): (
        "uneven-batch-losses", "cross-replica-step", "overridden-loss-call",
        "no-gradient-losses"),
    # Its inverse for the logs, with the same conditions; the step's own log last.
    ("loss-module", "unscale_loss_for_distribution"): (
        "uneven-batch-losses", "cross-replica-step", "no-gradient-losses",
        "logged-step-losses"),
    # A layer's Loss unscaled once; a sum over the batch rescaled on top of it.
    ("loss-module", "reduce_values"): ("layer-losses", "batch-sum-losses"),
    # A scalar or masked reduction first; the result is then remembered as a share.
    ("loss-module", "reduce_weighted_values"): (
        "scalar-losses", "masked-loss-means", "logged-step-losses"),
    # The paired-rows check sees the loss as the script wrote it, before the
    # hand-written means are weighed.
    ("gradient-tape", "gradient"): ("paired-step-losses", "hand-mean-gradients"),
}

# On a spot's one wrapper: patch name -> its layer's factory, for the patches in force.
LAYERS = "__mirrorkit_layers__"
ORDER = "__mirrorkit_order__"


def wrapper(base: Callable[..., Any], order: tuple[str, ...],
            found: dict[str, Callable[[Any], Any]]) -> Callable[..., Any]:
    """One wrapper over ``base`` that runs the layers in ``found``, innermost first in ``order``.

    :func:`mirrorkit.patching.engine.join` and ``undo`` add and take out the
    layers (patch name -> its factory) and mark the wrapper; each distinct
    set of layers is composed once, on its first call.

    Example:
        >>> found = {}
        >>> f = wrapper(lambda: "keras", ("a", "b"), found)
        >>> found["b"] = lambda below: lambda: below() + " +b"
        >>> f()
        'keras +b'
    """
    built: dict[tuple[str, ...], Callable[..., Any]] = {}

    def composed() -> Callable[..., Any]:
        key = tuple(name for name in order if name in found)
        fn = built.get(key)
        if fn is None:
            fn, used = base, []
            for name in key:
                # Two patches may need the same layer (the step's row count): once.
                if found[name] not in used:
                    used.append(found[name])
                    fn = functools.update_wrapper(found[name](fn), base)
            built[key] = fn
        return fn

    def shared(*args: Any, **kwargs: Any) -> Any:
        return composed()(*args, **kwargs)

    return functools.update_wrapper(shared, base)


def layers(value: Any) -> tuple[str, ...]:
    """The patches whose layers a spot's wrapper runs now, innermost first (else ``()``).

    Example:
        >>> layers(len)
        ()
    """
    found = getattr(value, LAYERS, None) or {}
    return tuple(name for name in getattr(value, ORDER, ()) if name in found)
