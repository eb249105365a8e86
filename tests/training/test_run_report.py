"""``mirrorkit report``: a run's summary and plot from its files, without TensorFlow."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import clean_env

from mirrorkit.cli import cli

HISTORY = ("epoch,accuracy,loss,val_accuracy,val_loss\n"
           "0,0.50,1.50,0.70,0.90\n1,0.80,0.60,0.85,0.45\n2,0.90,0.30,0.93,0.25\n")


def _run(path, accuracy, rates, **extra):
    path.mkdir(parents=True)
    metrics = {"model": "cnn", "dataset": "digits", "epochs": 3, "epochs_run": 3,
               "initial_epoch": 0, "optimizer": "adam", "learning_rate": 0.002,
               "precision": "float32", "strategy": "mirrored", "replicas": 2, "workers": 1,
               "per_replica_batch": 32, "global_batch": 64, "accumulate": 1,
               "val_accuracy": accuracy, "val_loss": 0.25, "wall_time_seconds": 12.5,
               "images_per_second": 900.0, "images_per_second_per_replica": 450.0,
               "images_per_second_by_epoch": rates, **extra}
    (path / "metrics.json").write_text(json.dumps(metrics))
    (path / "history.csv").write_text(HISTORY)
    return path


@pytest.mark.fast
def test_two_runs_are_summarised_and_overlaid_in_one_png(tmp_path):
    a = _run(tmp_path / "a", 0.93, [800.0, 900.0, 1000.0],
             targets=[{"target": "val_accuracy>=0.95", "value": 0.93, "met": False}])
    # A resumed run measured its last 2 epochs only.
    b = _run(tmp_path / "b", 0.94, [700.0, 710.0], initial_epoch=1)
    png = tmp_path / "cmp.png"
    result = CliRunner().invoke(cli, ["report", str(a), str(b), "--png", str(png)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "result     val_accuracy 0.9300, val_loss 0.2500 after 3 epoch(s) in 12.5 s" in out
    assert "target     val_accuracy>=0.95: MISSED (measured 0.9300)" in out
    assert "epoch    3  loss 0.3000  accuracy 0.9000  val_loss 0.2500  val_accuracy " \
           "0.9300  1000.0 images/s" in out
    assert "epoch    1  loss 1.5000  accuracy 0.5000  val_loss 0.9000  val_accuracy " \
           "0.7000  - images/s" in out   # b's first epoch ran before the resume
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_report_never_imports_tensorflow(tmp_path):
    run = _run(tmp_path / "a", 0.9, [1.0, 2.0, 3.0])
    code = ("import sys\nfrom mirrorkit.cli import main\n"
            f"try:\n    main(['report', {str(run)!r}])\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\nprint('TF', 'tensorflow' in sys.modules)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=clean_env(optional_packages=True), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "TF False"
    assert (run / "report.png").exists()


@pytest.mark.fast
def test_a_folder_that_is_not_a_run_is_one_line_and_nothing_is_written(tmp_path):
    good = _run(tmp_path / "good", 0.9, [1.0, 2.0, 3.0])
    result = CliRunner().invoke(cli, ["report", str(good), str(tmp_path / "nope")])
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"Error: Not a mirrorkit run: {tmp_path}/nope has no metrics.json (a run directory is "
        f"what `mirrorkit train --output DIR` wrote). Received: '{tmp_path}/nope'"]
    assert not (good / "report.png").exists()


@pytest.mark.fast
def test_incidents_restarts_and_each_workers_speed_are_reported(tmp_path):
    from mirrorkit.training.events import EventLog

    run = _run(tmp_path / "ops", 0.95, [800.0, 900.0, 1000.0], workers=2,
               incidents=[{"rollback": 1, "epoch": 2, "step": 14, "first_step": 14,
                           "cause": "nan", "loss": "nan", "restored_epoch": 1,
                           "learning_rate": 0.001, "lr_factor": 0.5}],
               per_worker=[{"epoch": 1, "step_ms": 40.0, "worker_step_ms": [10.0, 32.0],
                            "stragglers": [[1, 3.2]]},
                           {"epoch": 2, "step_ms": 40.0, "worker_step_ms": [10.0, 12.0],
                            "stragglers": []}])
    log = EventLog(run / "events.jsonl")
    log.write("run_start", config={})
    log.write("restart", attempt=2, reason="worker 1 failed with exit code 1")
    result = CliRunner().invoke(cli, ["report", str(run), "--png", str(tmp_path / "o.png")])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "restart    attempt 2: worker 1 failed with exit code 1" in out
    assert ("rollback   1: nan (loss nan) at epoch 2, step 14; back to epoch 1, learning rate "
            "-> 0.001000") in out
    assert "worker 0   local step 10.0 ms (3,200 images/s on its own share)" in out
    assert ("worker 1   local step 12.0 ms (2,667 images/s on its own share); straggler in "
            "epoch(s) 1") in out
