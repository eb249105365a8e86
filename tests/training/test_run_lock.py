"""One writer per run folder (issue 30): ``mirrorkit train`` locks ``OUTPUT/.mirrorkit.lock``.

In process (fast): the lock itself, on real files: a second holder refused
with the holder's name, a dead holder's file taken over, a restarted job
waiting for its own previous attempt, an existing run refused without a
lock left in it. In real processes (slow): two ``mirrorkit train --output S``
started at once, first with the lock turned off (the issue: two run_start
events in one log), then with it (one runs, the other exits with one line
before writing anything), then a run killed with SIGKILL whose stale lock a
``--resume`` takes over.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import clean_env

from mirrorkit.errors import RunError
from mirrorkit.training.config import TrainConfig
from mirrorkit.training.run_lock import (
    LOCK_NAME,
    Holder,
    RunLock,
    _proc_start,
    acquire,
    claim_output,
)

TRAIN = ("--simulate-cpus", "1", "--per-replica-batch", "64")


def _write_holder(folder: Path, holder: Holder) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_NAME).write_text(json.dumps(holder.__dict__))


# -- the lock, in process ----------------------------------------------------

@pytest.mark.fast
def test_a_second_writer_is_refused_naming_the_holder_and_release_removes_the_file(tmp_path):
    out = tmp_path / "S"
    with acquire(out, job=None) as held:
        named = Holder.parse((out / LOCK_NAME).read_text())
        assert (named.pid, named.host) == (os.getpid(), socket.gethostname())
        # flock is per open file: a second open in this same process conflicts too.
        with pytest.raises(RunError) as refused:
            acquire(out, job=None)
        line = str(refused.value)
        assert "\n" not in line
        assert f"{out} is in use by another run: pid {os.getpid()} on host " in line
        assert "nothing was written" in line and str(out / LOCK_NAME) in line
        assert held.path == out / LOCK_NAME
    assert not (out / LOCK_NAME).exists()
    acquire(out).release()   # free again


@pytest.mark.fast
def test_the_stale_lock_of_a_dead_run_is_taken_over_in_one_line(tmp_path):
    out = tmp_path / "S"
    # This host, a pid whose process start time is not the recorded one: gone.
    _write_holder(out, Holder(pid=os.getppid(), host=socket.gethostname(), started=1.0e9,
                              proc_start="1"))
    said: list[str] = []
    with acquire(out, say=said.append):
        assert Holder.parse((out / LOCK_NAME).read_text()).pid == os.getpid()
    assert len(said) == 1 and said[0].startswith(f"lock      took over the stale lock of {out} "
                                                 f"left by pid {os.getppid()} on host ")
    assert said[0].endswith("which no longer runs")


@pytest.mark.fast
def test_a_file_naming_a_live_process_is_refused_even_when_flock_is_free(tmp_path):
    # What a filesystem whose flock does not reach the holder would show.
    out = tmp_path / "S"
    _write_holder(out, Holder(pid=os.getppid(), host=socket.gethostname(), started=time.time(),
                              proc_start=_proc_start(os.getppid())))
    with pytest.raises(RunError, match=f"pid {os.getppid()} on host .*flock does not reach"):
        acquire(out)


@pytest.mark.fast
def test_a_restarted_job_waits_for_its_own_previous_attempt_but_another_job_is_refused(tmp_path):
    out = tmp_path / "S"
    first = acquire(out, job="job-1")
    with pytest.raises(RunError, match="job job-1"):
        acquire(out, job="job-2", wait_same_job=5)
    # The previous attempt's chief exits a moment later (the launcher reaps it).
    # Timed from before the timer starts: the release is then at least 0.5 s after
    # `started` however late this thread or the timer's runs on a loaded machine.
    started = time.monotonic()
    threading.Timer(0.5, first.release).start()
    said: list[str] = []
    with acquire(out, job="job-1", say=said.append, wait_same_job=10):
        assert 0.3 < time.monotonic() - started < 5
    assert said == []   # released cleanly: nothing stale to report


@pytest.mark.fast
def test_an_existing_run_is_refused_and_keeps_no_lock_file(tmp_path):
    out = tmp_path / "S"
    out.mkdir()
    (out / "metrics.json").write_text("{}\n")
    with pytest.raises(ValueError, match="already holds a run"):
        claim_output(TrainConfig(output=str(out)), print)
    assert sorted(p.name for p in out.iterdir()) == ["metrics.json"]
    fresh, lock = claim_output(TrainConfig(output=str(tmp_path / "new" / "S")), print)
    with lock:
        assert isinstance(lock, RunLock) and (fresh / LOCK_NAME).exists()
    # A folder the lock made, left empty (the run never wrote a file), goes with it.
    assert not fresh.exists()


# -- real runs ---------------------------------------------------------------

def _train(out: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mirrorkit", "train", *TRAIN,
                             "--output", str(out), *args], cwd=str(out.parent),
                            env=clean_env(**(env or {})), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


# Both runs import TensorFlow and mirrorkit first, then wait for each other,
# then run `mirrorkit train`: they reach the existing-run check together,
# however unevenly a loaded machine starts two processes.
_ALIGNED = """
import pathlib, sys, time
import keras, tensorflow, mirrorkit.cli, mirrorkit.training.job
barrier = pathlib.Path(sys.argv[1])
(barrier / str(time.time_ns())).touch()
deadline = time.monotonic() + 300
while len(list(barrier.iterdir())) < 2 and time.monotonic() < deadline:
    time.sleep(0.005)
sys.argv = ["mirrorkit", *sys.argv[2:]]
mirrorkit.cli.main()
"""


def _both(out: Path, *args: str, env: dict[str, str] | None = None) -> list[str]:
    """Start two runs that reach `mirrorkit train` at once; their outputs once both have ended."""
    barrier = out.parent / f"{out.name}.barrier"
    barrier.mkdir(parents=True)
    command = [sys.executable, "-c", _ALIGNED, str(barrier), "train", *TRAIN, "--output",
               str(out), *args]
    procs = [subprocess.Popen(command, cwd=str(out.parent), env=clean_env(**(env or {})),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    return ["".join(p.communicate(timeout=600)) for p in procs]


def _own_lines(text: str) -> list[str]:
    """Every line but TensorFlow's C++ runtime log (absl's "I0000 00:00:..." and its preamble)."""
    return [line for line in text.splitlines() if line.strip()
            and not re.match(r"[IWEF]\d{4} |WARNING: All log messages before absl", line)]


def _run_starts(out: Path) -> int:
    lines = (out / "events.jsonl").read_text().splitlines()
    return sum(json.loads(line)["event"] == "run_start" for line in lines)


def _history_well_formed(out: Path) -> list[int]:
    rows = list(csv.reader((out / "history.csv").read_text().splitlines()))
    assert all(len(row) == len(rows[0]) for row in rows), rows
    return [int(row[0]) for row in rows[1:]]


@pytest.mark.slow
def test_control_without_the_lock_two_runs_write_one_folder(tmp_path):
    # The case, with the guard turned off: both runs write S. Still a
    # race (aligned, the two reach the existing-run check together, but one
    # could write its first file before the other checks); three tries.
    starts: list[int] = []
    for attempt in range(3):
        out = tmp_path / f"S{attempt}"
        results = _both(out, "--epochs", "1", env={"MIRRORKIT_RUN_LOCK": "off"})
        starts.append(_run_starts(out))
        if starts[-1] == 2:
            break
    assert starts[-1] == 2, (starts, [text[-2000:] for text in results])


@pytest.mark.slow
def test_two_runs_at_once_one_writes_the_other_is_refused_and_a_killed_run_is_taken_over(
        tmp_path):
    out = tmp_path / "S"
    first, second = _train(out, "--epochs", "6"), _train(out, "--epochs", "6")
    # The refused one exits first (before loading data); the other keeps training.
    deadline = time.monotonic() + 300
    while first.poll() is None and second.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    loser, winner = (first, second) if first.poll() is not None else (second, first)
    stdout, stderr = loser.communicate()
    assert loser.returncode == 1, stdout[-2000:] + stderr[-3000:]
    lines = _own_lines(stdout + stderr)
    assert len(lines) == 1 and "Traceback" not in stderr, lines
    assert lines[0].startswith(f"Error: {out} is in use by another run: pid {winner.pid} "
                               f"on host {socket.gethostname()}, started "), lines[0]
    # The winner trains on; kill it hard once its first backup is written.
    backup = out / "backup" / "training_metadata.json"
    while not backup.exists() and winner.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert winner.poll() is None, winner.communicate()[1][-3000:]
    winner.send_signal(signal.SIGKILL)
    winner.communicate()
    # S holds the winner's files only: one run_start, a well-formed history.
    assert _run_starts(out) == 1
    assert _history_well_formed(out)[0] == 0
    assert Holder.parse((out / LOCK_NAME).read_text()).pid == winner.pid   # stale now
    resumed = subprocess.run([sys.executable, "-m", "mirrorkit", "train", *TRAIN,
                              "--output", str(out), "--epochs", "6", "--resume"],
                             cwd=str(tmp_path), env=clean_env(), capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    took = [line for line in resumed.stdout.splitlines() if "took over the stale lock" in line]
    assert len(took) == 1 and f"left by pid {winner.pid} on host " in took[0], resumed.stdout
    epochs = _history_well_formed(out)
    assert epochs == sorted(epochs) and epochs[-1] == 5, epochs
    assert _run_starts(out) == 2   # the killed run's and the resumed run's, one after the other
    assert not (out / LOCK_NAME).exists() and (out / "metrics.json").exists()
