"""Targets a run must meet: ``val_accuracy>=0.95``, ``wall_time_seconds<=600``.

A target names a number in metrics.json, an operator (``>=``, ``<=``, ``>``,
``<``) and a threshold. :func:`parse_target` checks one when the run is
configured (an unknown metric is an error before any training);
:func:`evaluate` checks them against the finished run's metrics, and the
result becomes metrics.json's ``targets`` section. ``mirrorkit train`` exits
with :data:`MISSED_EXIT_CODE` when any is missed, after writing everything,
so a CI pipeline or a Slurm script can gate on it.

Example:
    >>> target = parse_target("val_accuracy>=0.95")
    >>> evaluate([target], {"val_accuracy": 0.97})[0]["met"]
    True
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from typing import Any, Mapping, Sequence

from mirrorkit.errors import UserInputError
from mirrorkit.protocol import TARGET_MISSED_PREFIX, ExitCode, format_target_missed

# Distinct from errors (1) and usage errors (2); the launcher-to-worker
# protocol defines it, since `mirrorkit launch` interprets it.
MISSED_EXIT_CODE = int(ExitCode.TARGET_MISSED)
# How each miss is reported; `mirrorkit launch` recognises a finished run by it.
MISSED_PREFIX = TARGET_MISSED_PREFIX

# The numbers mirrorkit train writes to metrics.json (tests keep this list in
# step with a real run's file).
METRICS = (
    "val_accuracy", "val_loss", "epochs", "epochs_run", "initial_epoch", "train_examples",
    "val_examples", "num_classes", "params", "replicas", "workers", "per_replica_batch",
    "global_batch", "accumulate", "effective_batch", "steps_per_epoch",
    "optimizer_steps_per_epoch", "steps_per_execution", "base_learning_rate", "base_batch",
    "learning_rate", "warmup_epochs", "seed", "images_per_second",
    "images_per_second_per_replica", "wall_time_seconds", "rollbacks", "max_rollbacks",
    "rollback_lr_factor", "spike_factor",
)

_OPERATORS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
_FORM = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=|>|<)\s*([^<>=\s]\S*)\s*$")


@dataclasses.dataclass(frozen=True)
class Target:
    """One target: ``metric op threshold``.

    Example:
        >>> Target("val_loss", "<", 0.2).text
        'val_loss<0.2'
    """

    metric: str
    op: str
    threshold: float

    @property
    def text(self) -> str:
        """The target as written, normalised (``val_loss<0.2``)."""
        return f"{self.metric}{self.op}{self.threshold:g}"

    def met_by(self, value: float | None) -> bool:
        """Whether ``value`` meets it (a missing value never does)."""
        return value is not None and _OPERATORS[self.op](value, self.threshold)


def parse_target(text: str) -> Target:
    """Parse ``METRIC OP NUMBER`` (OP one of >=, <=, >, <) naming a metrics.json number.

    Raises:
        UserInputError: one line naming what was wrong and what is accepted.

    Example:
        >>> parse_target("images_per_second > 2000")
        Target(metric='images_per_second', op='>', threshold=2000.0)
    """
    found = _FORM.match(text) if isinstance(text, str) else None
    if found is None:
        raise UserInputError(
            "A target must read METRIC>=NUMBER (operators >=, <=, >, <), e.g. "
            f"'val_accuracy>=0.95'. Received: target={text!r}")
    metric, op, number = found.groups()
    if metric not in METRICS:
        raise UserInputError(f"Unknown metric {metric!r} in target {text!r}; targets can name "
                             f"any number in metrics.json: {', '.join(METRICS)}")
    try:
        threshold = float(number)
    except ValueError:
        threshold = math.nan
    if not math.isfinite(threshold):
        raise UserInputError(f"The threshold of target {text!r} must be a finite number. "
                             f"Received: {number!r}")
    return Target(metric, op, threshold)


def evaluate(targets: Sequence[Target], metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each target with the measured value and whether it was met (metrics.json's ``targets``).

    Example:
        >>> evaluate([parse_target("val_loss<0.2")], {"val_loss": 0.25})
        [{'target': 'val_loss<0.2', 'metric': 'val_loss', 'op': '<', 'threshold': 0.2, 'value': 0.25, 'met': False}]
    """
    out = []
    for target in targets:
        value = metrics.get(target.metric)
        value = float(value) if isinstance(value, (int, float)) and not isinstance(
            value, bool) else None
        out.append({"target": target.text, "metric": target.metric, "op": target.op,
                    "threshold": target.threshold, "value": value,
                    "met": target.met_by(value)})
    return out


def missed_lines(results: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per missed target, for the user.

    Example:
        >>> missed_lines([{"target": "val_loss<0.2", "value": 0.25, "met": False}])
        ['target missed: val_loss<0.2 (measured 0.25)']
    """
    return [format_target_missed(r["target"], r["value"]) for r in results if not r["met"]]
