"""Fault injection into a backup: every resume verifies it first (backup_manifest).

One short ``mirrorkit train`` killed after its second epoch leaves a backup
(epoch 2) and ``backup/previous`` (epoch 1). Each damage case gets its own
copy of that run folder; one process then tries ``--resume`` on every copy:
each attempt must refuse with one line naming the damaged file, before any
training, and leave every file of the earlier run byte for byte as it was.
``--resume-previous`` then recovers from epoch 1, and an intact copy resumes
at epoch 2.

The control shows what Keras's own ``BackupAndRestore`` does with the same
damage (the issue's cases): a deleted weights file trains on from random
weights labelled as later epochs, a deleted metadata file restarts the epoch
count; mirrorkit's class refuses both, resumes a backup from before
manifests (checked by format) and falls back only when told to.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import clean_env

pytestmark = pytest.mark.slow

# The run lock's own file (training.run_lock) is rewritten by every attempt by design.
_NOT_RUN_FILES = (".mirrorkit.lock",)

_KILLED_RUN = """
import os, sys, keras
from mirrorkit.training import TrainConfig, train

class Kill(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):   # after the backup of this epoch
        if epoch == 1:
            os._exit(17)

train(TrainConfig(epochs=3, output=sys.argv[1], simulate_cpus=2), callbacks=[Kill()])
"""

_ATTEMPTS = """
import json, sys
from click.testing import CliRunner
from mirrorkit.cli import cli

results = {}
for flags_and_dir in json.loads(sys.argv[1]):
    *flags, folder = flags_and_dir
    result = CliRunner().invoke(cli, ["train", "--simulate-cpus", "2", "--epochs", "3",
                                      "--output", folder, *flags])
    results[folder] = [result.exit_code, result.output]
print("RESULTS" + json.dumps(results))
"""


def _python(code: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=str(cwd),
                          env=clean_env(), capture_output=True, text=True, timeout=600)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name not in _NOT_RUN_FILES}


def _history_epochs(folder: Path) -> list[int]:
    lines = (folder / "history.csv").read_text().splitlines()[1:]
    return [int(line.split(",")[0]) for line in lines]


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("backup")
    proc = _python(_KILLED_RUN, "run", cwd=root)
    assert proc.returncode == 17, proc.stderr[-3000:]
    backup = root / "run" / "backup"
    assert json.loads((backup / "manifest.json").read_text())["epoch"] == 2
    assert json.loads((backup / "previous" / "manifest.json").read_text())["epoch"] == 1
    assert _history_epochs(root / "run") == [0, 1]
    return root / "run"


def _truncate_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0xFF   # the middle of the JSON too: still the same size
    path.write_bytes(bytes(data))


_DAMAGES = {
    "delete": lambda p: p.unlink(),
    "zero": lambda p: p.write_bytes(b""),
    "half": _truncate_half,
    "flip": _flip,
    "garbage": lambda p: p.write_text('{"format": "mirrorkit-backup/1", "epoch": '),
}

# (file, damage, what the line must say about it)
_CASES = [
    ("latest.weights.h5", "delete", "latest.weights.h5 is missing"),
    ("latest.weights.h5", "zero", "latest.weights.h5 is 0 bytes, the manifest says"),
    ("latest.weights.h5", "half", "latest.weights.h5 is {half} bytes, the manifest says {full}"),
    ("latest.weights.h5", "flip", "latest.weights.h5 does not match its sha256"),
    ("training_metadata.json", "delete", "training_metadata.json is missing"),
    ("training_metadata.json", "zero", "training_metadata.json is 0 bytes"),
    ("training_metadata.json", "half",
     "training_metadata.json is {half} bytes, the manifest says {full}"),
    ("training_metadata.json", "flip", "training_metadata.json does not match its sha256"),
    ("manifest.json", "garbage", "manifest.json is unreadable"),
    ("manifest.json", "delete", "manifest.json is missing, though training_metadata.json "
                                "says one was written"),
]


def test_every_damaged_backup_file_refuses_the_resume_and_changes_nothing(killed_run):
    root = killed_run.parent
    before: dict[str, dict[str, bytes]] = {}
    attempts = []
    for name, damage, _ in _CASES:
        copy = root / f"{name}-{damage}"
        shutil.copytree(killed_run, copy)
        _DAMAGES[damage](copy / "backup" / name)
        before[copy.name] = _files(copy)
        attempts.append(["--resume", copy.name])
    # The fallback the lines offer, and an intact backup.
    shutil.copytree(root / "latest.weights.h5-flip", root / "fallback")
    shutil.copytree(killed_run, root / "intact")
    attempts += [["--resume-previous", "fallback"], ["--resume", "intact"]]

    proc = _python(_ATTEMPTS, json.dumps(attempts), cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.split("RESULTS", 1)[1])

    for name, damage, says in _CASES:
        folder = f"{name}-{damage}"
        code, output = results[folder]
        lines = [line for line in output.splitlines() if line.strip()]
        error = [line for line in lines if line.startswith("Error: ")]
        assert code == 1 and len(error) == 1, (folder, output)
        assert "Traceback" not in output and "Epoch 1/" not in output, (folder, output)
        line = error[0]
        full = (killed_run / "backup" / name).stat().st_size
        says = says.format(half=full // 2, full=full)
        assert f"Cannot resume from the backup in {folder}/backup: {says}" in line, (folder, line)
        # The choices: the previous good backup, by option, or start over.
        assert (f"add --resume-previous to resume from the previous good backup (epoch 1, "
                f"{folder}/backup/previous)") in line, line
        assert "choose another --output" in line, line
        # Never trained, and no file of the earlier run changed (byte for byte).
        assert _files(root / folder) == before[folder], folder

    code, output = results["fallback"]
    assert code == 0, output
    assert "resuming at epoch 1 from fallback/backup/previous" in proc.stderr + output
    # Epoch 1 (index) trained again from the previous backup, then 2: the
    # epoch count continues from the backup it restored, not from 0 or 2.
    assert _history_epochs(root / "fallback") == [0, 1, 1, 2]

    code, output = results["intact"]
    assert code == 0, output
    assert "Epoch 3/3" in output and "Epoch 1/3" not in output
    assert _history_epochs(root / "intact") == [0, 1, 2]


_CONTROL = """
import json, os, shutil, sys
import numpy as np
import keras
from mirrorkit.callbacks import BackupAndRestore
from mirrorkit.errors import RunError

x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True)

def model():
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    m.compile(optimizer="sgd", loss="mse")
    return m

def fit(cls, folder, epochs=4):
    m = model()
    h = m.fit(x, y, epochs=epochs, verbose=0, callbacks=[cls(folder, delete_checkpoint=False)])
    return m, h.epoch

out = {}
# A backup as Keras writes it (no manifest): what mirrorkit must still resume.
trained, _ = fit(keras.callbacks.BackupAndRestore, "stock", epochs=2)
for case, gone in (("weights", "latest.weights.h5"), ("metadata", "training_metadata.json")):
    shutil.copytree("stock", case)
    os.remove(os.path.join(case, gone))
    shutil.copytree(case, case + "-mk")
    m, epochs = fit(keras.callbacks.BackupAndRestore, case)
    out["stock-" + case] = epochs
    try:
        fit(BackupAndRestore, case + "-mk")
        out["mirrorkit-" + case] = "trained"
    except RunError as err:
        out["mirrorkit-" + case] = str(err)
resumed = model()
cb = BackupAndRestore("stock", delete_checkpoint=False)
cb.set_model(resumed)
cb.on_train_begin()
out["legacy-epoch"] = resumed._initial_epoch
out["legacy-same"] = all(np.array_equal(a, b)
                         for a, b in zip(resumed.get_weights(), trained.get_weights()))

# mirrorkit's own backup: epoch 2 with previous/ at epoch 1; zero the weights.
fit(BackupAndRestore, "mk", epochs=2)
open("mk/latest.weights.h5", "wb").close()
try:
    fit(BackupAndRestore, "mk")
    out["mk-zero"] = "trained"
except RunError as err:
    out["mk-zero"] = str(err)
os.environ["MIRRORKIT_BACKUP_FALLBACK"] = "previous"
out["mk-fallback"] = fit(BackupAndRestore, "mk")[1]
print("RESULTS" + json.dumps(out))
"""


def test_control_kerass_callback_trains_on_from_a_damaged_backup_mirrorkits_refuses(tmp_path):
    proc = _python(_CONTROL, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULTS", 1)[1])
    # Upstream: weights gone -> epochs 3-4 from random weights; metadata gone
    # -> the epoch count restarts (4 epochs more on restored weights).
    assert out["stock-weights"] == [2, 3]
    assert out["stock-metadata"] == [0, 1, 2, 3]
    assert out["mirrorkit-weights"].startswith("Cannot resume from the backup in weights-mk: "
                                               "latest.weights.h5 is missing"), out
    assert out["mirrorkit-metadata"].startswith(
        "Cannot resume from the backup in metadata-mk: training_metadata.json is missing"), out
    for line in (out["mirrorkit-weights"], out["mirrorkit-metadata"]):
        assert "no previous backup is kept; or start over: delete" in line
    # Keras's own backup (no manifest) still resumes, checked by format.
    assert out["legacy-epoch"] == 2 and out["legacy-same"]
    assert "latest.weights.h5 is 0 bytes, the manifest says" in out["mk-zero"]
    assert "set MIRRORKIT_BACKUP_FALLBACK=previous to resume from the previous good backup " \
           "(epoch 1, mk/previous)" in out["mk-zero"]
    assert out["mk-fallback"] == [1, 2, 3]
