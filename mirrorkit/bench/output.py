"""A benchmark report written as ``bench.json``, ``bench.csv`` and a ``bench.png`` plot.

Example:
    >>> from mirrorkit.bench import write_report
    >>> paths = write_report(report, "bench-out")    # doctest: +SKIP
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from mirrorkit.bench.config import _PIP_HINT, FIELDS, BenchReport
from mirrorkit.errors import MissingDependency


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
        raise MissingDependency(
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
