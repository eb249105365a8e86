"""Which strategy to use, decided from facts alone (no TensorFlow).

:func:`select` is a pure function of the facts (requested kind, GPU count,
simulated CPUs, the cluster from TF_CONFIG or Slurm), so every rule can be
tested without devices or a cluster; :mod:`mirrorkit.distribute.strategy`
gathers the facts and creates what it decides.

Example:
    >>> sel = select("auto", gpus=0, simulate_cpus=4)
    >>> sel.kind, sel.replicas
    ('mirrored', 4)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mirrorkit.distribute.cluster import ClusterSpec
from mirrorkit.errors import UserInputError

KINDS = ("auto", "default", "mirrored", "multi_worker")


@dataclasses.dataclass(frozen=True)
class Selection:
    """The decision :func:`select` makes.

    Attributes:
        kind: ``"default"``, ``"mirrored"`` or ``"multi_worker"``.
        reason: why, in one sentence.
        simulate_cpus: logical CPU devices to create, or None.
        gpus: physical GPUs visible.
        cluster: the parsed cluster under TF_CONFIG/Slurm, else None.
        cluster_source: ``"TF_CONFIG"`` or ``"slurm"`` when ``cluster`` is set.
    """

    kind: str
    reason: str
    simulate_cpus: int | None = None
    gpus: int = 0
    cluster: ClusterSpec | None = None
    cluster_source: str | None = None

    @property
    def replicas(self) -> int:
        """Replicas this process will hold (multi-worker: 1 per CPU worker)."""
        if self.kind == "mirrored":
            return self.gpus or self.simulate_cpus or 1
        if self.kind == "multi_worker":
            return max(self.gpus, 1)
        return 1


def check_kind(kind: str) -> str:
    """Return ``kind`` if it is one of :data:`KINDS`, else raise ``UserInputError`` naming them.

    Example:
        >>> check_kind("mirrored")
        'mirrored'
    """
    if kind not in KINDS:
        raise UserInputError(
            f"Unknown strategy kind. Received: strategy={kind!r}; accepted: "
            f"{', '.join(KINDS)}"
        )
    return kind


def _check_simulate(simulate_cpus: Any) -> int | None:
    if simulate_cpus is None:
        return None
    if isinstance(simulate_cpus, bool) or not isinstance(simulate_cpus, int) or simulate_cpus < 1:
        raise UserInputError(
            "simulate_cpus must be a positive integer. "
            f"Received: simulate_cpus={simulate_cpus!r}"
        )
    return simulate_cpus


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def select(
    kind: str = "auto",
    *,
    gpus: int,
    simulate_cpus: int | None = None,
    cluster: ClusterSpec | None = None,
    cluster_source: str = "TF_CONFIG",
    simulate_source: str = "simulate_cpus",
) -> Selection:
    """Decide which strategy to use from the facts, without touching TensorFlow.

    Rules for ``kind="auto"``: a cluster with more than one training task ->
    ``multi_worker``; else 2+ GPUs -> ``mirrored`` over all of them; else one
    GPU -> ``mirrored`` over that GPU; else on CPU -> ``mirrored`` over
    ``simulate_cpus`` logical devices when asked, otherwise ``default``.

    Args:
        kind: one of ``auto``, ``default``, ``mirrored``, ``multi_worker``.
        gpus: number of physical GPUs visible.
        simulate_cpus: split the CPU into this many logical devices when no GPU
            is present.
        cluster: the parsed TF_CONFIG (or Slurm-derived) cluster, if any.
        cluster_source: where ``cluster`` came from, for the reason text.
        simulate_source: where ``simulate_cpus`` came from, for the reason.

    Returns:
        A :class:`Selection`.

    Raises:
        UserInputError: for an unknown kind, a bad ``simulate_cpus``, or a cluster
            task mirrorkit cannot train as (``ps``).

    Example:
        >>> select("auto", gpus=2).reason
        '2 GPUs visible'
    """
    check_kind(kind)
    simulate_cpus = _check_simulate(simulate_cpus)
    if cluster is not None and cluster.task_type == "ps":
        raise UserInputError(
            "TF_CONFIG makes this process a parameter server ('ps'); mirrorkit "
            "trains with synchronous all-reduce and has no ps role. Received: "
            "task.type='ps'; accepted: chief, worker"
        )
    sim = simulate_cpus if (simulate_cpus and not gpus) else None
    ignored = ""
    if simulate_cpus and gpus:
        ignored = f"; {simulate_source}={simulate_cpus} ignored because GPUs are present"
    if gpus:
        local = f"{_plural(gpus, 'GPU')} visible"
    elif sim:
        local = f"{simulate_source}={sim} on a CPU-only machine"
    else:
        local = "no GPU visible and no simulated CPUs requested"

    # "slurm names 2 workers" reads oddly; say what the user would say.
    where = {"slurm": "the Slurm step"}.get(cluster_source, cluster_source)
    n_workers = cluster.num_workers if cluster is not None else 0
    multi = cluster is not None and n_workers > 1 and cluster.task_type in ("chief", "worker")
    if kind == "multi_worker" or (kind == "auto" and multi):
        if cluster is None:
            reason = "strategy 'multi_worker' requested without a cluster; one local worker"
            return Selection("multi_worker", reason + ignored, None, gpus)
        reason = (f"{where} names {_plural(n_workers, 'worker')}, "
                  f"this is {cluster.task_type} {cluster.task_index}")
        if sim:
            reason += f"; {simulate_source}={sim} ignored: each CPU worker holds one replica"
        return Selection("multi_worker", reason, None, gpus, cluster, cluster_source)

    if cluster is not None and n_workers <= 1:
        local += f"; {where} names a single worker, training locally"
    elif cluster is not None and cluster.task_type == "evaluator":
        local += f"; {where} makes this the evaluator, which does not join training"
    if kind == "default":
        return Selection("default", f"strategy 'default' requested; {local}{ignored}", None, gpus)
    if kind == "mirrored":
        return Selection("mirrored", f"strategy 'mirrored' requested; {local}{ignored}", sim, gpus)
    if gpus or sim:
        return Selection("mirrored", local + ignored, sim, gpus)
    return Selection("default", local + "; using the default strategy", None, gpus)
