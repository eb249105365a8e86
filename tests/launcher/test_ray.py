"""``mirrorkit launch --ray`` on a real two-node Ray cluster, one node per network host.

One cluster for the module: ``ray start --head`` on host ``rayhead`` and
``ray start --address=...`` on host ``raynode`` (``tests/netns_hosts.py``:
network namespaces on a private bridge, each with its own address), one CPU
each, so Ray Train places one worker per node. The driver runs on
``rayhead``, as a user runs it on the head node; every node sees this
machine's files, as a shared filesystem. Ray's processes are the hosts'
processes, killed with them at the end. Root only; skipped with the reason
otherwise, and without Ray Train installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import REPO, clean_env
from netns_hosts import TestHosts, unavailable

try:
    import ray  # noqa: F401

    RAY_MISSING = None
except ImportError as err:
    RAY_MISSING = f"Ray Train is not installed ({err})"

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("netns-hosts"),
              pytest.mark.skipif(unavailable() is not None, reason=str(unavailable())),
              pytest.mark.skipif(RAY_MISSING is not None, reason=str(RAY_MISSING))]

RAY = str(Path(sys.executable).parent / "ray")
MIRRORKIT = [sys.executable, "-m", "mirrorkit"]
SCRIPT = str(REPO / "tests" / "fixtures" / "scripts" / "save_the_usual_way.py")
PORT = 6390
# Fast peer-loss detection for the killed worker's survivor; no usage reports.
ENV = {"MIRRORKIT_COLLECTIVE_TIMEOUT": "5", "RAY_USAGE_STATS_ENABLED": "0"}


def _env(**extra: str) -> dict[str, str]:
    """clean_env with ENV, and with pandas, which Ray Train imports."""
    return clean_env(optional_packages=True, **{**ENV, **extra})
TRAIN = ["mirrorkit", "train", "--per-replica-batch", "32"]


class Cluster:
    """The two hosts with a Ray node each; ``launch`` runs the driver on the head's host."""

    def __init__(self, hosts: TestHosts, address: str):
        self.hosts, self.address = hosts, address
        self.stopped = False

    def stop(self) -> None:
        """Stop both Ray nodes and remove the hosts (once; the fixture's end does it too)."""
        if not self.stopped:
            self.stopped = True
            self.hosts.__exit__(None, None, None)

    def launch(self, cwd: Path, *args: str, log: Path | None = None) -> subprocess.Popen:
        sink = open(log or cwd / "driver.log", "w")
        return self.hosts.popen("rayhead", [*MIRRORKIT, "launch", "--ray", self.address, *args],
                                cwd=str(cwd), env=_env(), stdout=sink,
                                stderr=subprocess.STDOUT, text=True)

    def run(self, cwd: Path, *args: str, timeout: float = 240) -> tuple[int, str]:
        log = cwd / "driver.log"
        proc = self.launch(cwd, *args, log=log)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise AssertionError(log.read_text()[-4000:]) from None
        return code, log.read_text()


@pytest.fixture(scope="module")
def cluster():
    # Ray's unix sockets live under --temp-dir: keep the path short (108 bytes at most).
    temp = tempfile.mkdtemp(prefix="mkray", dir="/tmp")
    hosts = TestHosts(["rayhead", "raynode"]).__enter__()
    handle = Cluster(hosts, "")
    try:
        head, node = hosts.addresses["rayhead"], hosts.addresses["raynode"]
        env = _env()
        common = ["--num-cpus=1", "--num-gpus=0", "--disable-usage-stats"]
        made = hosts.run("rayhead", [RAY, "start", "--head", f"--node-ip-address={head}",
                                     f"--port={PORT}", "--include-dashboard=false",
                                     f"--temp-dir={temp}", *common], env=env, timeout=120)
        assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
        made = hosts.run("raynode", [RAY, "start", f"--address={head}:{PORT}",
                                     f"--node-ip-address={node}", *common], env=env, timeout=120)
        assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
        handle.address = f"{head}:{PORT}"
        yield handle
    finally:
        handle.stop()
        subprocess.run(["rm", "-rf", temp], check=False)


@pytest.fixture(autouse=True)
def _cluster_gone_after_its_last_test(request):
    """Stop the cluster right after the module's last test that uses it.

    pytest ends a module fixture only when the next test of its worker comes
    from another module; under xdist a worker whose queue ran dry keeps the
    fixture until the session's end, and Ray's idle daemons would then share
    the cores with the timing tests that run alone at the end.
    """
    yield
    handle = request.node.funcargs.get("cluster")
    if handle is None:
        return
    items = request.session.items
    later = items[items.index(request.node) + 1:]
    if not any(i.module is request.node.module and "cluster" in i.fixturenames
               for i in later):
        handle.stop()


def is_train(pid: int) -> bool:
    """Process ``pid`` is a worker's ``mirrorkit train`` (not Ray's worker that runs it)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return False
    return any(a.endswith("/mirrorkit") for a in argv) and "train" in argv


def events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]


def epochs(out: Path) -> list[int]:
    return [e["epoch"] for e in events(out) if e["event"] == "epoch_end"]


def test_mirrorkit_train_on_two_ray_nodes_survives_a_killed_worker_like_a_local_launch(
        cluster, tmp_path):
    # One Ray job for both promises (each job costs Ray's start-up, ~3 TensorFlow loads):
    # training across the two nodes as a local launch does, and a worker killed after
    # epoch 1 restarting the group, which resumes from the backup with every epoch once.
    out = tmp_path / "ray"
    log = tmp_path / "driver.log"
    proc = cluster.launch(tmp_path, "-n", "2", "--max-restarts", "1",
                          "--storage", str(tmp_path / "storage"), "--", *TRAIN,
                          "--epochs", "2", "--output", str(out), log=log)
    # Ray's start-up alone is ~50 s on an idle 2-core machine, several times that in CI.
    deadline = time.monotonic() + 480
    # After epoch 1's backup, kill the worker program on the second node.
    while not ((out / "events.jsonl").is_file() and 1 in epochs(out)):
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    victims = [pid for pid in cluster.hosts.pids("raynode") if is_train(pid)]
    assert len(victims) == 1, victims
    os.kill(victims[0], signal.SIGKILL)
    code = proc.wait(480)
    text = log.read_text()
    assert code == 0, text[-5000:]
    head, node = (cluster.hosts.addresses[h] for h in ("rayhead", "raynode"))
    # One line on where the job runs, then each worker says where Ray placed it.
    assert f"2 worker(s) through Ray Train on the cluster at {cluster.address} (2 node(s)" in text
    placed = {line.split(" runs on node ")[1].split()[0] for line in text.splitlines()
              if " runs on node " in line}
    assert placed == {head, node}, text[-3000:]
    assert "[0] strategy  multi_worker, 2 replicas, 2 workers" in text
    # Ray numbers the workers: the victim is whichever rank it put on raynode first.
    rank = next(line.split()[2] for line in text.splitlines()
                if line.startswith("[launch] worker ") and f" runs on node {node} " in line)
    assert f"[launch] worker {rank} (pid {victims[0]}) was killed by SIGKILL on node {node}" in text
    assert "[launch] all 2 worker(s) succeeded" in text
    assert "(1 restarts)" in text and "(attempt 2)" in text
    assert "worker 0: " in text and "worker 1: " in text   # the per-worker summary
    assert epochs(out) == [1, 2], events(out)        # epoch 1 from the backup: each once
    assert [e["attempt"] for e in events(out) if e["event"] == "restart"] == [2]
    ray_metrics = json.loads((out / "metrics.json").read_text())
    assert ray_metrics["epochs_run"] == 1
    assert ray_metrics["weights_in_sync"] == {"workers": 2, "identical": True,
                                              "differing_workers": []}
    # Ray's own record: worker 0's final model and metrics as the run's checkpoint.
    kept = list((tmp_path / "storage").glob("mirrorkit-*/checkpoint_*/metrics.json"))
    assert len(kept) == 1 and (kept[0].parent / "model.keras").is_file()
    assert json.loads(kept[0].read_text())["val_accuracy"] == ray_metrics["val_accuracy"]
    # The same job launched on this machine: the same accuracy within noise.
    local = subprocess.run([*MIRRORKIT, "launch", "-n", "2", "--", *TRAIN, "--epochs", "2",
                            "--output", str(tmp_path / "local")], cwd=tmp_path,
                           env=_env(), capture_output=True, text=True, timeout=240)
    assert local.returncode == 0, local.stderr[-3000:]
    local_metrics = json.loads((tmp_path / "local" / "metrics.json").read_text())
    assert abs(ray_metrics["val_accuracy"] - local_metrics["val_accuracy"]) <= 0.03, (
        ray_metrics["val_accuracy"], local_metrics["val_accuracy"])


DRIVER = """
import json, sys
import ray
import mirrorkit

ray.init(address=sys.argv[1])
result = mirrorkit.ray_trainer(["mirrorkit", "run", sys.argv[2], "out", "--epochs", "1"],
                               num_workers=2).fit()
# Ray Train keeps a report's metrics with its checkpoint: a script reports none.
print("RESULT " + json.dumps({"error": None if result.error is None else str(result.error),
                              "metrics": result.metrics,
                              "driver_loaded_tensorflow": "tensorflow" in sys.modules}),
      flush=True)
"""


def test_an_unmodified_script_under_mirrorkit_run_from_a_driver_of_ones_own(cluster, tmp_path):
    # The Python API (mirrorkit.ray_trainer) as a Ray user calls it, on an unmodified
    # script: the CLI shares its trainer, and the first test covers the CLI's lines.
    (tmp_path / "driver.py").write_text(DRIVER)
    log = tmp_path / "driver.log"
    with open(log, "w") as sink:
        proc = cluster.hosts.popen("rayhead", [sys.executable, "driver.py", cluster.address,
                                               SCRIPT], cwd=str(tmp_path),
                                   env=_env(RAY_DEDUP_LOGS="0"), stdout=sink,
                                   stderr=subprocess.STDOUT, text=True)
        code = proc.wait(480)
    text = log.read_text()
    assert code == 0, text[-4000:]
    # Ray's log forwarding writes from another thread: its line can land between
    # the JSON and print's newline, so only the first JSON value is read.
    result, _ = json.JSONDecoder().raw_decode(next(
        line for line in text.splitlines() if line.startswith("RESULT "))[len("RESULT "):])
    # The driver only schedules the job: TensorFlow is loaded by the program each
    # worker runs, not by Ray's processes (mirrorkit.launcher.ray_backend).
    assert result == {"error": None, "metrics": None, "driver_loaded_tensorflow": False}, result
    # Both workers' lines reach the driver through Ray's log forwarding, each with its
    # rank ("... [1] final loss 2.0709 accuracy 0.4746"): one model, the same numbers.
    finals = {line.split("] final loss ")[0][-1]: line.split("] final loss ")[1].strip()
              for line in text.splitlines() if "] final loss " in line}
    assert sorted(finals) == ["0", "1"], text[-3000:]
    assert finals["0"] == finals["1"], finals
    out = tmp_path / "out"
    # Relative paths mean the driver's folder; only the chief's saves land there.
    assert (out / "final.keras").is_file() and (out / "final.weights.h5").is_file()
    assert [json.loads(line)["epoch"] for line in
            (out / "history-worker0.jsonl").read_text().splitlines()] == [1]


def test_without_ray_installed_ray_is_one_line_naming_the_extra(tmp_path):
    # A real import failure: a `ray` package on PYTHONPATH that cannot be imported.
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text(
        "raise ImportError('No module named ray')\n")
    proc = subprocess.run([*MIRRORKIT, "launch", "--ray", "-n", "2", "--", "mirrorkit",
                           "train"], env=clean_env(PYTHONPATH=str(tmp_path)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "Error: --ray needs Ray Train, which is not installed (No module named ray): "
        'pip install "mirrorkit[ray]"']
