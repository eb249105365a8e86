"""Unmodified scripts that save the usual way work as N launched workers.

``tests/fixtures/scripts/save_the_usual_way.py`` uses stock
``keras.callbacks.BackupAndRestore``/``ModelCheckpoint``/``TensorBoard``,
``model.save`` and ``model.save_weights`` from every worker. Under ``mirrorkit
launch -n 2 -- python`` the workers collide on the same files (the upstream
failure, asserted); under ``mirrorkit launch -n 2 -- mirrorkit run`` only the
chief writes, the result equals a plain single-process run, and a worker
killed mid-training resumes from the chief's backup.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from conftest import REPO, clean_env

SCRIPT = str(REPO / "tests" / "fixtures" / "scripts" / "save_the_usual_way.py")
LAUNCH = [sys.executable, "-m", "mirrorkit", "launch", "-n", "2"]


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=str(cwd), env=clean_env(), capture_output=True,
                          text=True, timeout=300)


def _final(stdout: str) -> list[str]:
    return [line.split("final loss ", 1)[1] for line in stdout.splitlines()
            if "final loss " in line]


def _history(out: Path, label: str) -> list[tuple[int, int]]:
    lines = (out / f"history-{label}.jsonl").read_text().splitlines()
    return [(r["restart"], r["epoch"]) for r in map(json.loads, lines)]


def _scratch_left() -> set[str]:
    # The private directories of mirrorkit.callbacks (other tools use other names).
    kinds = ("backup", "ckpt", "tensorboard", "save", "weights")
    return {p.name for kind in kinds
            for p in Path(tempfile.gettempdir()).glob(f"mirrorkit-{kind}-*")}


@pytest.mark.slow
def test_stock_saving_collides_without_mirrorkit_run(tmp_path):
    proc = _run([*LAUNCH, "--", "python", SCRIPT, "out"], tmp_path)
    assert proc.returncode != 0
    # Which write collides first varies: the HDF5 lock (BlockingIOError), two
    # makedirs of the backup directory, a half-written zip, TF's checkpoint merge.
    assert any(error in proc.stderr for error in (
        "Unable to synchronously create file", "FileExistsError", "BadZipFile",
        "MergeV2Checkpoints")), proc.stderr[-3000:]


@pytest.mark.slow
def test_only_the_chief_writes_and_results_match_one_process(tmp_path):
    before = _scratch_left()
    (tmp_path / "plain").mkdir()
    plain = _run([sys.executable, SCRIPT, "out"], tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr[-3000:]
    (tmp_path / "launch").mkdir()
    proc = _run([*LAUNCH, "--", "mirrorkit", "run", SCRIPT, "out"], tmp_path / "launch")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = tmp_path / "launch" / "out"

    def files(root: Path) -> list[str]:
        # TensorBoard's event file names carry host and pid: count them instead.
        names = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
        return [n if not n.startswith("logs/") else "logs/<events>" for n in names
                if not n.startswith("history-")]

    # The same files as one process writes: one TensorBoard run, one set of
    # Keras and tf.train checkpoints, the backup deleted after fit.
    assert files(out) == files(tmp_path / "plain" / "out")
    assert "tf_ckpt/ckpt-4.index" in files(out) and files(out).count("logs/<events>") == 1
    # Same numbers on both workers, and as a single process (1e-3: summation order).
    finals = _final(proc.stdout)
    assert len(finals) == 2 and finals[0] == finals[1]
    (want,) = _final(plain.stdout)
    got_loss, _, got_acc = finals[0].split()
    want_loss, _, want_acc = want.split()
    assert float(got_loss) == pytest.approx(float(want_loss), abs=2e-3)
    assert float(got_acc) == pytest.approx(float(want_acc), abs=2e-3)
    for name in ("final.keras", "ckpt/epoch04.keras"):
        with zipfile.ZipFile(out / name) as archive:      # whole, uncorrupted archives
            assert archive.testzip() is None
    assert _scratch_left() <= before                 # the others' private copies are gone


@pytest.mark.slow
def test_killed_worker_resumes_from_the_chiefs_backup(tmp_path):
    marker = tmp_path / "killed-once"
    proc = _run([*LAUNCH, "--max-restarts", "1", "--grace-period", "1", "--", "mirrorkit",
                 "run", SCRIPT, "out", "--kill-epoch", "3", "--marker", str(marker)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert marker.exists() and "(1 restarts)" in proc.stderr
    # Epochs 1-2 were backed up before the kill; the restarted group resumed at 3.
    for label in ("worker0", "worker1"):
        assert _history(tmp_path / "out", label) == [(0, 1), (0, 2), (1, 3), (1, 4)]
    assert not (tmp_path / "out" / "backup").exists()   # deleted after a finished fit
    finals = _final(proc.stdout)
    assert len(finals) == 2 and finals[0] == finals[1]
