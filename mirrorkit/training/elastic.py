"""The batch of a run that resumes on fewer (or more) replicas than it had.

When ``mirrorkit launch --min-workers M`` restarts a job with the workers
that remain, ``mirrorkit train`` resumes from the backup on fewer replicas.
The launcher says how to keep the batch (``MIRRORKIT_ELASTIC_BATCH``):

* ``global`` (default): the same effective global batch, so the run goes on
  with the same optimisation: each replica's batch grows
  (``per_replica x replicas x K`` stays). A batch that does not divide is a
  clear error naming what would.
* ``per-replica``: the same per-replica batch; the global batch shrinks and
  the learning rate follows it by the run's scaling rule (``--lr-scaling``).

The replica count and batch before the change come from the last
``run_start`` of the chief's event log, sent to every worker (so workers on
other machines need not read the chief's folder). The change is printed,
recorded in metrics.json (``incidents``) and logged as a ``membership``
event.

Example:
    >>> from mirrorkit.training.config import TrainConfig
    >>> before = {"replicas": 3, "per_replica_batch": 32, "accumulate": 1}
    >>> config, change = adapt(TrainConfig(), before, replicas=2, rule="global")
    >>> config.per_replica_batch, change["effective_batch"]
    (48, 96)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mirrorkit.errors import UserInputError
from mirrorkit.training.config import TrainConfig
from mirrorkit.training.events import EVENTS_FILE, read_events
from mirrorkit.training.plan import nearest_multiple


def previous_plan(out: Path) -> dict[str, int] | None:
    """Replicas, per-replica batch and K of the run's last start (its event log), or None.

    Example:
        >>> previous_plan(Path("surely/not/a/run")) is None
        True
    """
    starts = [e for e in read_events(out / EVENTS_FILE) if e.get("event") == "run_start"]
    if not starts:
        return None
    plan, strategy = starts[-1].get("plan") or {}, starts[-1].get("strategy") or {}
    try:
        return {"replicas": int(strategy["replicas"]), "workers": int(strategy["workers"]),
                "per_replica_batch": int(plan["per_replica_batch"]),
                "accumulate": int(plan.get("accumulate") or 1),
                "learning_rate": float(plan["learning_rate"])}
    except (KeyError, TypeError, ValueError):
        return None


def adapt(config: TrainConfig, before: dict[str, int] | None, *, replicas: int,
          rule: str) -> tuple[TrainConfig, dict[str, Any] | None]:
    """The config for ``replicas`` by ``rule``, and the change (None when nothing changed).

    Raises:
        UserInputError: with ``global``, an effective batch that does not divide
            by the new replica count (naming what would).

    Example:
        >>> before = {"replicas": 4, "per_replica_batch": 32, "accumulate": 1}
        >>> adapt(TrainConfig(), before, replicas=3, rule="global")
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: Cannot keep the global batch 128 on 3 replicas (42.67 per replica): use --elastic-batch per-replica, or start with a global batch that divides by 3 x 1: use a multiple of 3: 126 or 129
    """
    if before is None or before["replicas"] == replicas:
        return config, None
    b0, k, r0 = before["per_replica_batch"], before["accumulate"], before["replicas"]
    effective = b0 * r0 * k
    if rule == "global":
        unit = replicas * k
        if effective % unit:
            raise UserInputError(
                f"Cannot keep the global batch {effective} on {replicas} replicas "
                f"({effective / unit:.2f} per replica): use --elastic-batch per-replica, or "
                f"start with a global batch that divides by {replicas} x {k}: "
                f"{nearest_multiple(effective, unit)}")
        b = effective // (replicas * k)
    else:
        b = b0
    adapted = dataclasses.replace(config, per_replica_batch=b, global_batch=None, accumulate=k)
    return adapted, {"kind": "membership", "rule": rule, "replicas_before": r0,
                     "replicas": replicas, "workers_before": before.get("workers"),
                     "per_replica_batch_before": b0, "per_replica_batch": b,
                     "effective_batch_before": effective, "effective_batch": b * replicas * k,
                     "learning_rate_before": before.get("learning_rate")}


def describe(change: dict[str, Any]) -> str:
    """The line a membership change prints (``learning_rate`` is the new plan's).

    Example:
        >>> describe({"rule": "global", "replicas_before": 3, "replicas": 2,
        ...           "per_replica_batch_before": 32, "per_replica_batch": 48,
        ...           "effective_batch_before": 96, "effective_batch": 96,
        ...           "learning_rate_before": 0.006, "learning_rate": 0.006})
        'elastic: 3 -> 2 replicas; the global batch stays 96 (per replica 32 -> 48), learning rate 0.006'
    """
    moved = f"{change['replicas_before']} -> {change['replicas']} replicas"
    if change["rule"] == "global":
        return (f"elastic: {moved}; the global batch stays {change['effective_batch']} (per "
                f"replica {change['per_replica_batch_before']} -> "
                f"{change['per_replica_batch']}), learning rate {change['learning_rate']:g}")
    before = change.get("learning_rate_before")
    return (f"elastic: {moved}; the per-replica batch stays {change['per_replica_batch']} "
            f"(global {change['effective_batch_before']} -> {change['effective_batch']}), "
            f"learning rate {'?' if before is None else f'{before:g}'} -> "
            f"{change['learning_rate']:g} ({change.get('lr_scaling', 'linear')} scaling)")


def agree(run: Any) -> dict[str, Any] | None:
    """The chief's :func:`previous_plan`, on every worker; a collective when multi-worker.

    Called only on a restarted, elastic job (every worker decides that alike
    from its environment), right after the strategy exists.

    Example:
        >>> agree(run)                   # doctest: +SKIP
        {'replicas': 3, 'workers': 3, 'per_replica_batch': 32, 'accumulate': 1, ...}
    """
    before = previous_plan(run.out) if run.runtime.is_chief else None
    if not run.runtime.is_multi_worker:
        return before
    import tensorflow as tf

    from mirrorkit.training.chief import broadcast_from_chief

    keys = ("replicas", "workers", "per_replica_batch", "accumulate", "learning_rate")
    values = [float(before[k]) if before else -1.0 for k in keys]
    got = broadcast_from_chief(run.strategy, [tf.constant(v, tf.float64) for v in values])
    numbers = [float(t.numpy()) for t in got]
    if numbers[0] < 0:
        return None
    return {k: (v if k == "learning_rate" else int(v)) for k, v in zip(keys, numbers)}
