"""``scalar-losses``: a loss that reduces itself gives the one-device loss and update.

A loss function or ``Loss.call`` returning one value for the batch (a mean, a
sum divided by the batch size) must log and train as it does on one device,
under ``fit``, ``evaluate``, ``train_on_batch`` and ``test_on_batch``, at 2, 3
and 4 replicas; with the fix off by name, upstream reports N times the loss
and moves the weights N times as far. One process runs the one-device
reference and 2, 3 and 4 replicas (a strategy each over the first N of its 4
logical CPUs); each control is a fresh process, as the fixes are chosen at start.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, clean_env, result_line

SCRIPT = REPO / "tests" / "fixtures" / "scalar_loss_replicas.py"

SCALAR = ("mean_fn", "sum_fn", "subclass", "overridden")
KEYS = ("evaluate", "fit_loss", "test_on_batch", "train_on_batch")


def _result(tmp_path, *replicas: int, losses: tuple[str, ...] = (), **env: str) -> dict:
    """One process: each loss (or the ``losses`` named) on one device and at each count."""
    command = [sys.executable, str(SCRIPT), *map(str, replicas)]
    if losses:
        command.append("--losses=" + ",".join(losses))
    proc = subprocess.run(command, cwd=str(tmp_path), env=clean_env(**env),
                          capture_output=True, text=True, timeout=200 * (1 + len(replicas)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return result_line(proc.stdout)


def _runs(tmp_path, *replicas: int, **kwargs) -> tuple[str, dict]:
    result = _result(tmp_path, *replicas, **kwargs)
    return result["applied"], result["runs"]


@pytest.fixture(scope="module")
def fixed_runs(tmp_path_factory) -> tuple[str, dict]:
    # The one-device reference is the same for every replica count: computed once.
    return _runs(tmp_path_factory.mktemp("scalar_losses"), 2, 3, 4)


def _close(a: dict, b: dict, tol: float) -> bool:
    return all(abs(a[k] - b[k]) <= tol * max(1.0, abs(b[k])) for k in KEYS) and all(
        abs(x - y) <= tol for key in ("kernel", "kernel2") for x, y in zip(a[key], b[key]))


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3, 4])
def test_a_loss_returning_a_scalar_trains_like_a_per_example_loss(fixed_runs, n):
    applied, runs = fixed_runs
    assert applied == "applied"
    for loss in SCALAR:
        # Exactly what Keras gives its own per-example loss at N replicas ...
        assert _close(runs[f"{loss}-{n}"], runs[f"mse-{n}"], 1e-5), (loss, runs)
        # ... and on one device (64 examples: 32/32 and 16 x 4 split evenly;
        # 22/21/21 on 3 replicas is exact through uneven-batch-losses).
        assert _close(runs[f"{loss}-{n}"], runs[f"{loss}-1"], 1e-5)
        assert runs[f"{loss}-{n}"]["evaluate"] == pytest.approx(runs[f"{loss}-1"]["evaluate"],
                                                                rel=1e-5)
    # A loss over every pair of the batch runs on the gathered global batch:
    # one device's loss and update, the 22/21/21 split included.
    assert _close(runs[f"batchwide-{n}"], runs["batchwide-1"], 1e-5), runs
    # A __call__ returning per-example values: the gradient of their sum (as on
    # one device), logged once, not N times. train_on_batch keeps Keras's whole
    # batch on every replica when 64 rows do not divide by 3 (test_on_batch.py),
    # which sums N copies of such a loss's gradient: only its kernel is skipped.
    per, one = runs[f"per_example-{n}"], runs["per_example-1"]
    kernels = ("kernel", "kernel2") if n != 3 else ("kernel",)
    assert all(per[k] == pytest.approx(one[k], rel=1e-5) for k in KEYS), (per, one)
    assert all(per[k] == pytest.approx(one[k], rel=1e-5) for k in kernels), (per, one)


@pytest.mark.slow
def test_without_the_fix_upstream_reports_and_trains_at_n_times(tmp_path):
    # no-gradient-losses alone already gives evaluate the one-device value.
    # Only the losses asserted on below (the others' runs cost as much again).
    applied, runs = _runs(tmp_path, 2, losses=("mean_fn", "mse"),
                          MIRRORKIT_COMPAT_DISABLE="scalar-losses,no-gradient-losses")
    assert applied == "disabled"
    one, two, mse = runs["mean_fn-1"], runs["mean_fn-2"], runs["mse-2"]
    assert _close(mse, runs["mse-1"], 1e-5)          # a per-example loss is exact upstream
    assert two["evaluate"] == pytest.approx(2 * one["evaluate"], rel=1e-5)
    # One SGD step from the same start moves the kernel twice as far: the
    # weights after fit differ from one device's, where mse's do not.
    assert not _close(two, one, 1e-3)


@pytest.mark.slow
def test_without_overridden_loss_call_a_loss_overriding_call_trains_at_n_times(tmp_path):
    # keras.io's supervised contrastive loss overrides Loss.__call__: the scaling
    # scalar-losses adds inside Loss.__call__ never runs for it.
    # Only the losses asserted on below.
    result = _result(tmp_path, 2, losses=("overridden", "subclass", "batchwide", "per_example"),
                     MIRRORKIT_COMPAT_DISABLE="overridden-loss-call")
    assert (result["applied"], result["overridden_applied"]) == ("applied", "disabled")
    runs = result["runs"]
    one, two = runs["overridden-1"], runs["overridden-2"]
    assert _close(runs["subclass-2"], runs["subclass-1"], 1e-5)   # call() is still exact
    assert two["fit_loss"] == pytest.approx(2 * one["fit_loss"], rel=1e-4)
    assert not _close(two, one, 1e-3)
    # Scored per replica, the pairs across the two halves are missing.
    assert not _close(runs["batchwide-2"], runs["batchwide-1"], 1e-3)
    # Per-example values: the weights are right upstream, the logged loss is N times.
    per, one = runs["per_example-2"], runs["per_example-1"]
    assert per["kernel2"] == pytest.approx(one["kernel2"], rel=1e-5)
    assert per["fit_loss"] == pytest.approx(2 * one["fit_loss"], rel=1e-5)


CONTRASTIVE = REPO / "tests" / "fixtures" / "scripts" / "contrastive_loss.py"


def _contrastive(command: list[str], tmp_path, tag: str = "CONTRASTIVE", code: int = 0,
                 **env: str) -> tuple[list[dict], str]:
    proc = subprocess.run(command, cwd=str(tmp_path), env=clean_env(**env),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-3000:]
    return [json.loads(line.split(f"{tag} ", 1)[1]) for line in proc.stdout.splitlines()
            if f"{tag} " in line], proc.stdout + proc.stderr


LAUNCH = [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--", "mirrorkit", "run",
          str(CONTRASTIVE)]


@pytest.mark.slow
def test_an_unmodified_script_on_two_launched_workers_matches_plain_python(tmp_path):
    # keras.io's contrastive loss (ops.mean inside the loss function), SGD, and its
    # supervised contrastive loss (a Loss overriding __call__ that scores every pair
    # of the batch and squeezes the labels), Adam: the same losses and weights as
    # `python script.py`, on each worker.
    plain, plain_out = _contrastive([sys.executable, str(CONTRASTIVE)], tmp_path)
    workers, out = _contrastive(LAUNCH, tmp_path)
    assert len(plain) == 1 and len(workers) == 2
    for worker in workers:
        assert worker["loss"] == pytest.approx(plain[0]["loss"], abs=1e-5)
        assert worker["evaluate"] == pytest.approx(plain[0]["evaluate"], abs=1e-5)
        assert worker["weights"] == pytest.approx(plain[0]["weights"], abs=1e-4)
    (supcon,) = [json.loads(line.split("SUPCON ", 1)[1]) for line in plain_out.splitlines()
                 if line.startswith("SUPCON ")]
    launched = [json.loads(line.split("SUPCON ", 1)[1]) for line in out.splitlines()
                if "] SUPCON " in line]
    assert len(launched) == 2
    for worker in launched:
        assert worker["loss"] == pytest.approx(supcon["loss"], rel=1e-6)
        assert worker["weights"] == pytest.approx(supcon["weights"], rel=1e-6)


@pytest.mark.slow
def test_without_static_batch_shapes_the_supervised_contrastive_loss_fails_on_each_worker(
        tmp_path):
    # Across workers TensorFlow makes every batch dimension None: ops.squeeze of
    # the labels then has no rank, and the loss's expand_dims raises.
    _, out = _contrastive(LAUNCH, tmp_path, code=1,
                          MIRRORKIT_COMPAT_DISABLE="static-batch-shapes")
    assert out.count("Cannot take the length of shape with unknown rank") >= 2, out[-3000:]
