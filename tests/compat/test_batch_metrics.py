"""``batch-wide-metrics``: a metric the script wrote logs plain Python's numbers on N replicas.

keras.io's ``CategoricalTruePositives`` (its "Training & evaluation with the
built-in methods" guide) counts over every pair of its batch; each replica
counting its own slice logs about 1/N of it. With the fix, fit's history and
evaluate equal one device's at 2 and 3 replicas (an uneven last batch
included), for that metric, a weighted copy with sample weights and a metric
function returning one value for its batch; Keras's own accuracy and the
loss are equal either way. The control turns the fix off by name.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, clean_env, result_line

SCRIPT = REPO / "tests" / "fixtures" / "batch_metrics.py"


def _result(tmp_path, *replicas: int, **env: str) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, replicas)], cwd=str(tmp_path),
                          env=clean_env(**env), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return result_line(proc.stdout)


def _logs(run: dict) -> dict[str, float]:
    logs = {f"fit/{k}/{i}": v for k, values in run["fit"].items() for i, v in enumerate(values)}
    return {**logs, **{f"evaluate/{k}": v for k, v in run["evaluate"].items()}}


@pytest.mark.slow
def test_a_metric_the_script_wrote_logs_one_devices_numbers(tmp_path):
    result = _result(tmp_path, 2, 3)
    assert result["applied"] == "applied"
    one = _logs(result["runs"]["1"])
    assert {"fit/categorical_true_positives/1", "fit/weighted_ctp/1", "fit/batch_spread/1",
            "evaluate/categorical_true_positives"} <= set(one)
    for n in ("2", "3"):
        logs = _logs(result["runs"][n])
        assert logs.keys() == one.keys()
        for key, value in one.items():
            assert logs[key] == pytest.approx(value, rel=1e-5), (n, key, logs[key], value)


@pytest.mark.slow
def test_without_the_fix_each_replica_counts_only_its_own_slices_pairs(tmp_path):
    result = _result(tmp_path, 2, MIRRORKIT_COMPAT_DISABLE="batch-wide-metrics")
    assert result["applied"] == "disabled"
    one, two = _logs(result["runs"]["1"]), _logs(result["runs"]["2"])
    # Keras's own metric and the loss are per-example sums: exact upstream ...
    for key in ("fit/loss/1", "fit/accuracy/1", "evaluate/accuracy"):
        assert two[key] == pytest.approx(one[key], rel=1e-5)
    # ... the pair count loses the pairs across the two halves: about half.
    for key in ("fit/categorical_true_positives/1", "fit/weighted_ctp/1",
                "evaluate/categorical_true_positives"):
        assert 0.4 < two[key] / one[key] < 0.6, (key, two[key], one[key])
