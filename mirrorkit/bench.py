"""Training throughput and scaling efficiency per replica and worker count.

The library behind ``mirrorkit bench``. Every configuration runs in a fresh
Python process, because the device split (simulated CPUs) and multi-worker
collectives can be set up only once per process. Workers > 1 are real worker
processes on loopback ports, each with its own ``TF_CONFIG``.

Throughput is measured on training steps only: the first ``warmup_steps``
steps (tracing, graph optimisation, first shuffle-buffer fill) are excluded,
then ``steps`` steps are timed one by one by a Keras callback. Images/s is
``timed images / timed seconds``; scaling efficiency is
``images_per_sec(n) / (n * images_per_sec(1))`` -- 1.0 is linear scaling.

On a CPU-only machine ``replicas=n`` splits the CPU into ``n`` logical
devices: the replicas then share the same cores, so the figures measure
mirrorkit's and TensorFlow's overhead, not a speed-up.

Example:
    >>> from mirrorkit.bench import BenchConfig, run_bench, write_report
    >>> config = BenchConfig(model="cnn", dataset="digits", replicas=(1, 2), steps=10)
    >>> report = run_bench(config)                    # doctest: +SKIP
    >>> print(report.table())                         # doctest: +SKIP
    >>> write_report(report, "bench-out")             # doctest: +SKIP
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import io
import json
import logging
import math
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from mirrorkit import _env

logger = logging.getLogger(__name__)

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
        ValueError: for an empty list, a non-integer or a count < 1.

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
            raise ValueError(
                f"`{name}` must be a comma-separated list of positive integers, "
                f"e.g. 1,2,4. Received: {name}={shown!r}"
            )
        counts.append(count)
    return tuple(sorted(set(counts)))


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")


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
        model: a :mod:`mirrorkit.models` name. Defaults to ``"cnn"``.
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
            raise ValueError(f"`model` must be a model name. Received: model={self.model!r}")
        if not self.dataset or not isinstance(self.dataset, str):
            raise ValueError(f"`dataset` must be a dataset name. Received: dataset={self.dataset!r}")
        # Fail here, in one line, rather than once per configuration after a
        # TensorFlow start-up each (both checks are TensorFlow-free).
        from mirrorkit.datasets import parse_spec
        from mirrorkit.models import model_spec

        model_spec(self.model)
        parse_spec(self.dataset)
        if not (isinstance(self.timeout, (int, float)) and self.timeout > 0):
            raise ValueError(f"`timeout` must be a positive number of seconds. "
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

def machine_info() -> dict[str, Any]:
    """Facts about this host that a reader needs to judge the figures (no TensorFlow import).

    Example:
        >>> sorted(machine_info())[:3]
        ['cores', 'cpu_model', 'date']
    """
    from mirrorkit.report import versions

    info: dict[str, Any] = {
        "cores": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "hostname": socket.gethostname(),
        "load_average": _load_average(),
        "platform": platform.platform(),
    }
    info.update(versions())
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _child_env(extra: dict[str, str | None]) -> dict[str, str]:
    env = _env.snapshot()
    # The parent's own steering variables must not leak into a configuration.
    for key in list(env):
        if key.startswith("MIRRORKIT_") or key == "TF_CONFIG":
            del env[key]
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _spec(config: BenchConfig, case: Case) -> dict[str, Any]:
    return {
        "model": config.model, "dataset": config.dataset,
        "replicas": case.replicas_per_worker, "workers": case.workers,
        "steps": config.steps, "warmup_steps": config.warmup_steps,
        "per_replica_batch": config.per_replica_batch, "seed": config.seed,
        "threads": config.threads, "timeout": config.timeout,
    }


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The result dict a :func:`child_command` process printed, or None.

    Example:
        >>> parse_result('noise\\n' + RESULT_TAG + '{"images_per_sec": 5.0}')
        {'images_per_sec': 5.0}
    """
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    return None


_ERROR_LINE = re.compile(r"^(?:[\w.]+\.)?\w*(?:Error|Exception)\b:?")
_TF_STATUS = re.compile(r"\b(?:INVALID_ARGUMENT|UNAVAILABLE|DEADLINE_EXCEEDED|RESOURCE_EXHAUSTED|"
                        r"INTERNAL|FAILED_PRECONDITION|NOT_FOUND|UNKNOWN|ABORTED|CANCELLED):")


def _reason(text: str) -> str:
    """The line of a child's output that says why it failed (its exception), else its last line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i in range(len(lines) - 1, -1, -1):
        if _ERROR_LINE.match(lines[i]):
            # TensorFlow puts the real cause on a later line ("(0) INVALID_ARGUMENT: ...").
            status = next((ln for ln in lines[i + 1:] if _TF_STATUS.search(ln)), "")
            return f"{lines[i]} {status}".strip()
    return lines[-1] if lines else ""


def child_command(config: BenchConfig, case: Case) -> list[str]:
    """The command that measures ``case`` in a fresh process (one worker of it).

    It prints one line starting with :data:`RESULT_TAG` followed by JSON
    (``images_per_sec``, ``step_time_ms``, ``steps``, ...); read it with
    :func:`parse_result`. ``TF_CONFIG`` in its environment makes it a worker
    of a multi-worker case.

    Example:
        >>> child_command(BenchConfig(), Case(1, 2))[1:4]
        ['-m', 'mirrorkit.bench', '--child']
    """
    return [sys.executable, "-m", "mirrorkit.bench", "--child", json.dumps(_spec(config, case))]


def _run_case(config: BenchConfig, case: Case) -> dict[str, Any]:
    """Run one case in fresh process(es); return the chief's result or raise RuntimeError."""
    if case.workers > 1:
        return _run_workers(config, case)
    # The child enforces the timeout itself (see _watchdog); this is a backstop.
    env = _child_env({"TF_CONFIG": None})
    try:
        proc = subprocess.run(child_command(config, case), capture_output=True, text=True,
                              env=env, timeout=config.timeout + 60)
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(f"timed out after {config.timeout:.0f} s") from err
    result = parse_result(proc.stdout)
    if proc.returncode != 0 or result is None:
        raise RuntimeError(f"exited with {proc.returncode}: {_reason(proc.stderr) or 'no output'}")
    return result


def _run_workers(config: BenchConfig, case: Case) -> dict[str, Any]:
    # mirrorkit's own launcher: TF_CONFIG per worker on free loopback ports,
    # and the whole group is stopped as soon as one worker fails.
    from mirrorkit.launcher import LaunchSpec, launch

    out, err = io.StringIO(), io.StringIO()
    spec = LaunchSpec(command=tuple(child_command(config, case)), nproc=case.workers,
                      grace_period=2.0, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    result = launch(spec, stdout=out, stderr=err)
    if result.exit_code != 0:
        cause = result.root_cause
        detail = _reason("\n".join(cause.tail)) if cause is not None and cause.tail else ""
        raise RuntimeError(f"{cause.describe() if cause else result.summary()}"
                           f"{': ' + detail if detail else ''}")
    chief = "\n".join(line[4:] for line in out.getvalue().splitlines() if line.startswith("[0] "))
    parsed = parse_result(chief)
    if parsed is None:
        raise RuntimeError(f"worker 0 printed no result: {_reason(err.getvalue())}")
    return parsed


def run_bench(config: BenchConfig, *,
              progress: Callable[[str], None] | None = None) -> BenchReport:
    """Measure every configuration of ``config``, each in fresh process(es).

    A configuration that fails becomes a ``"failed"`` row with the reason;
    the others still run.

    Args:
        config: what to measure.
        progress: called with one line before each configuration starts.

    Returns:
        A :class:`BenchReport` (rows in :meth:`BenchConfig.cases` order).

    Example:
        >>> report = run_bench(BenchConfig(replicas=(1, 2), steps=10))  # doctest: +SKIP
        >>> [r.replicas for r in report.rows]                           # doctest: +SKIP
        [1, 2]
    """
    machine = machine_info()
    raw: list[tuple[Case, dict[str, Any] | None, str]] = []
    for case in config.cases():
        if progress is not None:
            progress(f"measuring workers={case.workers} replicas={case.replicas} "
                     f"global_batch={case.replicas * config.per_replica_batch} ...")
        try:
            raw.append((case, _run_case(config, case), ""))
        except RuntimeError as err:
            logger.warning("bench case %s failed: %s", case, err)
            raw.append((case, None, str(err)))
    for _, result, _ in raw:
        if result and result.get("devices_kind"):
            machine.setdefault("device_kind", result["devices_kind"])
            machine.setdefault("gpus", result.get("gpus", 0))
    return BenchReport(config=config, rows=_rows(config, raw), machine=machine)


def _rows(config: BenchConfig,
          raw: Sequence[tuple[Case, dict[str, Any] | None, str]]) -> tuple[BenchRow, ...]:
    base = next((res["images_per_sec"] for case, res, _ in raw
                 if res and case.replicas == 1 and case.workers == 1), None)
    rows = []
    for case, res, error in raw:
        ips = res["images_per_sec"] if res else None
        eff = ips / (case.replicas * base) if (ips and base) else None
        rows.append(BenchRow(
            workers=case.workers, replicas=case.replicas,
            replicas_per_worker=case.replicas_per_worker,
            per_replica_batch=config.per_replica_batch,
            global_batch=case.replicas * config.per_replica_batch,
            steps=res["steps"] if res else config.steps,
            step_time_ms=round(res["step_time_ms"], 3) if res else None,
            images_per_sec=round(ips, 2) if ips else None,
            efficiency=round(eff, 4) if eff else None,
            strategy=res.get("strategy", "") if res else "",
            status="ok" if res else "failed", error=error,
        ))
    return tuple(rows)


# --------------------------------------------------------------------------
# Output: bench.json, bench.csv, bench.png
# --------------------------------------------------------------------------

def write_report(report: BenchReport, output: str | os.PathLike) -> dict[str, Path]:
    """Write ``bench.json`` and ``bench.csv``, then ``bench.png``, into ``output``.

    JSON and CSV are written first, so a missing matplotlib loses only the plot.

    Args:
        report: what :func:`run_bench` returned.
        output: directory (created when missing).

    Returns:
        ``{"json": path, "csv": path, "png": path}``.

    Raises:
        ImportError: when matplotlib is not installed (after JSON and CSV are
            written); the message names ``pip install "mirrorkit[bench]"``.
        NotADirectoryError: when ``output`` exists and is a file.

    Example:
        >>> paths = write_report(report, "bench-out")  # doctest: +SKIP
        >>> sorted(paths)                              # doctest: +SKIP
        ['csv', 'json', 'png']
    """
    out = Path(output)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--output must be a directory. Received: output={str(out)!r} "
                                 "is a file")
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "bench.json", "csv": out / "bench.csv", "png": out / "bench.png"}
    paths["json"].write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=FIELDS, lineterminator="\n")
    writer.writeheader()
    for row in report.rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.to_dict().items()})
    paths["csv"].write_text(buf.getvalue())
    plot_report(report, paths["png"])
    return paths


def plot_report(report: BenchReport, path: str | os.PathLike) -> Path:
    """Draw images/s and scaling efficiency against replicas into a PNG.

    Uses matplotlib's Agg backend (no display needed).

    Raises:
        ImportError: when matplotlib is missing, naming ``pip install "mirrorkit[bench]"``.

    Example:
        >>> plot_report(report, "bench.png")           # doctest: +SKIP
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError(
            f"bench.png needs matplotlib, which is not installed: {_PIP_HINT} "
            "(bench.json and bench.csv were written)"
        ) from err
    cfg = report.config
    fig, (ax_ips, ax_eff) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    series = {
        "1 worker, MirroredStrategy": [r for r in report.rows if r.workers == 1],
        "multi-worker (1 replica each)": [r for r in report.rows if r.workers > 1],
    }
    ok_rows = [r for r in report.rows if r.status == "ok"]
    for (label, rows), marker in zip(series.items(), ("o-", "s--")):
        rows = [r for r in rows if r.status == "ok"]
        if not rows:
            continue
        xs = [r.replicas for r in rows]
        ax_ips.plot(xs, [r.images_per_sec for r in rows], marker, label=label)
        ax_eff.plot(xs, [r.efficiency for r in rows], marker, label=label)
    xs_all = sorted({r.replicas for r in ok_rows}) or [1]
    ax_eff.plot(xs_all, [1.0] * len(xs_all), ":", color="grey", label="linear (ideal)")
    ax_ips.set(xlabel="replicas", ylabel="training images/s", xticks=xs_all,
               title="Throughput")
    ax_ips.set_ylim(bottom=0)
    ax_eff.set(xlabel="replicas", ylabel="efficiency = ips(n) / (n x ips(1))", xticks=xs_all,
               ylim=(0, max(1.1, *(r.efficiency or 0 for r in ok_rows)) * 1.05),
               title="Scaling efficiency")
    for ax in (ax_ips, ax_eff):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"mirrorkit bench: {cfg.model} on {cfg.dataset}, per-replica batch "
                 f"{cfg.per_replica_batch} ({report.machine.get('cpu_model', '')}, "
                 f"{report.machine.get('cores', '?')} cores, "
                 f"{report.machine.get('device_kind', 'cpu')})", fontsize=9)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)


# --------------------------------------------------------------------------
# Child side: one configuration, in a fresh process.
# --------------------------------------------------------------------------

def step_timer(stop_after: int | None = None, warmup_steps: int = 0) -> Any:
    """A Keras callback that times every training step, from batch begin to batch end.

    That span covers fetching the batch from the input pipeline and the
    distributed step (forward, backward, all-reduce, update), and excludes
    epoch boundaries and validation. Keras runs the TensorFlow step
    synchronously, so the end of the batch is the end of the work. With
    ``steps_per_execution=k`` one call covers ``k`` steps; ``steps`` says so.

    Args:
        stop_after: stop training (``model.stop_training``) once this many
            steps have run after the warm-up. Defaults to None (never).
        warmup_steps: steps of whole calls not counted by ``stop_after``:
            calls are warm-up until they cover this many steps (so with
            ``k`` steps per call, ``ceil(warmup_steps / k)`` calls).

    Returns:
        A ``keras.callbacks.Callback`` with, per call, ``durations``
        (seconds), ``steps`` (training steps covered) and ``epochs``.

    Example:
        >>> timer = step_timer()                              # doctest: +SKIP
        >>> model.fit(ds, epochs=3, callbacks=[timer])         # doctest: +SKIP
        >>> timed = [d for d, e in zip(timer.durations, timer.epochs) if e > 0]  # doctest: +SKIP
    """
    import keras

    class StepTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.durations: list[float] = []
            self.steps: list[int] = []
            self.epochs: list[int] = []
            self._epoch = 0
            self._begin = (0, 0.0)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._epoch = epoch

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._begin = (batch, time.perf_counter())

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            first, start = self._begin
            self.durations.append(time.perf_counter() - start)
            self.steps.append(max(batch - first + 1, 1))
            self.epochs.append(self._epoch)
            if stop_after is not None and _after_warmup(self.steps, warmup_steps) >= stop_after:
                self.model.stop_training = True

    return StepTimer()


def _after_warmup(steps: Sequence[int], warmup_steps: int) -> int:
    # Steps of the calls after those that cover the warm-up.
    done = 0
    for i, count in enumerate(steps):
        if done >= warmup_steps:
            return sum(steps[i:])
        done += count
    return 0


def summarise_steps(durations: Sequence[float], steps: Sequence[int],
                    global_batch: int) -> dict[str, float]:
    """Throughput of timed calls: images/s and the median time of one step.

    Args:
        durations: seconds of each timed call (see :func:`step_timer`).
        steps: training steps each call covered.
        global_batch: images per step over all replicas.

    Returns:
        ``{"steps", "step_time_ms", "images_per_sec"}``.

    Example:
        >>> summarise_steps([0.1, 0.1, 0.2], [1, 1, 1], 32)["images_per_sec"]
        240.0
    """
    total, count = float(sum(durations)), int(sum(steps))
    per_step = sorted(d / s for d, s in zip(durations, steps))
    return {
        "steps": count,
        "step_time_ms": statistics.median(per_step) * 1000.0 if per_step else 0.0,
        "images_per_sec": round(count * global_batch / total, 6) if total > 0 else 0.0,
    }


def _timed(timer: Any, warmup_steps: int, global_batch: int) -> dict[str, float]:
    # Drop whole calls until warmup_steps steps are behind us.
    done, first = 0, 0
    while first < len(timer.steps) and done < warmup_steps:
        done += timer.steps[first]
        first += 1
    return summarise_steps(timer.durations[first:], timer.steps[first:], global_batch)


def _task_index() -> int:
    from mirrorkit.cluster import parse_tf_config

    text = _env.tf_config_text()
    return parse_tf_config(text).task_index if text else 0


def _watchdog(seconds: float) -> None:
    # A configuration must never hang the whole bench (e.g. a peer stuck in a
    # collective): exit hard, so the parent (or the launcher) sees a failure.
    def expire() -> None:
        print(f"RuntimeError: configuration timed out after {seconds:.0f} s",
              file=sys.stderr, flush=True)
        os._exit(124)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def _apply_threads(tf: Any, threads: int | None) -> None:
    # Must be set before TensorFlow's runtime starts, i.e. before the strategy.
    # Only the intra-op pool: collectives and the input pipeline keep their
    # own threads. (Pinning each worker to a core helped a tiny model on a
    # quiet machine but not resnet20, and hurt on a busy one: not done.)
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one configuration in this (fresh) process; return the result dict."""
    _watchdog(float(spec.get("timeout") or 600))
    _env.quiet_tensorflow()
    import tensorflow as tf

    index = _task_index()
    _apply_threads(tf, spec.get("threads"))
    gpus = tf.config.list_physical_devices("GPU")
    if spec["workers"] > 1:
        if gpus:
            tf.config.set_visible_devices([gpus[index % len(gpus)]], "GPU")
        spec["kind"], spec["replicas_in_sync"] = "multi_worker", spec["workers"]
    elif gpus:
        if spec["replicas"] > len(gpus):
            raise ValueError(f"{spec['replicas']} replicas asked but only {len(gpus)} GPUs "
                             "are visible")
        tf.config.set_visible_devices(gpus[:spec["replicas"]], "GPU")
        spec["kind"], spec["replicas_in_sync"] = "mirrored", spec["replicas"]
    else:
        spec["kind"], spec["replicas_in_sync"] = "mirrored", spec["replicas"]
        spec["simulate_cpus"] = spec["replicas"]
    timer, metrics = _train_steps(spec)
    global_batch = int(metrics["global_batch"])
    result = _timed(timer, spec["warmup_steps"], global_batch)
    result.update({
        "strategy": metrics["strategy"], "replicas_in_sync": metrics["replicas"],
        "global_batch": global_batch, "gpus": len(gpus),
        "devices_kind": "gpu" if gpus else "simulated-cpu",
    })
    return result


def _train_steps(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Train the way ``mirrorkit train`` does until warm-up + timed steps have run.

    Returns the timer and ``train``'s metrics.
    """
    from mirrorkit.datasets import DataOptions
    from mirrorkit.training import TrainConfig, train

    total = spec["warmup_steps"] + spec["steps"]
    options = DataOptions()
    if spec["dataset"] == "synthetic":
        # Enough generated images for every step in one epoch, with room for
        # whole calls of up to 16 steps on both sides of the timed span, and
        # a multiple of 16 steps so train picks 16 per call.
        per_epoch = 16 * math.ceil((total + 32) / 16)
        options = DataOptions(
            examples=per_epoch * spec["per_replica_batch"] * spec["replicas_in_sync"])
    # Timed and warm-up steps come in whole tf.function calls (train picks
    # several steps per call), so at least `steps` are timed.
    timer = step_timer(stop_after=spec["steps"], warmup_steps=spec["warmup_steps"])
    with tempfile.TemporaryDirectory(prefix="mirrorkit-bench-") as tmp:
        config = TrainConfig(
            model=spec["model"], dataset=spec["dataset"], data=options,
            # Enough epochs to reach `total` steps however small the dataset;
            # the timer stops training as soon as they have run.
            epochs=10_000, per_replica_batch=spec["per_replica_batch"], seed=spec["seed"],
            strategy=spec["kind"], simulate_cpus=spec.get("simulate_cpus"),
            output=str(Path(tmp) / "run"))
        result = train(config, callbacks=[timer], echo=lambda line: None)
    return timer, result.metrics


def _child_main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or argv[0] != "--child":
        print("usage: python -m mirrorkit.bench --child SPEC_JSON (internal; use `mirrorkit bench`)",
              file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    try:
        result = _child(spec)
    except (ValueError, RuntimeError, ImportError) as err:
        print(f"{type(err).__name__}: {' '.join(str(err).split())}", file=sys.stderr)
        return 1
    print(RESULT_TAG + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
