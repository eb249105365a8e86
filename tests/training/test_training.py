"""training.train on the embedded digits in this process (default strategy, 1 replica).

Multi-replica and multi-worker runs are in tests/commands/test_train_cli.py (fresh
processes: the device split is per process).
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import run_snippet

from mirrorkit.datasets import DataOptions
from mirrorkit.training import DEFAULT_LR, TrainConfig, train


@pytest.fixture(scope="module", autouse=True)
def _forget_strategy():
    yield
    from mirrorkit.distribute import strategy

    strategy._reset()  # later modules may pick their own strategy


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished 3-epoch run: (result, printed lines, output dir)."""
    out = tmp_path_factory.mktemp("runs") / "digits"
    lines: list[str] = []
    result = train(TrainConfig(epochs=3, output=str(out)), echo=lines.append)
    return result, lines, out


@pytest.mark.fast
@pytest.mark.parametrize("kwargs, received", [
    ({"epochs": 0}, "epochs=0"),
    ({"per_replica_batch": 0}, "per_replica_batch=0"),
    ({"global_batch": -64}, "global_batch=-64"),
    ({"accumulate": 0}, "accumulate=0"),
    ({"accumulate": 2.5}, "accumulate=2.5"),
    ({"optimizer": "rmsprop"}, "optimizer='rmsprop'"),
    ({"precision": "float16"}, "precision='float16'"),
    ({"lr": 0.0}, "lr=0.0"),
    ({"lr": math.nan}, "lr=nan"),
    ({"warmup_epochs": -1}, "warmup_epochs=-1"),
    ({"steps_per_execution": 0}, "steps_per_execution=0"),
    ({"model": "resnet99"}, "model='resnet99'"),
    ({"dataset": "imagenet"}, "dataset='imagenet'"),
    ({"resume": True}, "output=None"),
])
def test_bad_config_is_a_value_error_naming_the_value(kwargs, received):
    with pytest.raises(ValueError, match="Received: " + received.replace("(", "\\(")):
        TrainConfig(**kwargs)


@pytest.mark.fast
def test_automatic_steps_per_execution_divides_the_epoch():
    from mirrorkit.training import auto_steps_per_execution

    assert [auto_steps_per_execution(n) for n in (1, 7, 16, 22, 32, 44, 390, 17)] == [
        1, 7, 16, 11, 16, 11, 15, 1]
    assert auto_steps_per_execution(64, cap=4) == 4


@pytest.mark.fast
@pytest.mark.parametrize("val_examples, replicas, spe, want", [
    (359, 1, 1, (32, 11)),      # the natural plan: global batch, whole batches
    (359, 1, 11, (32, 11)),     # 11 steps are already one call of 11
    (359, 2, 11, (32, 11)),     # 5 natural steps -> one call of 11 smaller batches: 352 of 359
    (359, 2, 1, (64, 5)),
    (40, 2, 1, (40, 1)),        # smaller than one global batch: one smaller batch
    (30, 2, 16, None),          # 16 steps x 2 replicas need 32 examples
])
def test_validation_plan_runs_whole_calls_of_whole_batches(val_examples, replicas, spe, want):
    from mirrorkit.data import resolve_batch
    from mirrorkit.training.plan import _validation_plan

    batch = resolve_batch(per_replica_batch=32, replicas=replicas)
    if want is None:
        with pytest.raises(ValueError, match="30 validation examples, too few for 16 validation"):
            _validation_plan(batch, val_examples, spe, "d")
        return
    val_batch, steps = _validation_plan(batch, val_examples, spe, "d")
    assert (val_batch.global_batch, steps) == want
    assert steps % spe == 0 and val_batch.global_batch * steps <= val_examples


@pytest.mark.fast
def test_run_reports_and_writes_everything(finished):
    result, lines, out = finished
    text = "\n".join(lines)
    assert "dataset   digits: 1,438 train / 359 val images, 8x8x1, 10 classes" in text
    assert "model     cnn: 151,306 parameters" in text
    assert "strategy  default, 1 replica (" in text
    assert "batch     32 per replica x 1 = 32 global; 44 steps per epoch (11 per call), 3 epochs" in text
    assert f"lr        adam {DEFAULT_LR['adam']:g} for batch 32 -> {DEFAULT_LR['adam']:g}" in text
    assert sum(line.startswith("epoch ") and "images/s" in line for line in lines) == 3
    assert lines[-1].startswith(f"val_accuracy={result.val_accuracy:.4f}")
    assert str(out) in lines[-1]
    assert result.val_accuracy > 0.9 and result.epochs_run == 3

    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("val_accuracy", "val_loss", "epochs", "replicas", "per_replica_batch",
                "global_batch", "learning_rate", "images_per_second", "strategy", "dataset",
                "model"):
        assert key in metrics, key
    batch = (metrics["replicas"], metrics["per_replica_batch"], metrics["global_batch"])
    assert batch == (1, 32, 32)
    assert metrics["val_accuracy"] == result.val_accuracy and metrics["images_per_second"] > 0
    with open(out / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2]
    assert all(float(r["images_per_second"]) > 0 and "val_accuracy" in r for r in rows)
    if importlib.util.find_spec("tensorboard") is not None:
        assert any((out / "logs").rglob("events.out.tfevents.*"))
    else:
        assert any("no TensorBoard logs" in line for line in lines)
    assert not (out / "backup").exists()  # removed once training finished


@pytest.mark.fast
def test_model_keras_reloads_and_scores_the_reported_accuracy(finished):
    import keras

    from mirrorkit import datasets

    result, _, out = finished
    model = keras.models.load_model(out / "model.keras")
    x, y = datasets.load("digits").val
    scores = model.evaluate(x, y, batch_size=97, return_dict=True, verbose=0)
    assert scores["accuracy"] == pytest.approx(result.val_accuracy, abs=1e-6)
    assert scores["loss"] == pytest.approx(result.val_loss, rel=1e-5)


@pytest.mark.fast
def test_an_existing_run_is_refused_and_left_untouched(finished):
    _, _, out = finished
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in out.iterdir()}
    with pytest.raises(ValueError, match="already holds a run .*pass --resume"):
        train(TrainConfig(epochs=1, output=str(out)))
    with pytest.raises(FileNotFoundError, match="Nothing to resume.*that run finished"):
        train(TrainConfig(epochs=1, output=str(out), resume=True))
    assert {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in out.iterdir()} == before


@pytest.mark.fast
def test_output_that_cannot_be_a_directory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("keep me")
    with pytest.raises(NotADirectoryError, match="is a file"):
        train(TrainConfig(epochs=1, output=str(blocker / "run")))
    with pytest.raises(NotADirectoryError, match="is a file, not a directory"):
        train(TrainConfig(epochs=1, output=str(blocker)))
    assert blocker.read_text() == "keep me"


@pytest.mark.fast
def test_resume_without_a_backup(tmp_path):
    with pytest.raises(FileNotFoundError, match="Nothing to resume: no backup in"):
        train(TrainConfig(epochs=1, output=str(tmp_path / "never-ran"), resume=True))


@pytest.mark.fast
def test_too_few_examples_for_one_global_batch(tmp_path):
    with pytest.raises(ValueError, match="fewer than one effective batch"):
        train(TrainConfig(dataset="synthetic", data=DataOptions(examples=20, image_size=8),
                          epochs=1, output=str(tmp_path / "r")))
    assert not (tmp_path / "r").exists()  # nothing created for a run that never started


def _poison_at(epoch: int, step: int):
    """A callback that sets the output layer's weights to NaN before one step."""
    import keras

    class Poison(keras.callbacks.Callback):
        def on_epoch_begin(self, e, logs=None):
            self.epoch = e

        def on_train_batch_begin(self, batch, logs=None):
            if self.epoch == epoch - 1 and batch == step - 1:
                kernel = self.model.get_layer("predictions").kernel
                kernel.assign(np.full(kernel.shape, np.nan, dtype="float32"))

    return Poison()


@pytest.mark.fast
def test_nan_loss_stops_at_the_step_keeps_the_good_backup_and_resume_continues(tmp_path):
    from mirrorkit.training.models import build_model

    out = tmp_path / "nan"
    # One step per call, so a callback can poison exactly step 3; no rollback:
    # this is the stop (tests/training/test_rollback.py has the rollbacks).
    config = TrainConfig(epochs=3, output=str(out), steps_per_execution=1, max_rollbacks=0)
    with pytest.raises(RuntimeError) as info:
        train(config, callbacks=[_poison_at(epoch=2, step=3)])
    text = str(info.value)
    assert "the loss became nan at epoch 2, step 3" in text
    assert f"the backup of epoch 1 in {out / 'backup'} is kept" in text
    assert not (out / "metrics.json").exists() and not (out / "model.keras").exists()
    with open(out / "history.csv") as f:
        assert [r["epoch"] for r in csv.DictReader(f)] == ["0"]

    # The backup holds the finite weights of epoch 1, not the poisoned ones.
    weights = out / "backup" / "latest.weights.h5"
    assert weights.exists()
    probe = build_model("cnn", input_shape=(8, 8, 1), num_classes=10)
    probe.load_weights(weights)
    assert all(np.isfinite(w).all() for w in probe.get_weights())

    lines: list[str] = []
    result = train(TrainConfig(epochs=3, output=str(out), resume=True), echo=lines.append)
    assert result.epochs_run == 2 and result.metrics["initial_epoch"] == 1
    assert any("resuming from its backup" in line for line in lines)
    assert result.val_accuracy > 0.9
    with open(out / "history.csv") as f:
        assert [r["epoch"] for r in csv.DictReader(f)] == ["0", "1", "2"]
    assert (out / "model.keras").exists() and not (out / "backup").exists()


@pytest.mark.fast
def test_an_interrupt_after_the_last_epoch_keeps_the_backup_until_the_model_is_saved(tmp_path):
    # Ctrl-C lands after fit's last epoch, before the final evaluation and
    # save: the epoch backup must still be there to resume from.
    import keras

    class InterruptAtTrainEnd(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            raise KeyboardInterrupt

    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(epochs=1, output=str(out)), callbacks=[InterruptAtTrainEnd()])
    assert (out / "backup" / "latest.weights.h5").exists()
    assert not (out / "model.keras").exists()


@pytest.mark.fast
def test_a_relaunched_group_resumes_without_being_told(tmp_path):
    # `mirrorkit launch` restarts the same command line (no --resume) with
    # MIRRORKIT_RESTART_COUNT >= 1 and one MIRRORKIT_RUN_ID for the whole job.
    from mirrorkit import _env

    with _env.patch({_env.RUN_ID: "job42", _env.RESTART_COUNT: None}), _cwd(tmp_path):
        # Automatic steps per call (11 of 44 steps): the loss turns bad in the
        # first call of epoch 2, and the error names the call's steps.
        with pytest.raises(RuntimeError, match="loss became nan at epoch 2, in steps 1-11"):
            train(TrainConfig(epochs=3, max_rollbacks=0), callbacks=[_poison_at(epoch=2, step=1)])
        out = tmp_path / "runs" / "job42-cnn-digits"
        assert (out / "backup").is_dir()
        with _env.patch({_env.RESTART_COUNT: "1"}):
            result = train(TrainConfig(epochs=3))
        assert Path(result.output_dir).resolve() == out.resolve()
    assert result.epochs_run == 2 and result.metrics["initial_epoch"] == 1


@pytest.mark.fast
def test_a_relaunch_before_any_backup_starts_over_in_the_same_folder(tmp_path):
    from mirrorkit import _env

    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="no epoch had finished"):
        train(TrainConfig(epochs=2, output=str(out), max_rollbacks=0),
              callbacks=[_poison_at(epoch=1, step=12)])  # 2nd call
    assert (out / "history.csv").exists() and not (out / "backup").exists()
    with _env.patch({_env.RESTART_COUNT: "1"}):
        result = train(TrainConfig(epochs=1, output=str(out)))
    assert result.epochs_run == 1 and (out / "model.keras").exists()


@contextlib.contextmanager
def _cwd(path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)



ACCUMULATED_WARMUP = """
import json
from conftest import run_snippet

from mirrorkit.datasets import DataOptions
from mirrorkit.training import TrainConfig, train
result = train(TrainConfig(
    model="resnet20", dataset="synthetic", optimizer="momentum", warmup_epochs=1,
    data=DataOptions(image_size=16, channels=3, classes=10, examples=512), epochs=2,
    steps_per_execution=1, strategy="mirrored", per_replica_batch=32, output="run", {extra}))
print("RESULT " + json.dumps({{"loss": result.model.history.history["loss"],
                              "lr": result.metrics["learning_rate"],
                              "effective_batch": result.metrics["effective_batch"]}}))
"""


@pytest.mark.slow
def test_accumulated_micro_batches_train_like_the_replicas_they_stand_for(tmp_path):
    # 4 replicas of 32 against 2 replicas x 2 micro-batches of 32: ResNet-20
    # (BatchNormalization on the same 32 images either way) with warmup gets
    # the same learning rate at every optimizer step, so the same losses.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    four, _ = run_snippet(ACCUMULATED_WARMUP.format(extra="simulate_cpus=4"), tmp_path / "a")
    two, _ = run_snippet(ACCUMULATED_WARMUP.format(extra="simulate_cpus=2, accumulate=2"),
                         tmp_path / "b")
    assert four["effective_batch"] == two["effective_batch"] == 128
    assert four["lr"] == two["lr"]
    # Summation order differs (4 replicas vs 2 x 2 micro-batches): float noise only.
    assert two["loss"] == pytest.approx(four["loss"], abs=5e-4)
