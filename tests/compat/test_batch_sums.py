"""``batch-sum-losses``: an ``add_loss`` value that sums over the batch trains as on one device.

keras.io's ``ActivityRegularizationLayer`` adds ``ops.sum(inputs) * 0.1``
and its OCR example's ``CTCLayer`` one CTC loss per example, which Keras
sums; Keras divides both by N like every add_loss value, so each replica's
own slice's sum trains at 1/N. With the fix, fit's losses, evaluate and the
weights equal one device's at 2 and 3 replicas (uneven slices included), on
arrays and on a dataset with static batch sizes; the values that were exact
already (a mean, Keras's activity regularizer, a Keras Loss called inside a
layer) stay exact, and a maximum over the batch, which no weighting makes
exact, is named in one line. The control turns the fix off by name.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, clean_env, result_line

SCRIPT = REPO / "tests" / "fixtures" / "batch_sums.py"
EXACT = ("sum", "per_example", "ctc", "mean", "keras_loss", "regularizer", "static_sum",
         "static_keras_loss", "static_regularizer")


def _result(tmp_path, *replicas: int, **env: str) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, replicas)], cwd=str(tmp_path),
                          env=clean_env(**env), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return result_line(proc.stdout), proc.stderr


def _numbers(run: dict) -> list[float]:
    return [*run["loss"], run["evaluate"], *run["kernels"]]


def _same(a: dict, b: dict, rel: float = 1e-5) -> bool:
    return all(x == pytest.approx(y, rel=rel) for x, y in zip(_numbers(a), _numbers(b)))


@pytest.mark.slow
def test_an_add_loss_summing_over_the_batch_trains_like_one_device(tmp_path):
    result, stderr = _result(tmp_path, 2, 3)
    assert result["applied"] == "applied"
    runs = result["runs"]
    for n in (2, 3):
        for case in EXACT:
            assert _same(runs[f"{case}-{n}"], runs[f"{case}-1"]), (case, n, runs)
        assert not _same(runs[f"max-{n}"], runs["max-1"], 1e-3)
        assert (f"mirrorkit: layer 'max_loss_{n - 1}' adds a loss that depends on its whole "
                f"batch in a way the replicas cannot split") in stderr, stderr[-2000:]
    # Only the maximum is named: the sums and means were read as such.
    assert stderr.count("mirrorkit: layer ") == 2, stderr[-2000:]


@pytest.mark.slow
def test_without_the_fix_a_sum_over_the_batch_trains_at_1_over_n(tmp_path):
    result, _ = _result(tmp_path, 2, MIRRORKIT_COMPAT_DISABLE="batch-sum-losses")
    assert result["applied"] == "disabled"
    runs = result["runs"]
    for case in ("mean", "keras_loss", "regularizer", "static_regularizer"):
        assert _same(runs[f"{case}-2"], runs[f"{case}-1"]), case   # exact upstream
    for case in ("sum", "per_example", "ctc", "static_sum"):
        one, two = runs[f"{case}-1"], runs[f"{case}-2"]
        assert not _same(two, one, 1e-3), case
        # The first epoch's loss is dominated by the term: well below one device's.
        assert two["loss"][0] < 0.8 * one["loss"][0], (case, two["loss"], one["loss"])
