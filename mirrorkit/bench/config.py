"""What ``mirrorkit bench`` measures (:class:`BenchConfig`) and what it reports (:class:`BenchReport`).

Example:
    >>> parse_counts("1,2,4")
    (1, 2, 4)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from mirrorkit.errors import UserInputError

#: Prefix of the one stdout line a configuration's process reports with.


RESULT_TAG = "MIRRORKIT_BENCH_RESULT "

#: Columns of ``bench.csv`` (and keys of every row in ``bench.json``).
FIELDS = (
    "workers", "replicas", "replicas_per_worker", "per_replica_batch", "global_batch",
    "steps", "step_time_ms", "images_per_sec", "efficiency", "strategy", "status", "error",
)

_PIP_HINT = 'pip install "mirrorkit[bench]"'


def parse_counts(value: str | int | Iterable[int], *, name: str = "replicas") -> tuple[int, ...]:
    """Parse ``"1,2,4"`` (or ints) into a sorted tuple of distinct positive ints.

    Args:
        value: comma-separated text, one int, or an iterable of ints.
        name: the option's name, used in the error message.

    Returns:
        The counts, ascending, without duplicates.

    Raises:
        UserInputError: for an empty list, a non-integer or a count < 1.

    Example:
        >>> parse_counts("4,1,2,2")
        (1, 2, 4)
    """
    if isinstance(value, str):
        items: list[Any] = [part.strip() for part in value.split(",")]
    elif isinstance(value, int):
        items = [value]
    else:
        items = list(value)
    shown = value if isinstance(value, str) else ",".join(map(str, items))
    counts = []
    for item in items or [0]:
        try:
            if isinstance(item, bool) or (not isinstance(item, (int, str))):
                raise ValueError
            count = int(item)
        except ValueError:
            count = 0
        if count < 1:
            raise UserInputError(
                f"`{name}` must be a comma-separated list of positive integers, "
                f"e.g. 1,2,4. Received: {name}={shown!r}"
            )
        counts.append(count)
    return tuple(sorted(set(counts)))


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserInputError(f"`{name}` must be a positive integer. Received: {name}={value!r}")


@dataclasses.dataclass(frozen=True)
class Case:
    """One configuration to measure: ``workers`` processes of ``replicas_per_worker``.

    Example:
        >>> Case(workers=2, replicas_per_worker=1).replicas
        2
    """

    workers: int
    replicas_per_worker: int

    @property
    def replicas(self) -> int:
        """Replicas in sync across all workers."""
        return self.workers * self.replicas_per_worker


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What ``mirrorkit bench`` measures.

    Attributes:
        model: a :mod:`mirrorkit.training.models` name. Defaults to ``"cnn"``.
        dataset: a :mod:`mirrorkit.datasets` name. Defaults to ``"digits"``.
        replicas: replica counts of one process (MirroredStrategy). 1 is
            always added: efficiency is relative to it. Defaults to ``(1, 2)``.
        workers: worker counts; ``w > 1`` runs ``w`` loopback worker
            processes (MultiWorkerMirroredStrategy), one replica each.
            Defaults to ``(1,)``.
        steps: timed training steps per configuration. Defaults to 30.
        warmup_steps: untimed steps before (tracing, first buffer fill).
            Defaults to 5.
        per_replica_batch: images per replica per step; the global batch
            grows with the replica count (weak scaling). Defaults to 32.
        seed: seed for data order and weights. Defaults to 0.
        timeout: seconds one configuration may take. Defaults to 600.
        threads: TensorFlow intra-op threads per process, or None for
            TensorFlow's default (all cores). ``threads=1`` gives every
            process the same compute, so on one machine a 1- vs 2-worker
            comparison isolates the all-reduce cost instead of measuring two
            processes sharing the cores. Defaults to None.

    Example:
        >>> BenchConfig(replicas=(2, 4)).cases()
        (Case(workers=1, replicas_per_worker=1), Case(workers=1, replicas_per_worker=2), Case(workers=1, replicas_per_worker=4))
    """

    model: str = "cnn"
    dataset: str = "digits"
    replicas: tuple[int, ...] = (1, 2)
    workers: tuple[int, ...] = (1,)
    steps: int = 30
    warmup_steps: int = 5
    per_replica_batch: int = 32
    seed: int = 0
    timeout: float = 600.0
    threads: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "replicas", parse_counts(self.replicas, name="replicas"))
        object.__setattr__(self, "workers", parse_counts(self.workers, name="workers"))
        for name in ("steps", "warmup_steps", "per_replica_batch"):
            if name == "warmup_steps" and self.warmup_steps == 0:
                continue
            _positive(name, getattr(self, name))
        if self.threads is not None:
            _positive("threads", self.threads)
        if not self.model or not isinstance(self.model, str):
            raise UserInputError(f"`model` must be a model name. Received: model={self.model!r}")
        if not self.dataset or not isinstance(self.dataset, str):
            raise UserInputError(
                f"`dataset` must be a dataset name. Received: dataset={self.dataset!r}")
        # Fail here, in one line, rather than once per configuration after a
        # TensorFlow start-up each (both checks are TensorFlow-free).
        from mirrorkit.datasets import parse_spec
        from mirrorkit.training.models import model_spec

        model_spec(self.model)
        parse_spec(self.dataset)
        if not (isinstance(self.timeout, (int, float)) and self.timeout > 0):
            raise UserInputError(f"`timeout` must be a positive number of seconds. "
                                 f"Received: timeout={self.timeout!r}")

    def cases(self) -> tuple[Case, ...]:
        """The configurations to run, in order: 1 worker x each replica count, then each worker count > 1."""
        local = tuple(Case(1, r) for r in sorted(set(self.replicas) | {1}))
        remote = tuple(Case(w, 1) for w in self.workers if w > 1)
        return local + remote


@dataclasses.dataclass(frozen=True)
class BenchRow:
    """The measurement of one :class:`Case`.

    Attributes:
        workers: worker processes.
        replicas: replicas in sync (all workers).
        replicas_per_worker: replicas of each process.
        per_replica_batch: images per replica per step.
        global_batch: images per step across all replicas.
        steps: timed steps (at least the steps asked: whole tf.function calls).
        step_time_ms: median time of one timed step, milliseconds.
        images_per_sec: timed images / timed seconds (the whole cluster).
        efficiency: ``images_per_sec / (replicas * images_per_sec of 1 replica)``.
        strategy: the strategy the process used (``mirrored``, ``multi_worker``).
        status: ``"ok"`` or ``"failed"``.
        error: why it failed (empty when ok).
    """

    workers: int
    replicas: int
    replicas_per_worker: int
    per_replica_batch: int
    global_batch: int
    steps: int
    step_time_ms: float | None
    images_per_sec: float | None
    efficiency: float | None
    strategy: str
    status: str
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-ready dict with the :data:`FIELDS` keys."""
        return {name: getattr(self, name) for name in FIELDS}


@dataclasses.dataclass(frozen=True)
class BenchReport:
    """Everything ``mirrorkit bench`` found, ready to print or write.

    Attributes:
        config: what was asked.
        rows: one :class:`BenchRow` per configuration, in run order.
        machine: host facts (CPU model, cores, GPUs, versions, date).
    """

    config: BenchConfig
    rows: tuple[BenchRow, ...]
    machine: dict[str, Any]

    @property
    def failed(self) -> tuple[BenchRow, ...]:
        """Rows whose configuration did not produce a measurement."""
        return tuple(r for r in self.rows if r.status != "ok")

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict: ``config``, ``machine``, ``rows``."""
        config = dataclasses.asdict(self.config)
        return {"config": config, "machine": dict(self.machine),
                "rows": [r.to_dict() for r in self.rows]}

    def table(self) -> str:
        """A fixed-width text table, one line per configuration.

        Example:
            >>> print(report.table())                 # doctest: +SKIP
            workers  replicas  global_batch  step_ms  images/s  efficiency  status
                  1         1            32     4.10    7804.9        1.00  ok
        """
        head = ("workers", "replicas", "global_batch", "step_ms", "images/s", "efficiency", "status")
        lines = []
        for r in self.rows:
            lines.append((
                str(r.workers), str(r.replicas), str(r.global_batch),
                "-" if r.step_time_ms is None else f"{r.step_time_ms:.2f}",
                "-" if r.images_per_sec is None else f"{r.images_per_sec:.1f}",
                "-" if r.efficiency is None else f"{r.efficiency:.2f}",
                r.status if r.status == "ok" else f"failed: {r.error.splitlines()[0][:60] if r.error else ''}",
            ))
        widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
                  for i, h in enumerate(head)]
        out = ["  ".join(h.rjust(w) if i < 6 else h for i, (h, w) in enumerate(zip(head, widths)))]
        for line in lines:
            out.append("  ".join(c.rjust(w) if i < 6 else c
                                 for i, (c, w) in enumerate(zip(line, widths))))
        return "\n".join(out)


# --------------------------------------------------------------------------
# Parent side: plan, start one fresh process (or worker group) per case.
# --------------------------------------------------------------------------
