"""Strategy selection: the pure decision, then real strategies in fresh processes."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import clean_env

from mirrorkit.distribute.cluster import build_tf_config, parse_tf_config
from mirrorkit.distribute.strategy import select

TWO_WORKERS = build_tf_config(["localhost:2222", "localhost:2223"], 1)


@pytest.mark.fast
def test_select_default_on_plain_cpu():
    sel = select("auto", gpus=0)
    assert (sel.kind, sel.replicas) == ("default", 1)
    assert "no GPU visible" in sel.reason


@pytest.mark.fast
def test_select_gpus():
    assert select("auto", gpus=2).reason == "2 GPUs visible"
    sel = select("auto", gpus=1)
    assert (sel.kind, sel.replicas, sel.reason) == ("mirrored", 1, "1 GPU visible")


@pytest.mark.fast
def test_select_simulated_cpus_and_ignored_with_gpus():
    sel = select("auto", gpus=0, simulate_cpus=4, simulate_source="MIRRORKIT_SIMULATE_CPUS")
    assert (sel.kind, sel.replicas) == ("mirrored", 4)
    assert sel.reason == "MIRRORKIT_SIMULATE_CPUS=4 on a CPU-only machine"
    sel = select("auto", gpus=2, simulate_cpus=4)
    assert sel.replicas == 2 and "ignored" in sel.reason


@pytest.mark.fast
def test_select_multi_worker_from_cluster():
    sel = select("auto", gpus=0, cluster=parse_tf_config(TWO_WORKERS))
    assert sel.kind == "multi_worker"
    assert sel.reason == "TF_CONFIG names 2 workers, this is worker 1"


@pytest.mark.fast
def test_single_worker_tf_config_trains_locally():
    sel = select("auto", gpus=0, cluster=parse_tf_config(build_tf_config(["a:1"], 0)))
    assert sel.kind == "default" and "single worker" in sel.reason


@pytest.mark.fast
def test_explicit_kinds_and_errors():
    assert select("mirrored", gpus=0).kind == "mirrored"
    assert select("default", gpus=2).kind == "default"
    with pytest.raises(ValueError, match="Received: strategy='tpu'; accepted: auto"):
        select("tpu", gpus=0)
    with pytest.raises(ValueError, match="simulate_cpus=0"):
        select("auto", gpus=0, simulate_cpus=0)
    ps = json.dumps({"cluster": {"worker": ["a:1"], "ps": ["b:2"]},
                     "task": {"type": "ps", "index": 0}})
    with pytest.raises(ValueError, match="parameter server"):
        select("auto", gpus=0, cluster=parse_tf_config(ps))


DESCRIBE = """
import json, mirrorkit
strategy = mirrorkit.get_strategy()
assert mirrorkit.get_strategy() is strategy  # created once per process
print(json.dumps(mirrorkit.describe().to_dict()))
"""


@pytest.mark.parametrize("n", [None, 2, 4])
def test_real_strategy_in_fresh_process(run_python, n):
    env = {"MIRRORKIT_SIMULATE_CPUS": str(n)} if n else {}
    rt = json.loads(run_python(DESCRIBE, env=env).stdout.strip().splitlines()[-1])
    if n is None:
        assert (rt["strategy"], rt["replicas"]) == ("default", 1)
    else:
        assert (rt["strategy"], rt["replicas"]) == ("mirrored", n)
        assert len(rt["devices"]) == n
        assert rt["reason"] == f"MIRRORKIT_SIMULATE_CPUS={n} on a CPU-only machine"
    assert rt["is_chief"] and rt["workers"] == 1


def test_multi_worker_is_chosen_from_env_without_starting_cluster(run_python):
    code = """
    from mirrorkit.distribute.strategy import resolve
    sel = resolve()
    print(sel.kind, '|', sel.reason)
    """
    out = run_python(code, env={"TF_CONFIG": TWO_WORKERS}).stdout.strip()
    assert out == "multi_worker | TF_CONFIG names 2 workers, this is worker 1"


def test_too_late_to_split_devices_is_a_clear_error(run_python):
    code = """
    import tensorflow as tf
    tf.constant(1.0) + 1  # initialises the runtime with one CPU device
    import mirrorkit
    try:
        mirrorkit.get_strategy(simulate_cpus=2)
    except RuntimeError as err:
        print("ERR", err)
    """
    out = run_python(code).stdout
    assert "ERR Cannot split the CPU into 2 logical devices" in out
    assert "before any other TensorFlow op" in out


THREADS = """
import json, os, sys
import tensorflow as tf
if sys.argv[1:] == ["user"]:
    tf.config.threading.set_intra_op_parallelism_threads(3)
import mirrorkit
from mirrorkit.distribute.devices import usable_cores
mirrorkit.get_strategy(simulate_cpus=int(os.environ.get("N", "2")))
threads = [tf.config.threading.get_intra_op_parallelism_threads(), usable_cores()]
try:   # a second, different strategy in the same process
    mirrorkit.get_strategy("default")
    refused = None
except RuntimeError as err:
    refused = str(err)
print(json.dumps(threads + [refused]))
"""
THREAD_CASES = ("two", "four", "user-call", "user-env")


def _threads_run(script, case):
    env = {"N": "4" if case == "four" else "2"}
    if case == "user-env":
        env["TF_NUM_INTRAOP_THREADS"] = "2"
    args = ["user"] if case == "user-call" else []
    proc = subprocess.run([sys.executable, str(script), *args], env=clean_env(**env),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def threads_runs(tmp_path_factory):
    """{case: [intra-op threads, usable cores, a 2nd strategy's refusal]}, a process each."""
    script = tmp_path_factory.mktemp("threads") / "threads.py"
    script.write_text(THREADS)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(THREAD_CASES, pool.map(lambda case: _threads_run(script, case),
                                               THREAD_CASES)))


def test_switching_strategy_in_one_process_is_refused(threads_runs):
    # The "two" run: get_strategy(simulate_cpus=2), then get_strategy("default").
    refused = threads_runs["two"][2]
    assert (refused or "").startswith("This process already created a 'mirrored' strategy"), refused


@pytest.mark.parametrize("case", THREAD_CASES)
def test_simulated_replicas_share_the_cores_unless_the_user_chose(case, threads_runs):
    threads, cores, _ = threads_runs[case]
    want = {"two": max(1, cores // 2), "four": max(1, cores // 4),
            "user-call": 3, "user-env": 0}[case]   # 0: TF's default, i.e. its env var rules
    assert threads == want
