"""What a finished run directory says: a readable summary and a plot, from its files alone.

Reads ``metrics.json`` (config, result, throughput per epoch, targets,
rollback incidents, per-worker step times), ``history.csv`` (per-epoch loss
and accuracy) and ``events.jsonl`` (restarts by ``mirrorkit launch``) that
``mirrorkit train`` writes; never imports TensorFlow, so ``mirrorkit report`` answers in well
under a second. Several runs can be summarised and overlaid in one PNG
(loss, accuracy and images/s over epochs), drawn with matplotlib.

Example:
    >>> runs = [load_run("runs/a"), load_run("runs/b")]   # doctest: +SKIP
    >>> print(summary(runs[0]))                            # doctest: +SKIP
    >>> write_plot(runs, check_png(runs, "report.png"))     # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from mirrorkit.errors import MissingDependency, UserInputError
from mirrorkit.training import run_files
from mirrorkit.training.events import EVENTS_FILE, read_events

_PIP_HINT = 'pip install "mirrorkit[bench]"'


@dataclasses.dataclass(frozen=True)
class Run:
    """One run directory's content.

    Attributes:
        path: the directory.
        metrics: metrics.json.
        history: history.csv rows (epoch first), numbers as floats.
        events: events.jsonl (:mod:`mirrorkit.training.events`), oldest first.
    """

    path: Path
    metrics: dict[str, Any]
    history: list[dict[str, float]]
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        """The directory's name, how the plot's legend calls the run."""
        return self.path.name


def load_run(path: str | os.PathLike) -> Run:
    """Read a run directory, every field the report uses checked (:mod:`.run_files`).

    Raises:
        UserInputError: one line, when it is not a run or a file holds a bad field
            (naming the file, the field and the value).

    Example:
        >>> load_run("surely/not/a/run")
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: Not a mirrorkit run: surely/not/a/run has no metrics.json ...
    """
    path = Path(path)
    metrics_file = path / "metrics.json"
    if not metrics_file.is_file():
        raise UserInputError(f"Not a mirrorkit run: {path} has no metrics.json (a run directory is "
                             f"what `mirrorkit train --output DIR` wrote). Received: {str(path)!r}")
    # Every field the summary and the plot use is checked here, before anything is printed.
    metrics = run_files.read_metrics(metrics_file)
    history = run_files.read_history(path / "history.csv") \
        if (path / "history.csv").is_file() else []
    run_files.check_rates(metrics, history, path)
    try:
        events = read_events(path / EVENTS_FILE)
    except (ValueError, RecursionError) as err:   # not UTF-8, or absurdly nested JSON
        raise UserInputError(f"{path / EVENTS_FILE} cannot be read as an event log "
                             f"({' '.join(str(err).split())[:200]})") from err
    return Run(path, metrics, history, run_files.check_events(events, str(path / EVENTS_FILE)))


def _fmt(value: Any, digits: int = 4) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) < 1e4 else f"{value:,.0f}"
    return "-" if value is None else str(value)


def summary(run: Run) -> str:
    """A readable account of one run: config, result, targets, throughput per epoch.

    Example:
        >>> print(summary(load_run("runs/a")))                  # doctest: +SKIP
    """
    m = run.metrics
    lines = [
        f"run        {run.path}",
        f"config     {m.get('model')} on {m.get('dataset')}, {m.get('epochs')} epoch(s), "
        f"{m.get('optimizer')} lr {_fmt(m.get('learning_rate'), 6)}, {m.get('precision')}",
        f"strategy   {m.get('strategy')}: {m.get('replicas')} replica(s), "
        f"{m.get('workers')} worker(s); batch {m.get('per_replica_batch')} per replica, "
        f"{m.get('global_batch')} global"
        + (f", {m.get('effective_batch')} effective (x{m['accumulate']} accumulated)"
           if (m.get("accumulate") or 1) > 1 else ""),
        f"result     val_accuracy {_fmt(m.get('val_accuracy'))}, val_loss "
        f"{_fmt(m.get('val_loss'))} after {m.get('epochs_run')} epoch(s) in "
        f"{_fmt(m.get('wall_time_seconds'), 1)} s",
        f"throughput {_fmt(m.get('images_per_second'), 1)} images/s "
        f"({_fmt(m.get('images_per_second_per_replica'), 1)} per replica)",
    ]
    sync = m.get("weights_in_sync")
    if sync and sync.get("workers", 1) > 1:
        lines.append(f"workers    weights {'identical' if sync['identical'] else 'DIFFER'} "
                     f"on {sync['workers']} workers")
    for target in m.get("targets", []):
        lines.append(f"target     {target['target']}: {'met' if target['met'] else 'MISSED'} "
                     f"(measured {_fmt(target['value'])})")
    lines += _incidents(run) + _workers(m)
    rates = m.get("images_per_second_by_epoch") or []
    first = int(m.get("initial_epoch") or 0)
    offset = len(run.history) - len(rates)   # a resumed run measured its last epochs only
    for i, row in enumerate(run.history):
        rate = rates[i - offset] if i >= offset else None
        lines.append(f"epoch {int(row.get('epoch', i + first)) + 1:>4}  "
                     f"loss {_fmt(row.get('loss'))}  accuracy {_fmt(row.get('accuracy'))}  "
                     f"val_loss {_fmt(row.get('val_loss'))}  "
                     f"val_accuracy {_fmt(row.get('val_accuracy'))}  "
                     f"{_fmt(rate, 1)} images/s")
    return "\n".join(lines)


def _incidents(run: Run) -> list[str]:
    lines = [f"restart    attempt {e.get('attempt')}: {e.get('reason')}"
             for e in run.events if e.get("event") == "restart"]
    for i in run.metrics.get("incidents") or []:
        if i.get("kind") == "membership":
            lines.append(f"elastic    {i['replicas_before']} -> {i['replicas']} replicas "
                         f"({i['rule']}): per-replica batch {i['per_replica_batch_before']} -> "
                         f"{i['per_replica_batch']}, global {i['effective_batch_before']} -> "
                         f"{i['effective_batch']}")
            continue
        lines.append(f"rollback   {i['rollback']}: {i['cause']} (loss {_fmt(i['loss'])}) at epoch "
                     f"{i['epoch']}, step {i['step']}; back to epoch {i['restored_epoch']}, "
                     f"learning rate -> {_fmt(i['learning_rate'], 6)}")
    return lines


def _workers(m: dict[str, Any]) -> list[str]:
    epochs = [e for e in m.get("per_worker") or [] if len(e.get("worker_step_ms", [])) > 1]
    if not epochs:
        return []
    last = epochs[-1]["worker_step_ms"]
    share = (m.get("global_batch") or 0) / len(last)
    lines = []
    for w, ms in enumerate(last):
        slow = [str(e["epoch"]) for e in epochs if any(s[0] == w for s in e["stragglers"])]
        lines.append(f"worker {w:<3} local step {ms:.1f} ms ({share / ms * 1000:,.0f} images/s "
                     f"on its own share)" + (f"; straggler in epoch(s) {', '.join(slow)}"
                                              if slow else ""))
    return lines


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise MissingDependency(f"The report's PNG needs matplotlib, which is not installed: "
                                f"{_PIP_HINT}") from err
    return plt


def check_png(runs: list[Run], png: str | os.PathLike | None) -> Path | None:
    """Where the PNG goes, checked before anything is printed.

    ``png`` if given (its folder must exist), else ``RUN_DIR/report.png``
    for one run, ``report.png`` in the current folder for several. An
    unwritable default is no error: :func:`write_plot` then draws elsewhere.
    Nor is a missing matplotlib without ``png``: None, and the report is the
    text alone (a base install has no matplotlib).

    Raises:
        UserInputError: ``png`` is a folder, or its folder does not exist.
        MissingDependency: ``png`` was asked for and matplotlib is not installed.

    Example:
        >>> check_png([load_run("runs/a")], None)             # doctest: +SKIP
        PosixPath('runs/a/report.png')
    """
    if png is None:
        try:
            _pyplot()
        except MissingDependency:
            return None
        return runs[0].path / "report.png" if len(runs) == 1 else Path("report.png")
    _pyplot()
    png = Path(png)
    if png.is_dir():
        raise UserInputError(f"--png must name a file, not a folder. Received: --png={str(png)!r}")
    if not png.parent.is_dir():
        raise UserInputError(f"--png's folder {str(png.parent)!r} does not exist; create it or "
                             f"pick another path. Received: --png={str(png)!r}")
    return png


def write_plot(runs: list[Run], target: Path | None) -> tuple[Path | None, str]:
    """Draw the PNG at ``target``, else in a new temporary folder, else nowhere.

    A None ``target`` (from :func:`check_png`: no matplotlib) draws nothing.

    A run folder on a read-only disk (or one that is not the reader's) still
    gets its report: the plot goes to a temporary folder and the line says
    where and why. Whatever was at ``target`` stays as it was unless the new
    PNG is complete (written beside it, then renamed over it).

    Returns:
        The PNG's path (None when none could be written) and one line saying so.

    Example:
        >>> write_plot([load_run("runs/a")], Path("runs/a/report.png"))   # doctest: +SKIP
        (PosixPath('runs/a/report.png'), 'wrote runs/a/report.png')
    """
    import tempfile

    if target is None:
        return None, f"skipped the plot: matplotlib is not installed ({_PIP_HINT})"
    try:
        return plot(runs, target), f"wrote {target}"
    except OSError as err:
        why = f"{target.parent} is not writable ({err.strerror or err})"
    try:
        elsewhere = plot(runs, Path(tempfile.mkdtemp(prefix="mirrorkit-report-")) / target.name)
    except OSError as err:
        return None, f"skipped the plot: {why}, nor is the temporary folder ({err.strerror})"
    return elsewhere, f"wrote {elsewhere} instead: {why}"


def plot(runs: list[Run], path: str | os.PathLike) -> Path:
    """Loss, accuracy and images/s over epochs, one line per run, into a PNG.

    The PNG is written beside ``path`` and renamed onto it, so a failed
    write leaves whatever was there.

    Raises:
        MissingDependency: matplotlib missing (the text summary does not need it).
        OSError: ``path`` cannot be written.

    Example:
        >>> plot([load_run("runs/a"), load_run("runs/b")], "report.png")   # doctest: +SKIP
    """
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 3, figsize=(14, 4), constrained_layout=True)
    for run in runs:
        first = run.metrics.get("initial_epoch") or 0
        epochs = [int(r.get("epoch", i + first)) + 1 for i, r in enumerate(run.history)]
        for ax, keys in zip(axes[:2], (("loss", "val_loss"), ("accuracy", "val_accuracy"))):
            for key, style in zip(keys, ("-", "--")):
                values = [r.get(key, math.nan) for r in run.history]   # NA rows: a gap
                if any(key in r for r in run.history):
                    ax.plot(epochs, values, style, marker="o", label=f"{run.name} {key}")
        rates = run.metrics.get("images_per_second_by_epoch") or []
        # Without history.csv, the rates were the epochs after initial_epoch.
        at = (epochs[len(epochs) - len(rates):] if run.history else
              [first + i + 1 for i in range(len(rates))])
        axes[2].plot(at, rates, "-", marker="o", label=run.name)
    for ax, title, ylabel in zip(axes, ("Loss", "Accuracy", "Throughput"),
                                 ("loss", "accuracy", "training images/s")):
        ax.set(title=title, xlabel="epoch", ylabel=ylabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize="small")
    path = Path(path)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        fig.savefig(partial, dpi=100, format="png")
        os.replace(partial, path)
    finally:
        plt.close(fig)
        partial.unlink(missing_ok=True)
    return path
