"""Rollback on divergence: a real diverging run recovers, on 1 replica, 2 replicas and 2 workers.

The divergence is real training, not a flag: ``tests/fixtures/diverging_train.py``
either makes Adam take one enormous step (learning rate x 10,000 for one step:
the loss spikes) or sets the output layer to NaN, once, at a known step. The
run must roll back to the end of epoch 1, lower the learning rate, finish all
3 epochs once each and reach the accuracy of a run that never diverged
(> 0.9 on the digits; ~0.95 without incident).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
from conftest import REPO, clean_env, result_line

from mirrorkit.training import TrainConfig, train
from mirrorkit.training.events import read_events

SCRIPT = REPO / "tests" / "fixtures" / "diverging_train.py"


def _epochs_in_history(out):
    with open(out / "history.csv") as f:
        return [r["epoch"] for r in csv.DictReader(f)]


def _check_recovered(out, result, cause):
    (incident,) = result["incidents"]
    # NaN weights before step 3 show in step 3's loss; the huge learning rate
    # is used by step 3's update, so step 4's loss is the first to spike.
    step = 3 if cause == "nan" else 4
    assert incident["cause"] == cause and incident["epoch"] == 2 and incident["step"] == step
    assert incident["restored_epoch"] == 1 and incident["lr_factor"] == 0.5
    assert result["val_accuracy"] > 0.9 and result["epochs_run"] == 3
    assert _epochs_in_history(out) == ["0", "1", "2"]  # every epoch once
    # A straggler event says a worker was slow in an epoch (a loaded machine
    # under the parallel suite); it is timing, not part of the rollback.
    events = [e for e in read_events(out / "events.jsonl") if e["event"] != "straggler"]
    kinds = [e["event"] for e in events]
    assert kinds == ["run_start", "epoch_end", "rollback", "epoch_end", "epoch_end", "run_end"]
    assert events[2]["cause"] == cause and events[-1]["rollbacks"] == 1
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["incidents"] == result["incidents"]


def test_a_loss_spike_rolls_back_and_the_run_reaches_its_accuracy(tmp_path):
    out = tmp_path / "spike"
    lines: list[str] = []
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), "lr",
                           json.dumps({"spike_factor": 10.0})],
                          env=clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_line(proc.stdout)
    _check_recovered(out, result, "spike")
    (incident,) = result["incidents"]
    assert incident["learning_rate"] == pytest.approx(0.001)  # 0.002 x 0.5, not the exploded one
    lines = proc.stdout.splitlines()
    assert any(line.startswith("rollback 1 of 2: the loss spiked to") and
               "back to the end of epoch 1, learning rate x0.5 -> 0.001" in line for line in lines)


def test_nan_on_two_replicas_rolls_back_every_replica(tmp_path):
    out = tmp_path / "nan2"
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), "nan"],
                          env=clean_env(MIRRORKIT_SIMULATE_CPUS="2"),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = result_line(proc.stdout)
    assert result["replicas"] == 2
    _check_recovered(out, result, "nan")


def test_two_workers_take_the_same_decision_at_the_same_step(tmp_path):
    out = tmp_path / "nan-workers"
    proc = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--max-restarts", "0", "--",
         "python", str(SCRIPT), str(out), "nan"],
        env=clean_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in proc.stdout.splitlines()
               if "RESULT " in line]
    assert len(results) == 2
    for result in results:  # both workers: the same incident, weights identical at the end
        assert result["incidents"] == results[0]["incidents"] and result["in_sync"]
    _check_recovered(out, results[0], "nan")
    # The worker that is not the chief says so too, at the same step.
    assert any(line.startswith("[1]") and "rollback 1 of 2: the loss became nan at epoch 2, "
               "step 3" in line for line in proc.stderr.splitlines()), proc.stderr[-3000:]


@pytest.mark.fast
def test_a_divergence_that_keeps_coming_back_stops_after_the_last_rollback(tmp_path):
    import keras
    import numpy as np

    class PoisonEveryTime(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            if self.epoch == 1 and batch == 1:
                kernel = self.model.get_layer("predictions").kernel
                kernel.assign(np.full(kernel.shape, np.nan, dtype="float32"))

    out = tmp_path / "again"
    lines: list[str] = []
    with pytest.raises(RuntimeError) as info:
        train(TrainConfig(epochs=2, output=str(out), steps_per_execution=1, max_rollbacks=1,
                          rollback_lr_factor=0.25),
              callbacks=[PoisonEveryTime()], echo=lines.append)
    text = str(info.value)
    assert "the loss became nan at epoch 2, step 2 after 1 rollback(s) (--max-rollbacks 1)" in text
    assert f"the backup of epoch 1 in {out / 'backup'} is kept" in text
    assert any("rollback 1 of 1: the loss became nan at epoch 2, step 2; back to the end of "
               "epoch 1, learning rate x0.25 -> 0.0005" in line for line in lines)
    events = read_events(out / "events.jsonl")
    assert [e["event"] for e in events][-2:] == ["rollback", "run_end"]
    assert events[-1]["status"] == "failed" and "after 1 rollback(s)" in events[-1]["error"]
    assert not (out / "metrics.json").exists()


@pytest.mark.fast
@pytest.mark.parametrize("flag, value, fragment", [
    ("--max-rollbacks", "-1", "`max_rollbacks` must be an integer >= 0. Received: max_rollbacks=-1"),
    ("--rollback-lr-factor", "-0.5", "`rollback_lr_factor` must be above 0 and at most 1. "
                                     "Received: rollback_lr_factor=-0.5"),
    ("--spike-factor", "0.5", "`spike_factor` must be a number above 1. Received: spike_factor=0.5"),
])
def test_bad_rollback_settings_are_one_line(tmp_path, flag, value, fragment):
    from click.testing import CliRunner

    from mirrorkit.cli import cli

    out = tmp_path / "kept"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    result = CliRunner().invoke(cli, ["train", "--output", str(out), flag, value])
    assert result.exit_code == 1 and fragment in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert (out / "metrics.json").read_text() == "{}"
