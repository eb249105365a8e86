"""Run every configuration of a benchmark, each in a fresh process (or worker group).

Example:
    >>> from mirrorkit.bench import BenchConfig, run_bench
    >>> report = run_bench(BenchConfig(replicas=(1, 2), steps=10))   # doctest: +SKIP
"""

from __future__ import annotations

import datetime
import io
import json
import logging
import os
import platform
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from mirrorkit import _env
from mirrorkit.bench.config import RESULT_TAG, BenchConfig, BenchReport, BenchRow, Case
from mirrorkit.errors import RunError

logger = logging.getLogger(__name__)


def machine_info() -> dict[str, Any]:
    """Facts about this host that a reader needs to judge the figures (no TensorFlow import).

    Example:
        >>> sorted(machine_info())[:3]
        ['cores', 'cpu_model', 'date']
    """
    from mirrorkit.distribute.report import versions

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
        raise RunError(f"timed out after {config.timeout:.0f} s") from err
    result = parse_result(proc.stdout)
    if proc.returncode != 0 or result is None:
        raise RunError(f"exited with {proc.returncode}: {_reason(proc.stderr) or 'no output'}")
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
        raise RunError(f"{cause.describe() if cause else result.summary()}"
                       f"{': ' + detail if detail else ''}")
    chief = "\n".join(line[4:] for line in out.getvalue().splitlines() if line.startswith("[0] "))
    parsed = parse_result(chief)
    if parsed is None:
        raise RunError(f"worker 0 printed no result: {_reason(err.getvalue())}")
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
