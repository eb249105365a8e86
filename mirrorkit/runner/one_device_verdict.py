"""The one-device check's verdict: two training steps compared, said in one line.

Pure arithmetic on NumPy values (no TensorFlow): :func:`compare` takes what
the distributed step and the one-device step reported (their logs and each
variable's update) and returns a :class:`Verdict` whose ``line`` is what
``mirrorkit run --compare-one-device`` prints.

Example:
    >>> import numpy as np
    >>> step = Step(logs={"loss": 13.4}, updates=[np.array([0.3])])
    >>> twice = Step(logs={"loss": 26.8}, updates=[np.array([0.6])])
    >>> compare(twice, step, old=[np.array([1.0])], names=["dense/kernel"],
    ...         replicas=2).kind
    'different'
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["Context", "Step", "Verdict", "compare", "TOLERANCE"]

# Beyond this relative difference a value "differs". One step in float32 on
# N replicas sums gradients in another order (~1e-7 relative); a real
# difference (a loss scaled by N, per-replica batch statistics) is >= 1e-2.
TOLERANCE = 1e-3
# A weight update is compared with at least this fraction of the weight
# itself: new - old in float32 loses ~1e-7 of |old|, which would otherwise
# dominate a tiny update.
_UPDATE_FLOOR = 1e-3
# How close a ratio must be to N (or 1/N) to name "the replica count" as the cause.
_RATIO_SLACK = 0.03


@dataclasses.dataclass(frozen=True)
class Step:
    """What one training step reported.

    Attributes:
        logs: the step's logs (``loss``, ``<output>_loss``, metrics), as numbers or arrays.
        updates: new minus old value of each variable, in the model's variable order.

    Example:
        >>> Step(logs={"loss": 1.0}, updates=[]).logs["loss"]
        1.0
    """

    logs: Mapping[str, Any]
    updates: Sequence[np.ndarray]


@dataclasses.dataclass(frozen=True)
class Context:
    """What explains an expected difference.

    Attributes:
        batch_norm: names of BatchNormalization layers computing per-replica
            batch statistics (not ``synchronized``).
        randomness: names of layers whose training-time randomness stayed on.
        quieted: names of the Dropout/noise layers switched off for the check.
        global_batch: the examples of the compared batch.

    Example:
        >>> Context(quieted=("dropout",)).quieted
        ('dropout',)
    """

    batch_norm: tuple[str, ...] = ()
    randomness: tuple[str, ...] = ()
    quieted: tuple[str, ...] = ()
    global_batch: int | None = None


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome: ``kind`` is ``same``, ``explained`` or ``different``; ``line`` says it.

    Example:
        >>> Verdict("same", "mirrorkit: one-device check: same").kind
        'same'
    """

    kind: str
    line: str


@dataclasses.dataclass(frozen=True)
class _Item:
    what: str       # "loss", "metric", "variable"
    name: str
    distributed: np.ndarray
    one: np.ndarray
    relative: float
    ratio: float | None


PREFIX = "mirrorkit: one-device check: "


def _norm(a: np.ndarray) -> float:
    return float(np.linalg.norm(np.ravel(a).astype(np.float64)))


def _ratio(a: np.ndarray, b: np.ndarray) -> float | None:
    # The scale that best maps one device's value onto the distributed one.
    a, b = np.ravel(a).astype(np.float64), np.ravel(b).astype(np.float64)
    denominator = float(b @ b)
    return None if denominator == 0.0 else float(a @ b) / denominator


def _log_item(name: str, a: Any, b: Any) -> _Item:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    what = "loss" if name == "loss" or name.endswith("_loss") else "metric"
    relative = _norm(a - b) / max(_norm(b), 1e-7)
    return _Item(what, name, a, b, relative, _ratio(a, b))


def _update_item(name: str, a: np.ndarray, b: np.ndarray, old: np.ndarray) -> _Item:
    relative = _norm(a - b) / (_norm(b) + _UPDATE_FLOOR * _norm(old) + 1e-30)
    return _Item("variable", name, a, b, relative, _ratio(a, b))


def _match_logs(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    shared = [k for k in a if k in b]
    if len(shared) == len(a) == len(b):
        return [(k, a[k], b[k]) for k in shared]
    if len(a) == len(b):
        # A copy may name its outputs differently (a subclassed model's
        # auto-generated layer names): the logs come in the same order.
        return [(k, a[k], b[kb]) for k, kb in zip(a, b)]
    return [(k, a[k], b[k]) for k in shared]


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _scope(items: list[_Item]) -> str:
    losses = sum(i.what == "loss" for i in items)
    metrics = sum(i.what == "metric" for i in items)
    variables = sum(i.what == "variable" for i in items)
    parts = ["loss" if losses == 1 else f"{losses} losses"]
    if metrics:
        parts.append(_count(metrics, "metric"))
    parts.append(_count(variables, "variable"))
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _value(v: np.ndarray) -> str:
    return f"{float(v):.4g}" if v.size == 1 else f"|{_norm(v):.4g}|"


def _describe(item: _Item) -> str:
    if item.what == "variable":
        return f"variable {item.name} update " + (
            "differs" if item.ratio is None else f"x{item.ratio:.2f}")
    ratio = "" if item.ratio is None else f" (x{item.ratio:.2f})"
    return f"{item.name} {_value(item.distributed)} vs {_value(item.one)} one device{ratio}"


def _near(ratio: float | None, target: float) -> bool:
    return ratio is not None and abs(ratio - target) <= _RATIO_SLACK * target


def _cause(differing: list[_Item], replicas: int, context: Context) -> tuple[str, str]:
    """(kind, likely cause) of the differences."""
    losses = [i for i in differing if i.what == "loss"]
    variables = [i for i in differing if i.what == "variable"]
    n = replicas
    if (losses or variables) and all(_near(i.ratio, n) for i in losses + variables):
        return "different", (
            f"the loss is scaled wrongly for the replicas (x{n} = the replica count): a loss "
            "that reduces itself, e.g. returns ops.mean(...) (scalar-losses fix disabled?), "
            "or a train_step that does not scale its loss for the replicas")
    if losses and not variables and all(_near(i.ratio, 1 / n) for i in losses):
        return "different", (
            f"the logged loss is divided by the replicas (x1/{n}): a train_step that logs "
            "the loss after Keras scaled it for the gradient sum; the training matches")
    if context.batch_norm:
        per_replica = (f" ({context.global_batch // n} examples each instead of "
                       f"{context.global_batch})" if context.global_batch else "")
        return "explained", (
            f"BatchNormalization ({', '.join(context.batch_norm[:3])}) normalises with "
            f"per-replica batch statistics{per_replica}, as expected; not a bug -- "
            "mirrorkit run --sync-batch-norm (in code: mirrorkit.sync_batch_norm(model)) gives "
            "one device's numbers")
    if context.randomness:
        return "explained", (
            f"training-time randomness of {', '.join(context.randomness[:3])} is drawn per "
            "replica, as expected")
    return "different", (
        "randomness in the step (dropout, noise) or batch statistics (BatchNormalization), "
        "a loss or layer that depends on the per-replica batch (sums over the batch, "
        "add_loss), or the data order")


def compare(distributed: Step, one: Step, *, old: Sequence[np.ndarray],
            names: Sequence[str], replicas: int, context: Context = Context(),
            tolerance: float = TOLERANCE) -> Verdict:
    """Compare a distributed training step with the same step on one device.

    Args:
        distributed: what the model's own step on ``replicas`` replicas reported.
        one: what the one-device copy's step reported.
        old: each variable's value before the step (scales its update's tolerance).
        names: each variable's name (``dense/kernel``), in the same order.
        replicas: the replica count of the distributed step.
        context: what explains an expected difference (BatchNormalization,
            randomness left on) and what was switched off for the check.
        tolerance: the largest relative difference still reported as the same.
            Defaults to :data:`TOLERANCE`.

    Returns:
        The verdict; its line starts with ``mirrorkit: one-device check:``.

    Example:
        >>> import numpy as np
        >>> same = Step(logs={"loss": 1.0}, updates=[np.array([0.5, 0.5])])
        >>> compare(same, same, old=[np.ones(2)], names=["dense/kernel"], replicas=2).line
        'mirrorkit: one-device check: same (largest relative difference 0.0e+00 over loss and 1 variable)'
    """
    items = [_log_item(k, a, b) for k, a, b in _match_logs(distributed.logs, one.logs)]
    items += [_update_item(name, a, b, o) for name, a, b, o
              in zip(names, distributed.updates, one.updates, old)]
    largest = max((i.relative for i in items), default=0.0)
    quieted = (f"; {', '.join(context.quieted[:3])} switched off for the check: each "
               "replica draws its own dropout mask" if context.quieted else "")
    differing = [i for i in items if i.relative > tolerance]
    if not differing:
        return Verdict("same", f"{PREFIX}same (largest relative difference {largest:.1e} "
                               f"over {_scope(items)}{quieted})")
    kind, cause = _cause(differing, replicas, context)
    parts = [_describe(i) for i in differing if i.what != "variable"]
    # The most different first; near ties (a factor on every variable) in the model's order.
    variables = sorted((i for i in differing if i.what == "variable"),
                       key=lambda i: -float(f"{i.relative:.2g}"))
    if variables:
        more = len(variables) - 1
        parts.append(_describe(variables[0])
                     + (f" (and {_count(more, 'more variable')})" if more else ""))
    text = "; ".join(parts)
    if kind == "explained":
        return Verdict(kind, f"{PREFIX}differs as expected: {cause} ({text}; largest relative "
                             f"difference {largest:.1e}{quieted})")
    return Verdict(kind, f"{PREFIX}DIFFERENT: {text} -- likely cause: {cause}{quieted}")
