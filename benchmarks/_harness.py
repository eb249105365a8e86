"""What the sections of ``run.py`` share: fresh processes, alternated arms, medians, accuracy."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

HERE = Path(__file__).resolve().parent
PY = sys.executable
RESULT = "RESULT "
# Two arms' final validation accuracies must agree within this for a speed
# ratio between them to count (issue 18); otherwise the table says so.
ACCURACY_TOLERANCE = 0.01


def env() -> dict[str, str]:
    """The parent's environment without mirrorkit's variables and TF_CONFIG."""
    out = {k: v for k, v in os.environ.items()
           if not k.startswith("MIRRORKIT_") and k != "TF_CONFIG"}
    out["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return out


def load() -> float:
    return round(os.getloadavg()[0], 2)


def parse_result(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT):
            return json.loads(line[len(RESULT):])
    return None


def run_command(cmd: Sequence[Any], timeout: float = 1800) -> dict[str, Any]:
    """Run one command in a fresh process; return its ``RESULT {json}`` line, parsed."""
    proc = subprocess.run(list(map(str, cmd)), capture_output=True, text=True, env=env(),
                          timeout=timeout)
    result = parse_result(proc.stdout)
    if result is None:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return result


def run_script(args: Sequence[Any], timeout: float = 1800) -> dict[str, Any]:
    """Run one benchmark script with this interpreter; return its RESULT json."""
    return run_command([PY, *args], timeout=timeout)


def alternate(runs: int, arms: dict[str, Callable[[], Any]],
              log: Callable[[str], None]) -> dict[str, list[Any]]:
    """Run every arm ``runs`` times: ABC, CBA, ABC, ... (cancels drift in load)."""
    out: dict[str, list[Any]] = {name: [] for name in arms}
    names = list(arms)
    for i in range(runs):
        for name in (names if i % 2 == 0 else names[::-1]):
            before = load()
            value = arms[name]()
            if isinstance(value, dict):
                value.setdefault("load_average_1min", before)
            out[name].append(value)
            log(f"    run {i + 1} {name}: {_brief(value)} (load {before})")
    return out


def _brief(value: Any) -> str:
    if not isinstance(value, dict):
        return str(value)
    units = {"images_per_sec": "img/s", "median_step_ms": "ms/step", "step_time_ms": "ms/step",
             "val_accuracy": "val_acc"}
    return ", ".join(f"{value[k]} {u}" for k, u in units.items() if value.get(k) is not None)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def paired(b: Sequence[dict[str, Any]], a: Sequence[dict[str, Any]],
           key: str = "images_per_sec") -> float:
    """Median over rounds of b/a (each round ran a and b back to back)."""
    return round(median([x[key] / y[key] for x, y in zip(b, a)]), 3)


def spread(values: Sequence[float]) -> list[float]:
    """``[min, max]``: how far single runs of one arm strayed."""
    return [round(min(values), 3), round(max(values), 3)]


def arm(results: Sequence[dict[str, Any]], key: str = "images_per_sec") -> dict[str, Any]:
    """One arm's record: every run's figure, median, spread, accuracy and loss."""
    values = [r[key] for r in results]
    out: dict[str, Any] = {key: values, f"median_{key}": round(median(values), 3),
                           "spread": spread(values), "load": [r.get("load_average_1min")
                                                              for r in results]}
    for metric in ("val_accuracy", "val_loss"):
        got = [r[metric] for r in results if r.get(metric) is not None]
        if got:
            out[metric] = got
            out[f"median_{metric}"] = round(median(got), 4)
    out["details"] = results[-1]
    return out


def accuracy_check(b: dict[str, Any], a: dict[str, Any]) -> dict[str, Any]:
    """Whether two arms (as :func:`arm` returns) reached the same accuracy within the tolerance."""
    acc_b, acc_a = b.get("median_val_accuracy"), a.get("median_val_accuracy")
    if acc_b is None or acc_a is None:
        return {"accuracy_agrees": None, "accuracy_note": "accuracy not recorded"}
    agrees = abs(acc_b - acc_a) <= ACCURACY_TOLERANCE
    return {"accuracy_agrees": agrees,
            "accuracy_note": "" if agrees else f"accuracy differs: {acc_b:.3f} vs {acc_a:.3f}"}


def ratio(got: dict[str, list[dict[str, Any]]], arms: dict[str, dict[str, Any]], b: str, a: str,
          key: str = "images_per_sec") -> dict[str, Any]:
    """``b / a``: ratio of medians, paired ratio, and whether their accuracies agree."""
    value = arms[b][f"median_{key}"] / arms[a][f"median_{key}"]
    return {"ratio": round(value, 3), "paired_ratio": paired(got[b], got[a], key),
            **accuracy_check(arms[b], arms[a])}


def shown(r: dict[str, Any]) -> str:
    """A ratio for a table: bold when the accuracies agree, flagged when they do not."""
    text = f"{r['ratio']} ({r['paired_ratio']})"
    if r.get("accuracy_agrees") is False:
        return f"{text}, not counted: {r['accuracy_note']}"
    return f"**{r['ratio']}** ({r['paired_ratio']})"
