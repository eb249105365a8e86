"""A one-process script's file operations behave as one process under ``mirrorkit launch``.

Each pattern is a small script in ``tests/fixtures/launch_files/`` written the
way its tutorial writes it, run once with plain ``python`` and once as 2
launched workers (``mirrorkit launch -n 2 -- mirrorkit run``): every worker
exits 0, prints the same final loss as the plain run, and the same files are
left in the end.

* keras.io's distributed-training guide: check-then-create of ``./ckpt``
  (``job-mkdir``), with the race forced by the fixture's ``--hold-race`` hook;
  the same with an absolute folder.
* TensorFlow's "Save and load models": a bare ``os.mkdir("training_2")``.
  Control: with ``MIRRORKIT_COMPAT_DISABLE=job-mkdir`` the second worker
  fails with ``FileExistsError`` (what plain TensorFlow workers get).
* TensorFlow's custom-training-loop multi-worker tutorial: its own chief
  logic (a non-chief's ``workertemp_1`` folder, removed with
  ``tf.io.gfile.rmtree``) runs as written next to chief-only saving.

The in-process test checks :mod:`mirrorkit.runner.job_dirs`'s rule itself.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, clean_env

from mirrorkit import _env
from mirrorkit.patching import engine
from mirrorkit.runner import job_dirs

FIXTURES = REPO / "tests" / "fixtures" / "launch_files"
GUIDE = str(FIXTURES / "keras_io_guide.py")
SAVE_LOAD = str(FIXTURES / "save_load_tutorial.py")
CTL = str(FIXTURES / "ctl_tutorial.py")
LAUNCH = [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--", "mirrorkit", "run"]


def _run(command: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(command, cwd=str(cwd), env=clean_env(**env), capture_output=True,
                          text=True, timeout=300)


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _lines(proc: subprocess.CompletedProcess, prefix: str) -> list[str]:
    """The lines starting with ``prefix`` (after launch's ``[rank] ``), one per process."""
    return [line.split("] ", 1)[-1] for line in proc.stdout.splitlines()
            if line.split("] ", 1)[-1].startswith(prefix)]


def _same_numbers(plain: subprocess.CompletedProcess,
                  launched: subprocess.CompletedProcess) -> None:
    (want,) = _lines(plain, "final loss ")
    finals = _lines(launched, "final loss ")
    assert len(finals) == 2 and finals[0] == finals[1], launched.stdout[-2000:]
    got, expected = finals[0].split()[2::2], want.split()[2::2]
    assert [float(g) for g in got] == pytest.approx([float(e) for e in expected], abs=2e-3)


@pytest.mark.fast
def test_mkdir_accepts_only_directories_made_during_the_job(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("before").mkdir()
    start = time.time()
    time.sleep(0.05)   # file times come from a coarser clock than time.time()
    Path("made").mkdir()
    Path("a-file").write_text("x")
    worker = SimpleNamespace(is_multi_worker=True)
    with job_dirs.installed(worker, job_start=start):
        assert engine.patched_by(os.mkdir) == job_dirs.NAME
        os.mkdir("made")                           # relative
        os.mkdir(tmp_path / "made")                # absolute, path-like
        os.makedirs(str(tmp_path / "made"))
        Path("made").mkdir()
        os.mkdir("new")                            # an ordinary mkdir still makes it
        assert Path("new").is_dir()
        for there in ("before", tmp_path / "before", "a-file"):
            with pytest.raises(FileExistsError):
                os.mkdir(there)
        with pytest.raises(FileExistsError):
            os.makedirs(tmp_path / "before")
    with pytest.raises(FileExistsError):           # undone after the block
        os.mkdir("made")
    # One process, or the patch turned off by name: Python's own mkdir.
    with job_dirs.installed(SimpleNamespace(is_multi_worker=False), job_start=start):
        with pytest.raises(FileExistsError):
            os.mkdir("made")
    with _env.patch({_env.COMPAT_DISABLE: job_dirs.NAME}), \
            job_dirs.installed(worker, job_start=start):
        with pytest.raises(FileExistsError):
            os.mkdir("made")
    with _env.patch({_env.JOB_START: None}), job_dirs.installed(worker):
        assert engine.patched_by(os.mkdir) is None   # not launched: nothing replaced


@pytest.fixture(scope="module")
def guide_plain(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The guide run once with plain ``python`` (the reference of both guide tests)."""
    folder = tmp_path_factory.mktemp("guide") / "plain"
    plain = _run([sys.executable, GUIDE], folder)
    _ok(plain)
    return plain, folder


@pytest.mark.slow
def test_keras_io_guide_makes_its_folder_once_relative_or_absolute(tmp_path, guide_plain):
    plain, plain_dir = guide_plain
    want = _files(plain_dir / "ckpt")
    assert want == ["ckpt-1.keras", "ckpt-2.keras"]
    for name, folder in (("relative", "./ckpt"), ("absolute", str(tmp_path / "abs" / "ckpt"))):
        held = tmp_path / f"held-{name}"
        held.mkdir()
        proc = _run([*LAUNCH, GUIDE, folder, "--hold-race", str(held)], tmp_path / name)
        _ok(proc)
        assert len(os.listdir(held)) == 2      # both workers checked before either made it
        made = tmp_path / name / "ckpt" if name == "relative" else Path(folder)
        assert _files(made) == want, name
        _same_numbers(plain, proc)


@pytest.mark.slow
def test_save_load_tutorial_mkdir_on_every_worker(tmp_path):
    plain = _run([sys.executable, SAVE_LOAD], tmp_path / "plain")
    _ok(plain)
    proc = _run([*LAUNCH, SAVE_LOAD], tmp_path / "launch")
    _ok(proc)
    assert _files(tmp_path / "launch") == _files(tmp_path / "plain")
    assert "training_2/cp-0003.weights.h5" in _files(tmp_path / "plain")
    assert _lines(proc, "listing ") == _lines(plain, "listing ") * 2
    _same_numbers(plain, proc)


@pytest.mark.slow
def test_without_job_mkdir_the_second_worker_fails(tmp_path):
    # The control: patch "job-mkdir" off by name, and the workers race as
    # plain TensorFlow workers do.
    proc = _run([*LAUNCH, SAVE_LOAD], tmp_path, **{_env.COMPAT_DISABLE: "job-mkdir"})
    assert proc.returncode != 0
    assert "FileExistsError: [Errno 17] File exists: 'training_2'" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_ctl_tutorial_chief_logic_of_its_own_runs_as_written(tmp_path):
    plain = _run([sys.executable, CTL, str(tmp_path / "plain")], tmp_path)
    _ok(plain)
    out = tmp_path / "launch"
    proc = _run([*LAUNCH, CTL, str(out)], tmp_path)
    # Before: worker 1's rmtree of workertemp_1/ckpt raised NotFoundError
    # (chief-only saving had sent its save elsewhere).
    _ok(proc)
    assert _files(out) == _files(tmp_path / "plain")
    assert "ckpt/ckpt-2.index" in _files(out)
    # The tutorial's own non-chief folder, emptied by its rmtree as under plain TF.
    assert [p.name for p in (out / "workertemp_1").iterdir()] == []
    _same_numbers(plain, proc)


@pytest.mark.slow
def test_keras_io_guide_second_run_restores_the_chiefs_newest_checkpoint(tmp_path,
                                                                         guide_plain):
    # The guide calls run_training() twice: the second lists ./ckpt right
    # after fit and loads the newest file. --slow-chief-save holds the chief
    # inside its write of ckpt-2.keras (the zip not yet closed) for 3 s.
    plain, plain_dir = guide_plain
    assert _lines(plain, "Restoring from ") == ["Restoring from ckpt-2.keras"]
    command = [*LAUNCH, GUIDE, "--slow-chief-save", "3"]
    proc = _run(command, tmp_path / "launch")
    _ok(proc)
    assert _lines(proc, "Restoring from ") == _lines(plain, "Restoring from ") * 2
    assert _files(tmp_path / "launch" / "ckpt") == _files(plain_dir / "ckpt")
    _same_numbers(plain, proc)
    # The control: patch "checkpoint-barrier" off by name, and worker 1 lists
    # the folder while the chief is still writing: it loads a half-written zip.
    # (The chief holds until worker 1 says it is listing, then until worker 1 has
    # exited, up to 120 s: on a busy machine worker 1 can reach its listing more
    # than 3 s after the chief, and its load any fixed time after its listing.)
    listed = tmp_path / "listed"
    listed.mkdir()
    control = _run([*LAUNCH, GUIDE, "--slow-chief-save", "120", "--listed", str(listed)],
                   tmp_path / "control", **{_env.COMPAT_DISABLE: "checkpoint-barrier"})
    assert control.returncode != 0
    assert "File not found: filepath=./ckpt/ckpt-2.keras. Please ensure the file is an " \
           "accessible `.keras` zip file" in control.stdout + control.stderr
