"""A launched job leaves no private folder behind, however it ends; absurd -n is refused.

Issue 30's case: a launcher stopped by SIGTERM left worker 1's private backup
and TensorBoard folders (``mirrorkit-backup-*-worker1-*``,
``mirrorkit-tensorboard-*-worker1-*``) in the temp dir, because TensorFlow
workers ignore SIGTERM and are SIGKILLed with no chance to clean up. Each
launch here gets its own TMPDIR, so what the job leaves there is all it left.
The crash case also checks the launcher's summary names the killed worker as
the root cause (the same run would otherwise be started again in test_launcher.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO, clean_env

from mirrorkit.cli import cli
from mirrorkit.launcher import LaunchSpec, launch
from mirrorkit.launcher.capacity import WORKER_MEMORY, oversubscription

MAIN = [sys.executable, "-c", "from mirrorkit.cli import main; main()"]
TRAIN = str(REPO / "tests" / "fixtures" / "launch_train.py")
GB = 2**30


def _start(tmp_path: Path, args: list[str]) -> tuple[subprocess.Popen, Path]:
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    proc = subprocess.Popen([*MAIN, "launch", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env=clean_env(TMPDIR=str(temp)), start_new_session=True)
    return proc, temp


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"launcher still running after {timeout}s\n{out}\n{err}")
    return proc.returncode, out, err


def _ours(temp: Path) -> list[str]:
    """mirrorkit's entries in the job's temp dir (TensorFlow's autograph files aside)."""
    return sorted(p.name for p in temp.iterdir() if p.name.startswith("mirrorkit-"))


def _wait_for(predicate, proc: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None or time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            raise AssertionError(f"no {what} after {timeout}s\n{out[-2000:]}\n{err[-2000:]}")
        time.sleep(0.1)


# --- scratch folders: every end the launcher sees ----------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_stopped_launcher_leaves_no_private_folder_of_its_workers(tmp_path, sig, code):
    # The run: mirrorkit train on 2 workers, private backup and TensorBoard on worker 1.
    proc, temp = _start(tmp_path, ["-n", "2", "--grace-period", "1", "--", "mirrorkit",
                                   "train", "--epochs", "500", "--output", "out"])

    def private() -> list[Path]:
        return [*temp.glob("mirrorkit-job-*/mirrorkit-backup-*-worker1-*"),
                *temp.glob("mirrorkit-job-*/mirrorkit-tensorboard-*-worker1-*")]

    # Worker 1's stand-ins live in the job's root, not loose in the temp dir.
    _wait_for(lambda: len(private()) == 2, proc, 180, "private folders of worker 1")
    assert [p for p in temp.glob("mirrorkit-*-worker1-*")] == []
    (root,) = temp.glob("mirrorkit-job-*")
    os.kill(proc.pid, sig)
    rc, _, err = _finish(proc, 60)
    assert rc == code and f"stopped by {sig.name}" in err, err[-2000:]
    assert not root.exists() and _ours(temp) == [], sorted(os.listdir(temp))


@pytest.mark.slow
def test_crashed_worker_is_the_named_root_cause_and_leaves_no_private_folder(tmp_path):
    # Worker 1 SIGKILLs itself in epoch 2, its private backup written in epoch 1.
    # No restarts: the launcher's summary names it as the root cause (this run
    # is also tests/launcher/test_launcher.py's crash without restarts, checked
    # here so the same two TensorFlow workers are not started twice).
    proc, temp = _start(tmp_path, [
        "-n", "2", "--grace-period", "1", "--", "python", TRAIN, "out", "--epochs", "4",
        "--backup", "--kill-rank", "1", "--kill-epoch", "2", "--marker", "killed"])
    rc, out, err = _finish(proc, 240)
    assert rc == 128 + signal.SIGKILL and "worker 1 SIGKILLs itself" in out, err[-2000:]
    summary = err[err.index("[launch] FAILED after 0 restart(s)"):]
    assert "Root cause: worker 1 (pid" in summary and "was killed by SIGKILL" in summary
    tail = summary.split("output line(s) of worker 1:")[1]
    assert "  worker 1 SIGKILLs itself in epoch 2" in tail
    # Worker 0 finished epoch 1 only (restart 0), and no model was saved.
    finished = [(r["restart"], r["epoch"]) for r in map(
        json.loads, (tmp_path / "out" / "history-0.jsonl").read_text().splitlines())]
    assert finished == [(0, 1)] and not (tmp_path / "out" / "model.keras").exists()
    assert _ours(temp) == [], sorted(os.listdir(temp))


@pytest.mark.slow
def test_each_worker_gets_the_job_root_and_a_normal_exit_removes_it(tmp_path):
    script = ("import os, pathlib; root = os.environ['MIRRORKIT_SCRATCH_DIR']; "
              "pathlib.Path(root, 'mine-' + os.environ['MIRRORKIT_ORIGINAL_RANK']).mkdir(); "
              "print('ROOT', root)")
    proc, temp = _start(tmp_path, ["-n", "2", "--", "python", "-c", script])
    rc, out, err = _finish(proc, 60)
    roots = {line.split("ROOT ", 1)[1] for line in out.splitlines() if "ROOT " in line}
    assert rc == 0 and len(roots) == 1, out + err[-2000:]
    root = Path(roots.pop())
    assert root.parent == temp and root.name.startswith("mirrorkit-job-")
    assert not root.exists() and _ours(temp) == [], sorted(os.listdir(temp))


@pytest.mark.slow
def test_a_sigkilled_launchers_root_is_swept_by_the_next_launch_never_a_live_one(tmp_path):
    # No handler runs on SIGKILL: its workers die with it (parent-death signal), its root stays.
    wait = ("import os, time; print('ROOT', os.environ['MIRRORKIT_SCRATCH_DIR'], flush=True); "
            "time.sleep(600)")
    killed, temp = _start(tmp_path, ["-n", "1", "--", "python", "-c", wait])
    line = killed.stdout.readline()
    root = Path(line.split("ROOT ", 1)[1].strip())
    # A launch while it runs leaves the live job's root alone.
    rc, _, err = _finish(_start(tmp_path, ["-n", "1", "--", "python", "-c", "pass"])[0], 60)
    assert rc == 0 and root.is_dir(), err[-2000:]
    killed.kill()
    killed.communicate()
    assert root.is_dir()
    rc, _, err = _finish(_start(tmp_path, ["-n", "1", "--", "python", "-c", "pass"])[0], 60)
    assert rc == 0 and "removed 1 scratch folder(s) of earlier launches" in err, err[-2000:]
    # (A relay folder that did not fit in the root, for a long TMPDIR, is not swept.)
    assert not root.exists() and not list(temp.glob("mirrorkit-job-*")), sorted(os.listdir(temp))


# --- -n this machine cannot hold ---------------------------------------------------------

@pytest.mark.fast
def test_the_decision_counts_cores_and_memory():
    # A 2-core CI box runs 3 workers today; 4 per core is the limit.
    assert oversubscription(3, cores=2, available=8 * GB) is None
    assert oversubscription(8, cores=2, available=None) is None
    line = oversubscription(1000, cores=2, available=20 * GB)
    assert line.startswith("-n 1000 is more workers than this machine can hold usefully: "
                           "2 core(s) allow at most 8 (4 per core), 20.0 GB of available "
                           "memory at about 0.7 GB per TensorFlow worker allows 29. "), line
    assert line.endswith("Use -n 8 or fewer, or add --oversubscribe to start them anyway.")
    # Memory alone: plenty of cores, too little memory for 4 workers.
    line = oversubscription(4, cores=64, available=3 * WORKER_MEMORY)
    assert "allows 3. Use -n 3 or fewer" in line, line
    assert "\n" not in line


@pytest.mark.fast
def test_too_many_workers_are_refused_in_one_line_and_none_starts(tmp_path):
    marker = tmp_path / "started"
    command = ["--", sys.executable, "-c", f"open({str(marker)!r}, 'a').close()"]
    result = CliRunner().invoke(cli, ["launch", "-n", "1000", *command])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "Error: -n 1000 is more workers than this machine can hold usefully"), result.output
    assert "--oversubscribe" in lines[0] and not marker.exists()
    # With the override the check passes: the next step, finding the program,
    # is what fails here (before any process would start).
    spec = dict(command=("mirrorkit-surely-no-such-program",), nproc=1000)
    with pytest.raises(ValueError, match="more workers than this machine"):
        launch(LaunchSpec(**spec))
    with pytest.raises(ValueError, match="Command not found"):
        launch(LaunchSpec(**spec, oversubscribe=True))
