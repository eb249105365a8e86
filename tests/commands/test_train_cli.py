"""``mirrorkit train`` / ``mirrorkit export`` as a user runs them.

Fresh processes for the default run, the 2-replica run and the real 2-worker
run (devices and collectives are configured once per process); ``CliRunner``
in this process for every bad input and for each dataset source end to end.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import REPO, clean_env
from PIL import Image

from mirrorkit.cli import cli


@pytest.fixture(scope="module", autouse=True)
def _forget_strategy():
    yield
    from mirrorkit.distribute import strategy

    strategy._reset()


def mirrorkit_cmd(*args: str, cwd: Path, timeout: float = 300,
                  umask: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mirrorkit", *args], cwd=str(cwd),
                          env=clean_env(), capture_output=True, text=True, timeout=timeout,
                          preexec_fn=None if umask is None else lambda: os.umask(umask))


def python_snippet(code: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=str(cwd),
                          env=clean_env(), capture_output=True, text=True, timeout=timeout)


def invoke(*args: str):
    return CliRunner().invoke(cli, ["train", *args])


def one_error_line(result) -> str:
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    assert "Traceback" not in result.output
    return lines[0]


# -- the default job -----------------------------------------------------------

def test_default_train_reaches_95_percent_and_model_reloads_in_plain_keras(tmp_path):
    # umask 000 asks for world-writable files; mirrorkit still writes none.
    proc = mirrorkit_cmd("train", "--epochs", "6", "--target", "val_accuracy>=0.95",
                         "--target", "wall_time_seconds < 3600", cwd=tmp_path, umask=0)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for expected in ("dataset   digits: 1,438 train / 359 val images, 8x8x1, 10 classes",
                     "model     cnn: 151,306 parameters",
                     "batch     32 per replica x 1 = 32 global; 44 steps per epoch (11 per call), 6 epochs",
                     "epoch 6/6: ", "Epoch 6/6"):
        assert expected in out, expected
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and runs[0].name.endswith("-cnn-digits")
    metrics = json.loads((runs[0] / "metrics.json").read_text())
    assert metrics["val_accuracy"] >= 0.95
    assert [(t["target"], t["met"]) for t in metrics["targets"]] == [
        ("val_accuracy>=0.95", True), ("wall_time_seconds<3600", True)]
    # Targets can name every number metrics.json holds, and nothing else.
    from mirrorkit.training.targets import METRICS

    numbers = {k for k, v in metrics.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    # (spike_factor is None unless --spike-factor is given)
    assert numbers <= set(METRICS) and set(METRICS) - numbers <= {
        "images_per_second_per_replica", "spike_factor"}
    writable = [p for p in [tmp_path / "runs", *(tmp_path / "runs").rglob("*")]
                if p.stat().st_mode & stat.S_IWOTH]
    assert not writable, writable
    assert out.strip().splitlines()[-1].startswith(f"val_accuracy={metrics['val_accuracy']:.4f}")

    # A fresh interpreter, Keras alone: no mirrorkit import before load_model.
    check = python_snippet(f"""
        import json, keras
        model = keras.models.load_model({str(runs[0] / 'model.keras')!r})
        from mirrorkit.datasets import load
        x, y = load("digits").val
        print(json.dumps(model.evaluate(x, y, return_dict=True, verbose=0)))
    """, cwd=tmp_path)
    assert check.returncode == 0, check.stderr[-3000:]
    scores = json.loads(check.stdout.strip().splitlines()[-1])
    assert scores["accuracy"] == pytest.approx(metrics["val_accuracy"], abs=1e-6)


def test_two_simulated_replicas_scale_batch_and_lr_and_reject_what_breaks(tmp_path):
    code = """
        import json
        from click.testing import CliRunner
        from mirrorkit.cli import cli
        runner, out = CliRunner(), {}
        for name, args in [
            ("odd", ["--global-batch", "33", "--output", "odd"]),
            ("spe", ["--steps-per-execution", "none", "--output", "spe"]),
            ("run", ["--epochs", "8", "--output", "run"]),
            ("acc", ["--per-replica-batch", "32", "--global-batch", "256", "--epochs", "2",
                     "--warmup-epochs", "1", "--output", "acc"]),
            ("acc_uneven", ["--per-replica-batch", "32", "--global-batch", "200",
                            "--output", "acc_uneven"]),
            ("acc_disagree", ["--per-replica-batch", "32", "--global-batch", "256",
                              "--accumulate", "2", "--output", "acc_disagree"]),
        ]:
            r = runner.invoke(cli, ["train", "--simulate-cpus", "2", *args])
            out[name] = [r.exit_code, r.output]
        print("RESULT" + json.dumps(out))
    """
    proc = python_snippet(code, cwd=tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT", 1)[1])
    code_, text = result["odd"]
    assert code_ == 1 and text.strip() == (
        "Error: `global_batch` must be divisible by the number of replicas (2). "
        "Received: global_batch=33")
    code_, text = result["spe"]
    assert code_ == 2 and ("Invalid value for '--steps-per-execution': expected a positive "
                           "integer or 'auto'. Received: 'none'") in text
    assert not (tmp_path / "odd").exists() and not (tmp_path / "spe").exists()

    code_, text = result["run"]
    assert code_ == 0, text[-3000:]
    assert "strategy  mirrored, 2 replicas (simulate_cpus=2 on a CPU-only machine)" in text
    # Several steps per call under 2 replicas: keras#19246 fixed (compat multi-step).
    assert "batch     32 per replica x 2 = 64 global; 22 steps per epoch (11 per call)" in text
    assert "val       per epoch on 352 of 359 images (whole batches of 32)" in text
    assert "-> 0.004 (linear scaling to global batch 64)" in text
    assert "per replica, 2 replicas)" in text
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert (metrics["replicas"], metrics["global_batch"]) == (2, 64)
    assert metrics["strategy"] == "mirrored"
    assert metrics["learning_rate"] == pytest.approx(0.004)
    assert metrics["val_accuracy"] >= 0.95

    # Gradient accumulation: 256 = 32 per replica x 2 replicas x K=4 micro-batches.
    code_, text = result["acc"]
    assert code_ == 0, text[-3000:]
    assert ("batch     32 per replica x 2 x 4 = 256 effective global (4 accumulated "
            "micro-batches of 64 per optimizer step); 20 steps per epoch") in text
    assert "-> 0.016 (linear scaling to effective batch 256), warmup 1 epochs (5 steps)" in text
    metrics = json.loads((tmp_path / "acc" / "metrics.json").read_text())
    assert (metrics["accumulate"], metrics["effective_batch"], metrics["global_batch"]) == (
        4, 256, 64)
    assert (metrics["steps_per_epoch"], metrics["optimizer_steps_per_epoch"]) == (20, 5)
    assert metrics["learning_rate"] == pytest.approx(0.016)
    assert metrics["images_per_second"] > 0
    code_, text = result["acc_uneven"]
    assert code_ == 1 and text.strip().startswith(
        "Error: --global-batch 200 is not --per-replica-batch 32 x 2 replicas x a whole "
        "number K of accumulated micro-batches; use a multiple of 64: 192 or 256.")
    code_, text = result["acc_disagree"]
    assert code_ == 1 and text.strip().startswith(
        "Error: --accumulate 2 disagrees with --global-batch 256 = 32 per replica x 2 "
        "replicas x 4")
    assert not (tmp_path / "acc_uneven").exists() and not (tmp_path / "acc_disagree").exists()


# -- bad input: one line, exit 1, nothing lost -------------------------------------

@pytest.fixture(scope="module")
def bad_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("folders")
    rng = np.random.default_rng(0)

    def png(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(path)

    (root / "empty" / "a").mkdir(parents=True)
    png(root / "single" / "only" / "1.png")
    for name in ("a", "b"):
        for i in range(3):
            png(root / "corrupt" / name / f"{i}.png")
    (root / "corrupt" / "b" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    (root / "a-file").write_text("x")
    return root


@pytest.mark.fast
@pytest.mark.parametrize("args, expected", [
    (["--model", "resnet21"],
     "Unknown model. Did you mean resnet20 or resnet152? Valid: cnn, resnet20, resnet56"),
    (["--dataset", "imagenet"], "Unknown dataset. Valid: digits, synthetic, tfds:NAME"),
    (["--epochs", "0"], "Received: epochs=0"),
    (["--per-replica-batch", "0"], "Received: per_replica_batch=0"),
    (["--global-batch", "-8"], "Received: global_batch=-8"),
    (["--accumulate", "0"], "Received: accumulate=0"),
    (["--image-size", "big"], "Received: image_size='big'"),
    (["--resume"], "pass --output DIR"),
    (["--model", "resnet50"], "needs images of at least 32x32; the dataset gives 8x8"),
    (["--dataset", "folder:{root}/missing"], "Image folder not found"),
    (["--dataset", "folder:{root}/empty"], "No images found in"),
    (["--dataset", "folder:{root}/single"], "single class ('only')"),
    (["--dataset", "folder:{root}/corrupt"], "Cannot decode image file {root}/corrupt/b/bad.png"),
    (["--dataset", "tfds:mnistt", "--data-dir", "{root}"], "Did you mean: tfds:mnist"),
    (["--dataset", "tfds:mnist", "--data-dir", "{root}"],
     "Prepare it with `tfds build mnist --data_dir {root}`, or pass --download"),
    (["--output", "{root}/a-file/run"], "{root}/a-file is a file"),
    (["--output", "{root}/never-ran", "--resume"], "Nothing to resume: no backup in"),
    (["--output", "{root}/never-ran", "--target", "val_accuracy=0.9"],
     "A target must read METRIC>=NUMBER (operators >=, <=, >, <), e.g. 'val_accuracy>=0.95'. "
     "Received: target='val_accuracy=0.9'"),
    (["--output", "{root}/never-ran", "--target", "val_acc>=0.9"],
     "Unknown metric 'val_acc' in target 'val_acc>=0.9'; targets can name any number in "
     "metrics.json: val_accuracy, val_loss"),
    (["--output", "{root}/never-ran", "--target", "val_loss<nan"],
     "The threshold of target 'val_loss<nan' must be a finite number. Received: 'nan'"),
])
def test_bad_input_is_one_clear_line(bad_folders, args, expected):
    root = str(bad_folders)
    result = invoke(*[a.replace("{root}", root) for a in args])
    assert expected.replace("{root}", root) in one_error_line(result)
    assert not (bad_folders / "never-ran").exists()


def test_a_misspelt_compat_name_is_one_line_on_the_default_strategy_too(tmp_path):
    # One replica, no simulated CPUs: the default strategy, where no fix applies.
    proc = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "train", "--epochs", "1",
         "--output", str(tmp_path / "run")], cwd=str(tmp_path),
        env=clean_env(MIRRORKIT_COMPAT_DISABLE="malloc-threshold"),
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert ("Error: Unknown compat fix in MIRRORKIT_COMPAT_DISABLE. Received: malloc-threshold; "
            "accepted: all,") in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


# -- every source end to end, and export -----------------------------------------

@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Tiny real data on disk for folder:, tfds: and files:."""
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from mirrorkit.datasets import load

    root = tmp_path_factory.mktemp("sources")
    x, y = load("digits").train
    pixels = np.round(x * 255).astype("uint8")
    for i in range(120):
        folder = root / "folder" / f"class{y[i] % 3}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(pixels[i, ..., 0]).save(folder / f"{i}.png")
    features = tfds.features.FeaturesDict({
        "image": tfds.features.Image(shape=(8, 8, 1)),
        "label": tfds.features.ClassLabel(num_classes=10)})
    tfds.dataset_builders.store_as_tfds_dataset(
        name="cli_digits", version="1.0.0", features=features, data_dir=str(root / "tfds"),
        split_datasets={s: tf.data.Dataset.from_tensor_slices(
            {"image": pixels[lo:hi], "label": y[lo:hi].astype("int64")})
            for s, lo, hi in (("train", 0, 160), ("test", 160, 200))})
    exported = CliRunner().invoke(cli, ["export", "--dataset", f"folder:{root / 'folder'}",
                                        "--output", str(root / "shards"), "--shards", "2"])
    assert exported.exit_code == 0, exported.output
    assert "wrote 2 train shards (96 examples) and 2 val shards (24 examples)" in exported.output
    return root


@pytest.mark.fast
@pytest.mark.parametrize("source, args, train_examples", [
    ("synthetic",
     ["--image-size", "8", "--channels", "1", "--classes", "4", "--examples", "96"], 96),
    ("folder:{root}/folder", [], 96),
    # The crop recipe: crops decoded in the pipeline, the flip a model layer.
    ("folder:{root}/folder", ["--augment", "crop", "--image-size", "8"], 96),
    ("tfds:cli_digits", ["--data-dir", "{root}/tfds"], 160),
    ("files:{root}/shards", [], 96),
])
def test_each_source_trains_end_to_end(sources, tmp_path, source, args, train_examples):
    root = str(sources)
    result = invoke("--dataset", source.replace("{root}", root), "--epochs", "1",
                    "--per-replica-batch", "16", "--output", str(tmp_path / "run"),
                    *[a.replace("{root}", root) for a in args])
    assert result.exit_code == 0, result.output[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["dataset"] == source.replace("{root}", root)
    assert metrics["train_examples"] == train_examples
    assert 0.0 <= metrics["val_accuracy"] <= 1.0 and metrics["epochs_run"] == 1
    assert (tmp_path / "run" / "model.keras").exists()
    if "crop" in args:
        import keras

        assert "random-resized-crop (flip in the model)" in result.output
        assert "cnn: " in result.output and ", flip augmentation layers," in result.output
        model = keras.models.load_model(tmp_path / "run" / "model.keras")
        assert [type(layer).__name__ for layer in model.get_layer("augmentation").layers] == [
            "RandomFlip"]


@pytest.mark.fast
def test_export_refuses_a_directory_with_shards(sources):
    before = sorted(p.name for p in (sources / "shards").iterdir())
    result = CliRunner().invoke(cli, ["export", "--output", str(sources / "shards")])
    assert "already holds TFRecord shards" in one_error_line(result)
    assert sorted(p.name for p in (sources / "shards").iterdir()) == before


@pytest.mark.slow
def test_two_real_workers_read_their_own_shards_and_the_chief_writes_once(sources, tmp_path):
    """mirrorkit launch -n 2 -- mirrorkit train --dataset files:...: a real 2-process cluster."""
    out = tmp_path / "mw"
    proc = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--max-restarts", "1", "--",
         sys.executable, "-m", "mirrorkit", "train", "--dataset", f"files:{sources / 'shards'}",
         "--epochs", "2", "--per-replica-batch", "16", "--output", str(out),
         "--target", "epochs_run>=2", "--target", "val_accuracy>1"],
        cwd=str(tmp_path), env=clean_env(), capture_output=True, text=True, timeout=400)
    # A missed target under launch: the job's exit code 3, and no restart.
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    assert "restarting" not in text
    assert [ln for ln in proc.stderr.splitlines() if "target missed" in ln] == [
        f"[0] target missed: val_accuracy>1 (measured "
        f"{json.loads((out / 'metrics.json').read_text())['val_accuracy']:.6g})"]
    assert "target(s) missed, exit code 3" in proc.stderr
    assert "[0] strategy  multi_worker, 2 replicas, 2 workers" in text
    assert "[1] dataset" not in text and "[1] val_accuracy" not in text  # the chief reports
    assert "ran out of data" not in text
    written = ["model.keras", "metrics.json", "history.csv", "events.jsonl"]
    if (out / "logs").exists():
        written.append("logs")
    assert sorted(p.name for p in out.iterdir()) == sorted(written)
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["strategy"], metrics["workers"], metrics["replicas"]) == ("multi_worker", 2, 2)
    assert metrics["global_batch"] == 32 and metrics["epochs_run"] == 2
    assert metrics["weights_in_sync"] == {"workers": 2, "identical": True,
                                          "differing_workers": []}
    assert len((out / "history.csv").read_text().strip().splitlines()) == 3
    assert [(t["target"], t["met"]) for t in metrics["targets"]] == [
        ("epochs_run>=2", True), ("val_accuracy>1", False)]


# -- apps ------------------------------------------------------------------------

def test_workstation_app_runs_the_default_job_through_the_library(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "apps" / "workstation.py"), "--epochs", "1",
                           "--output", str(tmp_path / "ws")], cwd=str(tmp_path), env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "model     cnn: 151,306 parameters" in proc.stdout
    assert f"model in {tmp_path / 'ws' / 'model.keras'}" in proc.stdout.strip().splitlines()[-1]
    assert json.loads((tmp_path / "ws" / "metrics.json").read_text())["epochs_run"] == 1


@pytest.mark.slow
def test_seed_scenario_resnet20_on_8_simulated_devices(tmp_path):
    """32 images per replica, 256 global, 8 replicas; ~70 s, mostly tracing the 8-replica step."""
    proc = subprocess.run([sys.executable, str(REPO / "apps" / "seed_resnet_8dev.py"),
                           "--output", str(tmp_path / "seed"), "--epochs", "1"],
                          cwd=str(tmp_path), env=clean_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "strategy  mirrored, 8 replicas (simulate_cpus=8 on a CPU-only machine)" in proc.stdout
    assert ("seed scenario: 8 replicas x 32 = 256 global, lr 0.0125 -> 0.1"
            in proc.stdout.strip().splitlines()[-1])
    metrics = json.loads((tmp_path / "seed" / "metrics.json").read_text())
    assert (metrics["model"], metrics["replicas"], metrics["global_batch"]) == ("resnet20", 8, 256)
