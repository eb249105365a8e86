"""Realistic third-party scripts, unmodified, through the real ``mirrorkit run`` CLI.

Each script in ``tests/fixtures/scripts/`` is written the way keras.io or the
TensorFlow tutorials write it -- no mirrorkit, sometimes its own
``tf.distribute`` strategy -- and trains offline on scikit-learn's digits. Each
runs in a fresh process as a user would run it (``python -m mirrorkit run
--simulate-cpus 2 script.py``; the multi-worker tutorial under ``mirrorkit
launch -n 2 -- mirrorkit run``), at most three processes at a time so a
benchmark sharing the CPU is not starved. Each must train on 2 replicas and
reach a sensible result. (A script's own traceback / exit code: test_run.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO, clean_env

SCRIPTS = REPO / "tests" / "fixtures" / "scripts"
RUN = [sys.executable, "-m", "mirrorkit", "run", "--simulate-cpus", "2"]
COMMANDS = {
    # The slowest first, so the pool's tail is short.
    "multi_worker": [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--",
                     "mirrorkit", "run", str(SCRIPTS / "tf_multi_worker_tutorial.py")],
    "mnist_convnet": [*RUN, str(SCRIPTS / "mnist_convnet.py")],
    "functional_bn": [*RUN, str(SCRIPTS / "functional_bn_uneven.py")],
    "tutorial": [*RUN, str(SCRIPTS / "tf_distributed_tutorial.py")],
    "tf_keras_data": [*RUN, str(SCRIPTS / "tf_keras_data.py")],
    "save_reload": [*RUN, str(SCRIPTS / "save_reload.py")],
}


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    cwd.mkdir()
    return subprocess.run(command, cwd=str(cwd), env=clean_env(), capture_output=True,
                          text=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scripts")
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {name: pool.submit(_run, command, tmp / name)
                   for name, command in COMMANDS.items()}
        done = {name: future.result() for name, future in futures.items()}
    return done, tmp


def _ok(runs, name: str) -> subprocess.CompletedProcess:
    done, _ = runs
    proc = done[name]
    assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _ours(stderr: str) -> list[str]:
    """mirrorkit's own lines (TensorFlow's C++ start-up lines are mixed in)."""
    return [line for line in stderr.splitlines() if line.startswith("mirrorkit run:")]


def _json(runs, name: str, filename: str) -> dict:
    return json.loads((runs[1] / name / filename).read_text())


def _value(stdout: str, prefix: str) -> str:
    return next(line[len(prefix):].strip() for line in stdout.splitlines()
                if line.startswith(prefix))


def test_keras_io_mnist_convnet_with_validation_split(runs):
    proc = _ok(runs, "mnist_convnet")
    assert "strategy=mirrored replicas=2" in _ours(proc.stderr)[0]
    assert _value(proc.stdout, "replicas:") == "2"
    assert float(_value(proc.stdout, "Test accuracy:")) > 0.6
    assert float(_value(proc.stdout, "val_accuracy:")) > 0.6
    # 1260 training examples, batch 128: nothing to leave out, nothing said.
    assert "leaves out" not in proc.stderr


def test_tensorflow_first_script_with_tf_keras_and_tf_data(runs):
    _ok(runs, "tf_keras_data")
    result = _json(runs, "tf_keras_data", "tf_keras_data.json")
    assert result["tf_keras_is_keras_3"] and result["model_is_keras_model"]
    assert result["replicas"] == 2 and result["tf_get_strategy_replicas"] == 2
    assert result["accuracy"] > 0.8


def test_tutorial_script_creating_its_own_mirrored_strategy(runs):
    proc = _ok(runs, "tutorial")
    assert "Number of devices: 2" in proc.stdout
    adopted = [line for line in _ours(proc.stderr) if "the script's" in line]
    assert adopted == ["mirrorkit run: the script's tf.distribute.MirroredStrategy() is "
                       "mirrorkit's strategy (mirrored, 2 replicas)."]
    result = _json(runs, "tutorial", "tutorial.json")
    assert result["num_replicas_in_sync"] == 2 and result["model_replicas"] == 2
    assert result["isinstance_mirrored"] and result["get_strategy_is_strategy"]
    assert result["checkpoints"] == [f"ckpt_{e}.weights.h5" for e in range(1, 7)]
    assert result["eval_accuracy"] > 0.8


def test_functional_batchnorm_model_on_an_uneven_training_set(runs):
    proc = _ok(runs, "functional_bn")
    trims = [line for line in _ours(proc.stderr) if "leaves out" in line]
    assert len(trims) == 1, proc.stderr
    assert trims[0].startswith("mirrorkit run: fit leaves out the last 1 of 1217 training "
                               "examples: with batch_size=64 on 2 replicas")
    result = _json(runs, "functional_bn", "functional_bn.json")
    assert result["replicas"] == 2 and result["finite_weights"]
    # 1216 / 64 = 19 batches (20 with the lone example); Keras's 305 validation
    # examples are all kept: 5 batches.
    assert result["train_batches_per_epoch"] == 19
    assert result["val_batches_per_epoch"] == 5
    assert result["val_accuracy"] > 0.8


def test_model_saved_as_keras_file_reloads_identically(runs):
    proc = _ok(runs, "save_reload")
    result = json.loads(_value(proc.stdout, "RELOAD"))
    assert result["replicas"] == 2 and result["reloaded_replicas"] == 2
    assert result["max_prediction_diff"] < 1e-6
    assert result["reloaded_accuracy"] > 0.7
    assert (runs[1] / "save_reload" / "m.keras").is_file()


def test_multi_worker_tutorial_under_launch_and_run(runs):
    proc = _ok(runs, "multi_worker")
    for rank in (0, 1):
        line = (f"[{rank}] mirrorkit run: the script's tf.distribute.MultiWorkerMirroredStrategy()"
                " is mirrorkit's strategy (multi_worker, 2 replicas).")
        assert line in proc.stdout + proc.stderr
    workers = [_json(runs, "multi_worker", f"worker-{rank}.json") for rank in (0, 1)]
    for worker in workers:
        assert worker["num_replicas_in_sync"] == 2 and worker["isinstance_mwms"]
        assert worker["loss"][1] < worker["loss"][0]
    # Synchronous training: both workers end with the same weights and logs.
    assert workers[0]["first_kernel_sum"] == pytest.approx(workers[1]["first_kernel_sum"])
    assert workers[0]["loss"] == pytest.approx(workers[1]["loss"])
