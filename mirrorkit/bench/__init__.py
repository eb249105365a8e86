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

:mod:`mirrorkit.bench.input_only` (``mirrorkit bench --input-only``) times
the training input pipeline alone against the decode floor of the same files.

Example:
    >>> from mirrorkit.bench import BenchConfig, run_bench, write_report
    >>> config = BenchConfig(model="cnn", dataset="digits", replicas=(1, 2), steps=10)
    >>> report = run_bench(config)                    # doctest: +SKIP
    >>> print(report.table())                         # doctest: +SKIP
    >>> write_report(report, "bench-out")             # doctest: +SKIP
"""

from mirrorkit.bench.child import step_timer, summarise_steps
from mirrorkit.bench.config import FIELDS, BenchConfig, BenchReport, BenchRow, Case, parse_counts
from mirrorkit.bench.input_only import InputBenchConfig, run_input_bench
from mirrorkit.bench.output import plot_report, write_report
from mirrorkit.bench.runs import child_command, machine_info, parse_result, run_bench

__all__ = [
    "FIELDS",
    "BenchConfig",
    "BenchReport",
    "BenchRow",
    "Case",
    "InputBenchConfig",
    "child_command",
    "machine_info",
    "parse_counts",
    "parse_result",
    "plot_report",
    "run_bench",
    "run_input_bench",
    "step_timer",
    "summarise_steps",
    "write_report",
]
