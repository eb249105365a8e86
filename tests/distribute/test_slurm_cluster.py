"""A real Slurm cluster (one node, started by the tests): srun, sbatch, and a task killed mid-run.

Complements ``test_slurm.py`` (constructed Slurm environments, fast): here
``srun`` and ``sbatch`` start the tasks, so Slurm's own variables, process
tracking and step teardown are the real ones. Skipped, with the reason,
where Slurm is not installed or the tests do not run as root; ``.ci/run``
installs it.
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
from conftest import REPO
from slurm_cluster import SlurmCluster, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slurm-cluster"),
              pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

MIRRORKIT = [sys.executable, "-m", "mirrorkit"]
# sbatch runs `mirrorkit` by name: the interpreter's own bin folder comes first.
PATH = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as running:
        yield running


def _workers(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def test_srun_two_tasks_train_as_one_two_worker_cluster(cluster, tmp_path):
    out = tmp_path / "run"
    proc = cluster.run(["srun", "-n", "2", "--kill-on-bad-exit=1", *MIRRORKIT, "train",
                        "--epochs", "2", "--output", str(out)], cwd=tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Only the chief (task 0) reports and writes.
    assert proc.stdout.count("strategy  multi_worker, 2 replicas, 2 workers") == 1, proc.stdout
    metrics = _workers(out)
    assert (metrics["workers"], metrics["replicas"], metrics["epochs_run"]) == (2, 2, 2)
    assert metrics["val_accuracy"] > 0.5


def test_the_sbatch_example_completes(cluster, tmp_path):
    out = tmp_path / "run"
    # The example asks for 2 nodes x 4 GPUs; the command line fits it to this one node.
    proc = cluster.run(["sbatch", "--wait", "--nodes=1", "--ntasks-per-node=2",
                        "--cpus-per-task=1", "--gpus-per-node=0", f"--output={tmp_path}/job.out",
                        str(REPO / "apps" / "slurm" / "train.sbatch")],
                       cwd=tmp_path, timeout=500, PATH=PATH, RUN_DIR=str(out), EPOCHS="1",
                       MAX_RESTARTS="0")
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert proc.returncode == 0, proc.stderr[-2000:] + log[-3000:]
    assert _workers(out)["workers"] == 2 and _workers(out)["epochs_run"] == 1


def test_a_task_killed_mid_run_ends_the_step_and_says_so(cluster, tmp_path):
    out = tmp_path / "run"
    log = tmp_path / "srun.log"
    command = [*MIRRORKIT, "train", "--epochs", "50", "--output", str(out)]
    with open(log, "w") as sink:
        srun = subprocess.Popen(["srun", "-n", "2", "--kill-on-bad-exit=1", *command],
                                env=cluster.env(), cwd=str(tmp_path), stdout=sink,
                                stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while "epoch 1/50" not in log.read_text():
                assert srun.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
            # The task with SLURM_PROCID=1, found through its environment.
            victim = next(pid for pid in _pids(" ".join(command))
                          if _environ(pid).get("SLURM_PROCID") == "1")
            os.kill(victim, signal.SIGKILL)
            code = srun.wait(timeout=120)
        finally:
            if srun.poll() is None:
                srun.kill()
    text = log.read_text()
    assert code != 0, text[-3000:]
    assert "task 1: Killed" in text, text[-3000:]
    assert not (out / "metrics.json").exists()


def _pids(pattern: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout
    return [int(p) for p in found.split()]


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0")
                if "=" in item)
