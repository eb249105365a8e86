"""``mirrorkit train`` resuming on fewer replicas in an elastic job keeps its batch as asked.

The first attempt trains on 2 replicas (a fresh process, CPU split in two)
and is cut in epoch 2, leaving the backup of epoch 1; the next attempt, as
``mirrorkit launch --min-workers`` starts it after a loss (restart count 1,
``MIRRORKIT_ELASTIC_BATCH``), runs on 1 replica.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import clean_env

from mirrorkit import _env
from mirrorkit.training import TrainConfig, train
from mirrorkit.training.elastic import adapt
from mirrorkit.training.events import read_events

FIRST_ATTEMPT = """
import os, sys, keras
from mirrorkit.training import TrainConfig, train

class Cut(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        if epoch == 1:
            os._exit(9)   # the machine is gone: no clean-up, the backup of epoch 1 stays

train(TrainConfig(epochs=3, output=sys.argv[1]), callbacks=[Cut()])
"""


@pytest.mark.parametrize("rule, per_replica, lr", [("global", 64, 0.004),
                                                   ("per-replica", 32, 0.002)])
def test_a_resume_on_fewer_replicas_keeps_the_batch_as_asked(tmp_path, rule, per_replica, lr):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-c", FIRST_ATTEMPT, str(out)],
                          env=clean_env(MIRRORKIT_SIMULATE_CPUS="2"), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 9 and (out / "backup").is_dir(), proc.stderr[-2000:]
    lines: list[str] = []
    with _env.patch({_env.RESTART_COUNT: "1", _env.ELASTIC_BATCH: rule,
                     _env.RESTART_REASON: "worker 1 lost; continuing with 1 of 2 workers"}):
        result = train(TrainConfig(epochs=3, output=str(out)), echo=lines.append)
    (change,) = [i for i in result.metrics["incidents"] if i["kind"] == "membership"]
    assert (change["replicas_before"], change["replicas"]) == (2, 1)
    assert result.metrics["per_replica_batch"] == per_replica
    assert result.metrics["learning_rate"] == pytest.approx(lr)
    # The optimizer runs at the new plan's rate, not the one the backup held.
    assert float(result.model.optimizer.learning_rate.numpy()) == pytest.approx(lr)
    assert result.epochs_run == 2 and result.metrics["initial_epoch"] == 1
    assert result.val_accuracy > 0.9
    assert any(line.startswith("elastic: 2 -> 1 replicas") for line in lines)
    events = read_events(out / "events.jsonl")
    kinds = [e["event"] for e in events]
    assert kinds[:2] == ["run_start", "epoch_end"]
    assert kinds[2:5] == ["run_start", "restart", "membership"] and kinds[-1] == "run_end"
    assert events[3]["reason"] == "worker 1 lost; continuing with 1 of 2 workers"


@pytest.mark.fast
def test_a_global_batch_that_does_not_divide_names_what_would():
    before = {"replicas": 3, "workers": 3, "per_replica_batch": 10, "accumulate": 1,
              "learning_rate": 0.01}
    with pytest.raises(ValueError, match=r"Cannot keep the global batch 30 on 4 replicas "
                                         r"\(7.50 per replica\): use --elastic-batch "
                                         r"per-replica, or start with a global batch "
                                         r"that divides by 4 x 1: use a multiple of 4: "
                                         r"28 or 32"):
        adapt(TrainConfig(), before, replicas=4, rule="global")
    config, change = adapt(TrainConfig(), before, replicas=4, rule="per-replica")
    assert config.per_replica_batch == 10 and change["effective_batch"] == 40
    assert adapt(TrainConfig(), before, replicas=3, rule="global") == (TrainConfig(), None)
    assert json.dumps(change)  # recorded as it is in metrics.json
