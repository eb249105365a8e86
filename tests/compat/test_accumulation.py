"""``gradient-accumulation``: ``gradient_accumulation_steps`` under a strategy (keras#20582).

N replicas x K micro-batches of b end with the weights of one device trained
on batches of N*K*b (max |dw| <= 1e-5 after 3 optimizer steps, SGD with
momentum and Adam), for (N, K) = (1, 4), (2, 2), (4, 2) and 2 workers x K=2,
also with ``steps_per_execution=2`` and under mixed precision (loss scaling).
A control that steps on every micro-batch must differ; with the fix off the
upstream error shows; a run that crashes with an accumulation open across an
epoch end resumes from ``BackupAndRestore`` to the uninterrupted weights.
The script is ``tests/fixtures/scripts/accumulation.py``; one process runs
(1, 4), (2, 2) and mixed precision (its CPU split in 2), another (4, 2).
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO, clean_env, result_line
from workers import run_workers

from mirrorkit import compat

SCRIPT = REPO / "tests" / "fixtures" / "scripts" / "accumulation.py"
TOLERANCE = 1e-5
FIX = compat.FIXES["gradient-accumulation"]


# The local runs, two processes: SIMULATE_CPUS and the runs of each (mixed
# precision last: its policy is global to the process).
LOCAL_RUNS = [("2", "1x4,2x2,2x2m"), ("4", "4x2")]


def _run(cpus_and_runs: tuple[str, str], tmp_path) -> list[dict]:
    proc = subprocess.run([sys.executable, str(SCRIPT), "mirrored", *cpus_and_runs],
                          cwd=str(tmp_path), env=clean_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return result_line(proc.stdout)


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory):
    """{(replicas, k, mixed): result} of every mirrored run (both processes at once)."""
    tmp = tmp_path_factory.mktemp("accumulation")
    with ThreadPoolExecutor(max_workers=2) as pool:
        outs = list(pool.map(lambda job: _run(job, tmp), LOCAL_RUNS))
    runs = {(out["replicas"], out["k"], out["mixed"]): out for out in sum(outs, [])}
    assert sorted(runs) == [(1, 4, False), (2, 2, False), (2, 2, True), (4, 2, False)], runs
    return runs


def _assert_equivalent(out: dict, replicas: int, tolerance: float = TOLERANCE) -> None:
    assert out["replicas"] == replicas and out["status"] == "applied"
    for name in ("sgd", "adam"):
        assert out[name]["iterations"] == out[name]["reference_iterations"] == 3, out
        assert out[name]["max_diff"] <= tolerance, (name, out)


@pytest.mark.parametrize("replicas, k", [(1, 4), (2, 2), (4, 2)])
def test_replicas_times_micro_batches_match_one_device_on_the_whole_batch(local_runs, replicas, k):
    out = local_runs[replicas, k, False]
    _assert_equivalent(out, replicas)
    assert out["adam_steps_per_execution_2"] <= TOLERANCE, out
    # The control (an optimizer step on every micro-batch) must fail the same check.
    assert out["control_max_diff"] > 100 * TOLERANCE, out
    assert out["resume_iterations"][0] == out["resume_iterations"][1]
    assert out["resume_max_diff"] <= TOLERANCE, out
    if replicas > 1:
        assert FIX.error in out["upstream_error"], out["upstream_error"]


def test_mixed_precision_loss_scaling_accumulates_like_one_device(local_runs):
    # float16 sums over a different split of the batch: rounding, not a bug.
    _assert_equivalent(local_runs[2, 2, True], 2, tolerance=1e-4)


@pytest.mark.slow
def test_two_workers_times_two_micro_batches_match_one_device(tmp_path):
    results, report = run_workers(SCRIPT, 2, args=["", "0", "2x2"], timeout=240, cwd=tmp_path)
    assert all(r.returncode == 0 for r in results), report
    for result in results:
        (out,) = json.loads(result.stdout.split("RESULT ", 1)[1])
        _assert_equivalent(out, 2)
        assert out["control_max_diff"] > 100 * TOLERANCE
        assert FIX.error in out["upstream_error"]
        assert out["resume_max_diff"] <= TOLERANCE, report
