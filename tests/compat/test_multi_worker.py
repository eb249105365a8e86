"""Real multi-worker runs of apps/multi_worker.py: 2 and 3 worker processes on loopback.

Each run is one TF_CONFIG cluster of separate processes (one CPU replica
each), bounded in time and always reaped (tests/workers.py). Checks are
grouped per run to keep the suite short:

* 2 workers: fit/evaluate/predict, identical weights everywhere, the same
  weights as one process on the same global batch (equivalence), predictions
  equal to a single-process predict of the saved model (every example once,
  in order), chief-only files, no temporary directories left, and the
  checkpoint reloads to the same loss. The one-process reference run then
  reloads the job's saved models in the same interpreter (_SINGLE).
* 3 workers: fit/evaluate/predict and identical weights with an uneven last
  predict batch.
* Resume: both workers killed after an epoch, restarted with the same
  output: training continues at the next epoch, ends at the requested count
  and matches an uninterrupted run.
* Dead peer: SIGKILL one worker mid-epoch; the other exits non-zero with a
  clear message within the documented bound.
* Missing peer: a worker that never starts fails the other at start-up
  within MIRRORKIT_JOIN_TIMEOUT, naming the missing task.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import REPO, clean_env
from workers import WorkerGroup

from mirrorkit import compat
from mirrorkit.distribute.failure_detection import EXIT_MARGIN

APP = REPO / "apps" / "multi_worker.py"
EPOCHS = 3
# 2 workers x 16 per replica and 1 process x 32 both train on global batch 32. Float
# summation order differs between releases (tf-nightly 2.23: 1.02e-05 after 3 epochs);
# a wrong loss scale or a missed replica's gradient is off by 1e-2 or more.
EQUIVALENCE_ATOL = 2e-5
HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None

pytestmark = pytest.mark.slow


def _args(out, results, per_replica, epochs=EPOCHS):
    return ["--epochs", str(epochs), "--per-replica-batch", str(per_replica),
            "--output", str(out), "--results", str(results), "--no-shuffle"]


def _load(results, task):
    with np.load(os.path.join(results, f"{task}.npz")) as data:
        return {k: data[k] for k in data.files}


def _mirrorkit_temp(path):
    return sorted(p for p in os.listdir(path) if p.startswith("mirrorkit-"))


def _files(root):
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _, names in os.walk(root) for f in names)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """The uninterrupted 2-worker job (2 x 16 per replica) of the first test."""
    tmp = tmp_path_factory.mktemp("two_workers")
    out, res = tmp / "out", tmp / "res"
    with _start(tmp, 2, _args(out, res, per_replica=16)) as group:
        results = group.wait(timeout=240)
        report, chief_pid = group.report(), group.procs[0].pid
    return SimpleNamespace(tmp=tmp, out=out, res=res, report=report, chief_pid=chief_pid,
                           returncodes=[r.returncode for r in results])


# One single process: the app exactly as `python apps/multi_worker.py ARGS` runs
# it (its folder first on the path), then the models the 2-worker job saved,
# loaded afresh (this process never trained them): predict and evaluate the
# test split.
_SINGLE = textwrap.dedent('''
    import runpy, sys
    sys.path[0] = {apps!r}
    sys.argv = [{app!r}, *{args!r}]
    try:
        runpy.run_path({app!r}, run_name="__main__")
    except SystemExit as end:
        if end.code:
            raise

    import keras
    import numpy as np
    from multi_worker import load_digits_split

    _, (x_test, y_test) = load_digits_split()
    out = {{}}
    for name, path in {paths!r}.items():
        try:   # a model that does not reload fails its test, not the reference
            model = keras.models.load_model(path)
            out[name + "_pred"] = model.predict(x_test, batch_size=50, verbose=0)
            out[name + "_loss"] = model.evaluate(x_test, y_test, verbose=0,
                                                 return_dict=True)["loss"]
        except Exception as err:
            out[name + "_error"] = repr(err)
    np.savez({dest!r}, **out)
''')


@pytest.fixture(scope="module")
def single_process(tmp_path_factory, two_workers):
    """The reference run and the 2-worker job's reloaded models, from one process (_SINGLE)."""
    tmp = tmp_path_factory.mktemp("reference")
    saved = {"final": two_workers.out / "model.keras",
             "best": two_workers.out / "checkpoints" / "best.keras"}
    dest = tmp / "reloaded.npz"
    script = tmp / "single.py"
    script.write_text(_SINGLE.format(
        apps=str(REPO / "apps"), app=str(APP), dest=str(dest),
        args=[str(a) for a in _args(tmp / "out", tmp / "res", per_replica=32)],
        # Whatever the job saved: if it failed, its test says so, not the reference.
        paths={k: str(v) for k, v in saved.items() if v.is_file()}))
    proc = subprocess.run([sys.executable, str(script)], env=clean_env(), cwd=str(tmp),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with np.load(dest) as data:
        reloaded = {k: data[k] for k in data.files}
    return _load(tmp / "res", "local"), reloaded


@pytest.fixture(scope="module")
def reference(single_process):
    """One process (default strategy), global batch 32, the same seed and data order."""
    return single_process[0]


@pytest.fixture(scope="module")
def reloaded(single_process):
    """The 2-worker job's final and best models, loaded in one process: predictions, losses."""
    return single_process[1]


def _start(tmp_path, n, args, **env):
    systmp = tmp_path / "systmp"
    systmp.mkdir(exist_ok=True)
    return WorkerGroup(APP, n, args=args, cwd=tmp_path, env={"TMPDIR": str(systmp), **env})


def test_two_workers_train_save_and_match_one_process(two_workers, reference, reloaded):
    out, res, report = two_workers.out, two_workers.res, two_workers.report
    assert two_workers.returncodes == [0, 0], report
    w0, w1 = _load(res, "worker0"), _load(res, "worker1")
    assert bool(w0["is_chief"]) and not bool(w1["is_chief"])

    # Every worker ends with the same weights and the same predictions.
    assert np.array_equal(w0["weights"], w1["weights"])
    assert np.array_equal(w0["predictions"], w1["predictions"])

    # Equivalence: 2 workers x 16 == 1 process x 32 (same init, same order).
    assert np.array_equal(w0["initial"], reference["initial"])
    diff = float(np.abs(w0["weights"] - reference["weights"]).max())
    print(f"\nequivalence max abs weight diff after {EPOCHS} epochs: {diff:.3g}")
    assert diff < EQUIVALENCE_ATOL

    # Only the chief's files at the real paths; the backup is gone after a
    # completed fit (Keras semantics); no worker's temporary dir remains.
    expected = ["checkpoints/best.keras", "model.keras"]
    files = _files(out)
    logs = [f for f in files if f.startswith("logs/")]
    assert [f for f in files if not f.startswith("logs/")] == expected, files
    if HAS_TENSORBOARD:
        assert [os.path.dirname(f) for f in logs] == ["logs/train", "logs/validation"], logs
        # Event file names carry the writer's pid: all are the chief's.
        assert all(f".{two_workers.chief_pid}." in os.path.basename(f) for f in logs), (
            logs, two_workers.chief_pid)
    assert _mirrorkit_temp(two_workers.tmp / "systmp") == []

    # Predict returns every example once, in order: equal to one process
    # predicting with the saved final model. The best checkpoint reloads and
    # evaluates to the best validation loss seen during fit.
    assert sorted(reloaded) == ["best_loss", "best_pred", "final_loss", "final_pred"], reloaded
    assert w0["predictions"].shape == reloaded["final_pred"].shape == (len(w0["x_test"]), 10)
    np.testing.assert_allclose(w0["predictions"], reloaded["final_pred"], atol=1e-5)
    np.testing.assert_allclose(w0["predictions"], w0["local_predictions"], atol=1e-5)
    np.testing.assert_allclose(reloaded["final_loss"], w0["loss"], atol=1e-5)
    np.testing.assert_allclose(reloaded["best_loss"], w0["val_loss"].min(), atol=1e-5)


def test_three_workers_fit_evaluate_predict(tmp_path):
    out, res = tmp_path / "out", tmp_path / "res"
    # Global batch 48: the last predict batch (357 = 7*48 + 21) is split 7/7/7.
    with _start(tmp_path, 3, _args(out, res, per_replica=16, epochs=1)) as group:
        results = group.wait(timeout=240)
        report = group.report()
    assert [r.returncode for r in results] == [0, 0, 0], report
    loaded = [_load(res, f"worker{i}") for i in range(3)]
    for other in loaded[1:]:
        assert np.array_equal(loaded[0]["weights"], other["weights"])
        assert np.array_equal(loaded[0]["predictions"], other["predictions"])
        assert float(loaded[0]["loss"]) == float(other["loss"])
    assert [bool(w["is_chief"]) for w in loaded] == [True, False, False]
    # Every example once, in order: equal to a plain forward pass of the same
    # weights in one process (no distribution).
    assert loaded[0]["predictions"].shape == (len(loaded[0]["x_test"]), 10)
    np.testing.assert_allclose(loaded[0]["predictions"], loaded[0]["local_predictions"], atol=1e-5)
    assert [f for f in _files(out) if not f.startswith("logs/")] == [
        "checkpoints/best.keras", "model.keras"]
    assert _mirrorkit_temp(tmp_path / "systmp") == []


def test_resume_after_both_workers_are_killed(tmp_path, reference):
    out, res = tmp_path / "out", tmp_path / "res"
    args = _args(out, res, per_replica=16)
    with _start(tmp_path, 2, args) as group:
        # The app prints an epoch after BackupAndRestore saved it.
        group.wait_for_output(0, f"epoch 1/{EPOCHS}", timeout=180)
        group.kill(0)
        group.kill(1)
        group.wait(timeout=30)
    backup = out / "backup"
    # A complete backup (its manifest written last); previous/ holds the one before, if any.
    assert sorted(n for n in os.listdir(backup) if n != "previous") == [
        "latest.weights.h5", "manifest.json", "training_metadata.json"]
    done = json.loads((backup / "training_metadata.json").read_text())["epoch"]
    assert 1 <= done < EPOCHS
    # The killed non-chief's private dirs are left behind (SIGKILL can't be
    # cleaned up) -- proof that it never wrote the real paths.
    left = _mirrorkit_temp(tmp_path / "systmp")
    assert sorted(p.split("-")[1] for p in left) == ["backup", "ckpt", "tensorboard"], left
    assert all("-worker1-" in p for p in left), left

    with _start(tmp_path, 2, args) as group:
        results = group.wait(timeout=240)
        report = group.report()
    assert [r.returncode for r in results] == [0, 0], report
    w0, w1 = _load(res, "worker0"), _load(res, "worker1")
    # Both continue at the next epoch and stop at the requested count.
    assert w0["epochs_run"].tolist() == w1["epochs_run"].tolist() == list(range(done, EPOCHS))
    assert np.array_equal(w0["weights"], w1["weights"])
    # Resumed == uninterrupted (weights and optimizer state were restored).
    diff = float(np.abs(w0["weights"] - reference["weights"]).max())
    print(f"\nresumed after epoch {done}: max abs diff to uninterrupted run {diff:.3g}")
    assert diff < EQUIVALENCE_ATOL
    assert not backup.exists()
    assert _mirrorkit_temp(tmp_path / "systmp") == []  # the restart removed the stale dirs


PEER_TIMEOUT = 5.0


@pytest.mark.exclusive
@pytest.mark.parametrize("victim", [1, 0], ids=["kill-worker", "kill-chief"])
def test_dead_peer_fails_the_survivor_within_the_bound(tmp_path, victim):
    bound = PEER_TIMEOUT + EXIT_MARGIN
    survivor = 1 - victim
    args = _args(tmp_path / "out", tmp_path / "res", per_replica=16, epochs=100)
    with _start(tmp_path, 2, args, MIRRORKIT_COLLECTIVE_TIMEOUT=str(PEER_TIMEOUT)) as group:
        group.wait_for_output(0, "epoch 1/100", timeout=180)
        time.sleep(0.3)  # mid-epoch
        killed_at = group.kill(victim)
        results = group.wait(timeout=bound + 30, indices=[survivor])
        report = group.report()
    result = results[survivor]
    took = result.ended_at - killed_at
    print(f"\nworker {victim} killed: worker {survivor} exited {result.returncode} "
          f"after {took:.1f}s (bound {bound:.0f}s)")
    assert result.returncode not in (0, -999), report
    assert took < bound, report
    messages = [ln for ln in result.stderr.splitlines() if "lost a peer worker" in ln]
    assert len(messages) == 1 and "resume" in messages[0], report


def test_worker_that_never_starts_fails_the_others_within_join_timeout(tmp_path):
    # Worker 1 of 2 is never started: worker 0 must not wait TF's hour.
    join = 4.0
    with WorkerGroup(APP, 2, args=_args(tmp_path / "out", tmp_path / "res", per_replica=16),
                     cwd=tmp_path, env={"MIRRORKIT_JOIN_TIMEOUT": str(join)}) as group:
        group.kill(1)  # gone before it could import anything
        results = group.wait(timeout=join + 60, indices=[0])
        report = group.report()
    result = results[0]
    assert result.returncode not in (0, -999), report
    assert "Cannot form the multi-worker cluster" in result.stderr, report
    assert "/job:worker/replica:0/task:1" in result.stderr and "MIRRORKIT_JOIN_TIMEOUT" in result.stderr
    print(f"\nmissing worker: worker 0 exited after {result.elapsed:.1f}s (join timeout {join:.0f}s)")
