"""A frozen description of how this process trains.

Example:
    >>> rt = Runtime(strategy="mirrored", replicas=2, workers=1, task_type=None,
    ...              task_index=0, is_chief=True, devices=("/cpu:0", "/cpu:1"),
    ...              reason="2 simulated CPU devices")
    >>> rt.replicas, rt.is_multi_worker
    (2, False)
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Runtime:
    """What :func:`mirrorkit.get_strategy` chose, and why.

    Attributes:
        strategy: ``"default"``, ``"mirrored"`` or ``"multi_worker"``.
        replicas: replicas in sync across the whole cluster.
        workers: number of training processes (1 unless multi-worker).
        task_type: ``"worker"``/``"chief"`` under a cluster, else None.
        task_index: index within ``task_type`` (0 when local).
        is_chief: True for the process that writes checkpoints and logs.
        devices: the devices this process computes on.
        reason: one human-readable sentence saying why this strategy.
        cluster_source: ``"TF_CONFIG"``, ``"slurm"`` or None when local.
    """

    strategy: str
    replicas: int
    workers: int
    task_type: str | None
    task_index: int
    is_chief: bool
    devices: tuple[str, ...]
    reason: str
    cluster_source: str | None = None

    @property
    def is_multi_worker(self) -> bool:
        """True when more than one process trains together."""
        return self.workers > 1

    @property
    def task(self) -> str:
        """``"worker:1"`` style label, or ``"local"``."""
        if self.task_type is None:
            return "local"
        return f"{self.task_type}:{self.task_index}"

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-ready dict (``devices`` as a list)."""
        data = dataclasses.asdict(self)
        data["devices"] = list(self.devices)
        data["task"] = self.task
        return data

    def summary(self) -> str:
        """One line for logs: strategy, replicas, workers and reason."""
        where = f", {self.workers} workers, this is {self.task}" if self.is_multi_worker else ""
        return f"strategy={self.strategy} replicas={self.replicas}{where} ({self.reason})"
