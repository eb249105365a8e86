"""Clusters beyond one launcher: Slurm steps and Kubeflow TFJobs.

Slurm: node-list and tasks-per-node expansion, the derived TF_CONFIG for
every task of constructed steps, selection through ``get_strategy``'s
environment, ``mirrorkit info``, and two real processes with a fake Slurm
environment that train together. Kubernetes: a TFJob-style TF_CONFIG (chief +
workers) gives the right chief, and a chief + worker pair trains for real.
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
from conftest import REPO, clean_env, consecutive_free_ports, free_ports

from mirrorkit import _env
from mirrorkit.distribute import slurm
from mirrorkit.distribute.cluster import parse_tf_config
from mirrorkit.distribute.strategy import _cluster_from_env, select

TRAIN = str(REPO / "tests" / "fixtures" / "launch_train.py")


def step_env(procid: int, *, nodelist="localhost", per_node="2", ntasks=2, nodeid=0,
             localid=None, **extra: str) -> dict[str, str]:
    """The variables ``srun`` sets for one task (block distribution by default)."""
    env = {"SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": per_node,
           "SLURM_STEP_NUM_TASKS": str(ntasks), "SLURM_PROCID": str(procid),
           "SLURM_NODEID": str(nodeid),
           "SLURM_LOCALID": str(procid if localid is None else localid),
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": nodelist, "SLURM_NTASKS": str(ntasks)}
    env.update(extra)
    return env


# --- pure expansion ---------------------------------------------------------

@pytest.mark.fast
@pytest.mark.parametrize("text, hosts", [
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("n1", ["n1"]),
    ("a,b", ["a", "b"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("gpu[3]a,cpu[1,4]", ["gpu3a", "cpu1", "cpu4"]),
])
def test_expand_nodelist(text, hosts):
    assert slurm.expand_nodelist(text) == hosts


@pytest.mark.fast
@pytest.mark.parametrize("text, message", [
    ("", "empty entry"), ("n[1-", "unbalanced"), ("n1]", "unbalanced"),
    ("n[3-1]", "decreasing range '3-1'"), ("n[a-b]", "bad range 'a-b'"),
    ("a,,b", "empty entry"), ("n[[1]]", "unbalanced"),
])
def test_expand_nodelist_errors_name_the_list(text, message):
    with pytest.raises(ValueError) as err:
        slurm.expand_nodelist(text)
    assert message in str(err.value) and f"nodelist={text!r}" in str(err.value)


@pytest.mark.fast
def test_expand_tasks_per_node():
    assert slurm.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert slurm.expand_tasks_per_node("4") == [4]
    for bad in ("", "0", "2(x0)", "x", "2(3)", "1,,2"):
        with pytest.raises(ValueError, match="like '2\\(x3\\),1'"):
            slurm.expand_tasks_per_node(bad)


@pytest.mark.fast
def test_default_port_base_is_per_job_and_below_ephemeral_ports():
    bases = {slurm.default_port_base(str(j)) for j in range(1000, 3500)}
    assert len(bases) == 2500 and min(bases) >= 12000 and max(bases) + 7 < 32768
    assert slurm.default_port_base(None) == slurm.default_port_base("abc") == 8888


# --- the derived cluster ------------------------------------------------------

@pytest.mark.fast
def test_not_a_step_means_no_cluster():
    # An sbatch script has SLURM_NTASKS and SLURM_PROCID=0 but runs one process.
    batch = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_NTASKS": "4", "SLURM_PROCID": "0",
             "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}
    assert slurm.from_env(batch) is None and slurm.from_env({}) is None


@pytest.mark.fast
def test_two_tasks_on_one_host():
    tasks = [slurm.from_env(step_env(i), port_base=7000) for i in (0, 1)]
    assert [t.cluster.to_dict() for t in tasks] == [
        {"cluster": {"worker": ["localhost:7000", "localhost:7001"]},
         "task": {"type": "worker", "index": i}} for i in (0, 1)]
    assert [t.cluster.is_chief for t in tasks] == [True, False]
    assert tasks[1].environ() == {"TF_CONFIG": tasks[1].cluster.to_json()}


@pytest.mark.fast
def test_every_task_of_a_multi_node_step_agrees_and_owns_its_address():
    # 3 nodes with 2, 2, 1 tasks; cyclic distribution: SLURM_PROCID is not the index.
    layout = [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]  # procid -> (node, local)
    tasks = [slurm.from_env(step_env(p, nodelist="gpu[07-09]", per_node="2(x2),1",
                                     ntasks=5, nodeid=n, localid=loc))
             for p, (n, loc) in enumerate(layout)]
    base = slurm.default_port_base("4242")
    expected = [f"gpu07:{base}", f"gpu07:{base + 1}", f"gpu08:{base}", f"gpu08:{base + 1}",
                f"gpu09:{base}"]
    assert all(list(t.cluster.cluster["worker"]) == expected for t in tasks)
    for task, (node, local) in zip(tasks, layout):
        assert task.address == f"gpu{7 + node:02d}:{base + local}"
    assert sorted(t.cluster.task_index for t in tasks) == [0, 1, 2, 3, 4]
    assert [t.cluster.is_chief for t in tasks] == [True, False, False, False, False]


@pytest.mark.fast
def test_node_name_beats_node_id():
    # A step on nodes 3-4 of a bigger job, with a job-relative SLURM_NODEID.
    env = step_env(1, nodelist="n[3-4]", per_node="1(x2)", nodeid=3, localid=0,
                   SLURMD_NODENAME="n4")
    assert slurm.from_env(env, port_base=7000).cluster.task_index == 1
    with pytest.raises(ValueError, match="SLURM_NODEID=3 is outside"):
        slurm.from_env({**env, "SLURMD_NODENAME": "elsewhere"})


@pytest.mark.fast
def test_job_level_fallbacks():
    env = {"SLURM_STEP_NUM_TASKS": "4", "SLURM_JOB_NODELIST": "a,b", "SLURM_PROCID": "3",
           "SLURM_NODEID": "1", "SLURM_LOCALID": "1"}
    task = slurm.from_env(env, port_base=100)
    assert task.cluster.task_index == 3 and task.address == "b:101"


@pytest.mark.fast
@pytest.mark.parametrize("change, message", [
    ({"SLURM_STEP_NUM_TASKS": "3"}, "SLURM_STEP_NUM_TASKS=3 task(s) but the per-node"),
    ({"SLURM_LOCALID": "2"}, "SLURM_LOCALID=2 is out of range for 2 task(s)"),
    ({"SLURM_LOCALID": "x"}, "Received: SLURM_LOCALID='x'"),
    ({"SLURM_STEP_TASKS_PER_NODE": "1(x2)"}, "1 node(s) (localhost) but task counts for 2"),
    ({"SLURM_STEP_NODELIST": "n[2-1]"}, "decreasing range"),
])
def test_inconsistent_step_is_a_clear_error(change, message):
    with pytest.raises(ValueError) as err:
        slurm.from_env({**step_env(1), **change})
    assert message in str(err.value)
    missing = step_env(1)
    del missing["SLURM_LOCALID"]
    with pytest.raises(ValueError, match="SLURM_LOCALID is missing"):
        slurm.from_env(missing)


@pytest.mark.fast
def test_gpu_slices_per_local_task():
    def devices(local, visible=None):
        env = step_env(local, per_node="4", ntasks=4)
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        return slurm.from_env(env, gpus_per_task=2).cuda_visible_devices

    assert [devices(i) for i in range(4)] == ["0,1", "2,3", "4,5", "6,7"]
    assert devices(1, "0,1,2,3") == "2,3"
    assert devices(3, "6,7") == "6,7"  # already bound by --gpus-per-task: kept
    with pytest.raises(ValueError, match="lists 4"):
        devices(2, "0,1,2,3")
    assert slurm.from_env(step_env(1)).cuda_visible_devices is None


# --- through mirrorkit's environment ---------------------------------------

def _patched(values: dict[str, str]):
    # Remove every SLURM/TF variable first, set the given ones, restore afterwards.
    names = {k: None for k in os.environ if k.startswith(("SLURM_", "SLURMD_"))}
    names.update({k: None for k in ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", _env.SLURM_DERIVED,
                                    _env.SLURM_PORT, _env.SLURM_ENABLE,
                                    _env.SLURM_GPUS_PER_TASK)})
    names.update(values)
    return _env.patch(names)


@pytest.mark.fast
def test_strategy_uses_the_slurm_step_and_exports_tf_config():
    with _patched({**step_env(1), _env.SLURM_PORT: "7100", _env.SLURM_GPUS_PER_TASK: "1"}):
        cluster, source = _cluster_from_env()
        assert (source, cluster.task_index, cluster.num_workers) == ("slurm", 1, 2)
        assert parse_tf_config(_env.tf_config_text()) == cluster
        assert _env.cuda_visible_devices() == "1"
        assert _cluster_from_env() == (cluster, "slurm")  # read back: still Slurm's
        sel = select("auto", gpus=0, cluster=cluster, cluster_source=source)
        assert sel.kind == "multi_worker" and sel.reason.startswith("the Slurm step names 2 workers")
    assert _env.tf_config_text() is None or "7100" not in _env.tf_config_text()


@pytest.mark.fast
def test_tf_config_wins_and_slurm_can_be_switched_off():
    explicit = json.dumps({"cluster": {"worker": ["h:1", "h:2"]},
                           "task": {"type": "worker", "index": 0}})
    with _patched({**step_env(1), "TF_CONFIG": explicit}):
        assert _cluster_from_env()[1] == "TF_CONFIG"
    with _patched({**step_env(1), _env.SLURM_ENABLE: "0"}):
        assert _cluster_from_env() == (None, "TF_CONFIG")
    with _patched(step_env(0, per_node="1", ntasks=1)):  # one task: nothing to form
        assert _cluster_from_env() == (None, "TF_CONFIG")


@pytest.mark.slow
def test_info_shows_slurm():
    env = {**step_env(1), _env.SLURM_PORT: "7200"}
    proc = subprocess.run([sys.executable, "-m", "mirrorkit", "info", "--json"],
                          capture_output=True, text=True, env=clean_env(**env), timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["cluster_source"], data["task"], data["workers"]) == ("slurm", "worker:1", 2)
    assert data["cluster"] == {"worker": ["localhost:7200", "localhost:7201"]}
    assert data["slurm"] == ("node localhost (1 of 1), local task 1 of 2, SLURM_PROCID 1, "
                             "ports from 7200")


# --- real processes ---------------------------------------------------------

def run_processes(envs: list[dict[str, str]], args: list[str], tmp_path: Path,
                  timeout: float = 180) -> list[tuple[int, str]]:
    """Run ``launch_train.py`` once per env; output to files; always reaped."""
    procs, logs = [], []
    try:
        for i, env in enumerate(envs):
            log = open(tmp_path / f"proc{i}.log", "wb")
            logs.append(log)
            procs.append(subprocess.Popen([sys.executable, TRAIN, *args], env=clean_env(**env),
                                          stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
                                          start_new_session=True))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        for log in logs:
            log.close()
    return [(p.returncode, (tmp_path / f"proc{i}.log").read_text(errors="replace"))
            for i, p in enumerate(procs)]


@pytest.mark.slow
def test_two_fake_slurm_tasks_train_together(tmp_path):
    port = str(consecutive_free_ports(2))
    envs = [{**step_env(i), _env.SLURM_PORT: port} for i in (0, 1)]
    results = run_processes(envs, [str(tmp_path / "run"), "--epochs", "2"], tmp_path)
    assert [r[0] for r in results] == [0, 0], "\n".join(r[1][-3000:] for r in results)
    runtimes = [json.loads((tmp_path / "run" / f"runtime-{i}.json").read_text()) for i in (0, 1)]
    assert [(r["strategy"], r["cluster_source"], r["workers"], r["is_chief"])
            for r in runtimes] == [("multi_worker", "slurm", 2, True),
                                   ("multi_worker", "slurm", 2, False)]
    assert "DONE rank 1 replicas 2" in results[1][1]
    # Both saw the same all-reduced loss: they really trained as one.
    losses = [(tmp_path / "run" / f"history-{i}.jsonl").read_text() for i in (0, 1)]
    assert losses[0] == losses[1]


def test_sbatch_example_is_valid_bash_and_runs_one_srun_step_per_attempt():
    path = REPO / "apps" / "slurm" / "train.sbatch"
    subprocess.run(["bash", "-n", str(path)], check=True, timeout=30)
    text = path.read_text()
    assert text.startswith("#!/bin/bash\n") and "#SBATCH --ntasks-per-node=4" in text
    assert "MIRRORKIT_RESTART_COUNT=$attempt srun --kill-on-bad-exit=1" in text
    assert 'mirrorkit train --epochs "$EPOCHS" --output "$RUN_DIR" $RESUME' in text
    assert "EPOCHS=${EPOCHS:-30}" in text and "export MIRRORKIT_SLURM_GPUS_PER_TASK=1" in text


# --- Kubernetes (Kubeflow TFJob) ----------------------------------------------

TFJOB = {"chief": ["mnist-chief-0.ns.svc:2222"],
         "worker": ["mnist-worker-0.ns.svc:2222", "mnist-worker-1.ns.svc:2222"]}


@pytest.mark.fast
@pytest.mark.parametrize("task, chief, rank", [
    ({"type": "chief", "index": 0}, True, 0),
    ({"type": "worker", "index": 0}, False, 1),
    ({"type": "worker", "index": 1}, False, 2),
])
def test_tfjob_tf_config_chief_detection(task, chief, rank):
    spec = parse_tf_config({"cluster": TFJOB, "task": task})
    assert (spec.is_chief, spec.rank, spec.num_workers) == (chief, rank, 3)
    sel = select("auto", gpus=0, cluster=spec)
    assert sel.kind == "multi_worker"
    assert sel.reason == f"TF_CONFIG names 3 workers, this is {task['type']} {task['index']}"


@pytest.mark.fast
def test_tfjob_manifest_runs_mirrorkit_train_as_chief_and_workers():
    text = (REPO / "apps" / "k8s" / "tfjob.yaml").read_text()
    assert "kind: TFJob" in text and "apiVersion: kubeflow.org/v1" in text
    assert "    Chief:\n" in text and "    Worker:\n" in text
    assert text.count("exec mirrorkit train --epochs=30") == 2
    assert "replicas: 1" in text and "replicas: 2" in text
    assert text.count("restartPolicy: OnFailure") == 2 and "name: tensorflow" in text


@pytest.mark.slow
def test_tfjob_style_chief_and_worker_train_together(tmp_path):
    a, b = free_ports(2)
    cluster = {"chief": [f"localhost:{a}"], "worker": [f"localhost:{b}"]}
    envs = [{"TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}
            for task in ({"type": "chief", "index": 0}, {"type": "worker", "index": 0})]
    results = run_processes(envs, [str(tmp_path / "run"), "--epochs", "1"], tmp_path)
    assert [r[0] for r in results] == [0, 0], "\n".join(r[1][-3000:] for r in results)
    runtimes = [json.loads((tmp_path / "run" / f"runtime-{i}.json").read_text()) for i in (0, 1)]
    assert [(r["task"], r["is_chief"], r["workers"]) for r in runtimes] == [
        ("chief:0", True, 2), ("worker:0", False, 2)]
    assert (tmp_path / "run" / "model.keras").exists()
