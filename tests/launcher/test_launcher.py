"""``mirrorkit launch``: spec checks, then real launcher processes with real workers.

Process-level behaviour (ports, prefixes, restarts, signals, no orphans) runs
the TensorFlow-free ``fixtures/launch_echo.py`` worker, so each case takes a
fraction of a second; two cases train a real Keras model on 2 workers, one of
them with a worker SIGKILLed mid-training. Every launcher runs in its own
session with a deadline, and teardown kills whatever a test left behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO, clean_env, consecutive_free_ports, free_ports

from mirrorkit.cli import cli
from mirrorkit.distribute.devices import usable_cores
from mirrorkit.launcher import (
    LaunchSpec,
    RunResult,
    WorkerState,
    launch,
    visible_devices,
)
from mirrorkit.launcher.hosts import is_local_address

FIXTURES = REPO / "tests" / "fixtures"
# Documentation addresses (RFC 5737); a machine may still own one of them.
FOREIGN = next(a for a in ("203.0.113.77", "198.51.100.77", "192.0.2.77")
               if not is_local_address(a))
ECHO = str(FIXTURES / "launch_echo.py")
TRAIN = str(FIXTURES / "launch_train.py")
APP = REPO / "apps" / "multi_worker.py"
MAIN = [sys.executable, "-c", "from mirrorkit.cli import main; main()"]


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (psutil-free /proc check)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def records(outdir: Path) -> dict[int, dict]:
    return {int(p.stem): json.loads(p.read_text()) for p in outdir.glob("*.json")}


class Launcher:
    """A ``mirrorkit launch`` process in its own session, always reaped."""

    def __init__(self, args: list[str], *, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.proc = subprocess.Popen([*MAIN, "launch", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     env=clean_env(**(env or {})), cwd=cwd,
                                     start_new_session=True)

    def wait(self, timeout: float) -> tuple[int, str, str]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"launcher still running after {timeout}s\n{out}\n{err}")
        return self.proc.returncode, out, err

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def start(tmp_path):
    """Start launchers; at teardown kill them and every worker pid they recorded."""
    started: list[Launcher] = []

    def _start(args: list[str], **kwargs) -> Launcher:
        launcher = Launcher(args, cwd=tmp_path, **kwargs)
        started.append(launcher)
        return launcher

    yield _start
    for launcher in started:
        launcher.kill()
        try:
            launcher.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
    for record in tmp_path.rglob("*.json"):
        try:
            pid = json.loads(record.read_text()).get("pid")
        except (ValueError, AttributeError):
            continue
        if pid and alive(pid):
            os.kill(pid, signal.SIGKILL)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


# --- the spec: pure checks -------------------------------------------------

@pytest.mark.fast
@pytest.mark.parametrize("kwargs, message", [
    ({"nproc": 0}, "`nproc` (-n) must be a positive integer"),
    ({"nproc": True}, "Received: nproc=True"),
    ({"command": ()}, "`command` must name the program"),
    ({"max_restarts": -1}, "Received: max_restarts=-1"),
    ({"port": 65535}, "room for 2 consecutive ports"),
    ({"gpus_per_worker": 0}, "Received: gpus_per_worker=0"),
    ({"grace_period": -1.0}, "Received: grace_period=-1.0"),
    ({"node_rank": 1}, "`node_rank` needs `hosts`"),
    ({"hosts": ("a", "b"), "node_rank": 2, "port": 9}, "below the number of hosts (2)"),
    ({"hosts": ("a", "b")}, "has no port and `port` (--port) is unset"),
    ({"hosts": ("a:1", "a:2")}, "same address twice"),
])
def test_spec_rejects_bad_fields(kwargs, message):
    fields = {"command": ("python", "t.py"), "nproc": 2, **kwargs}
    with pytest.raises(ValueError) as err:
        LaunchSpec(**fields)
    assert message in str(err.value)


@pytest.mark.fast
def test_spec_multi_node_addresses_and_ranks():
    spec = LaunchSpec(command=("x",), nproc=2, hosts=("n1", "n2:7000"), node_rank=1,
                      port=6000)
    assert spec.node_addresses() == ["n1:6000", "n1:6001", "n2:7000", "n2:7001"]
    assert (spec.world_size, spec.local_ranks, spec.fixed_ports()) == (4, (2, 3), [7000, 7001])
    assert LaunchSpec(command=("x",), nproc=2).fixed_ports() is None


@pytest.mark.fast
def test_visible_devices_are_disjoint_slices():
    assert [visible_devices(j, 2) for j in range(3)] == ["0,1", "2,3", "4,5"]
    assert visible_devices(1, 1, "4, 6") == "6"
    with pytest.raises(ValueError, match="needs GPUs 2..3 .* lists 3"):
        visible_devices(1, 2, "0,1,2")


@pytest.mark.fast
def test_progress_bar_redraws_collapse_to_the_final_bar():
    from mirrorkit.launcher import final_text as _final_text

    keras_epoch = "1/8 ━━ 9s\b\b\b\b\r2/8 ━━━━ 1s\b\b\r8/8 ━━━━━━━━ 1s - loss: 2.30\n"
    assert _final_text(keras_epoch) == "8/8 ━━━━━━━━ 1s - loss: 2.30"
    assert _final_text("plain\r\n") == "plain" and _final_text("\n") == ""


@pytest.mark.fast
def test_result_summary_names_root_cause():
    from mirrorkit.launcher import WorkerFailure

    failure = WorkerFailure(rank=1, pid=7, returncode=-9, restart=1, tail=("a", "b"))
    result = RunResult(WorkerState.FAILED, failure.exit_code, 1,
                       (WorkerFailure(1, 5, 2, 0, ()), failure), {}, None, 3.0)
    text = result.summary()
    assert result.exit_code == 137 and result.root_cause is failure
    assert "Root cause: worker 1 (pid 7) was killed by SIGKILL" in text
    assert "Earlier: attempt 1: worker 1 (pid 5) exited with code 2." in text
    assert text.endswith("Last 2 output line(s) of worker 1:\n  a\n  b")


# --- the command: bad input is one line -----------------------------------

@pytest.mark.fast
@pytest.mark.parametrize("args, message", [
    (["-n", "0", "--", "python", "t.py"], "Error: `nproc` (-n) must be a positive integer"),
    (["--", "python", "t.py"], "Error: Missing -n/--nproc"),
    (["-n", "2"], "Error: Missing the command to run"),
    (["-n", "2", "--max-restarts", "-1", "--", "python"], "Error: `max_restarts` must be"),
    (["-n", "2", "--", "no-such-program-xyz"], "Error: Command not found: 'no-such-program-xyz'"),
    # Multi-node hosts are checked before any worker starts (no join timeout).
    (["-n", "1", "--hosts", "localhost:7000,no-such-host.invalid:7000", "--", "python", "t.py"],
     "Error: Host 'no-such-host.invalid' does not resolve"),
    # An address none of this machine's interfaces has (picked below).
    (["-n", "1", "--hosts", f"localhost:7000,{FOREIGN}:7000", "--node-rank", "1", "--",
      "python", "t.py"], f"Error: --node-rank 1 names '{FOREIGN}' ({FOREIGN}), which is not "
     "an address of this machine"),
])
def test_bad_input_is_one_clear_line(args, message):
    result = CliRunner().invoke(cli, ["launch", *args], env={"MIRRORKIT_LAUNCH_NPROC": None})
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1, result.output
    assert len(lines) == 1 and lines[0].startswith(message), result.output
    assert "Traceback" not in result.output


# --- real launcher processes, TensorFlow-free workers -----------------------

@pytest.mark.parametrize("n", [2, 3])
def test_each_worker_gets_a_consistent_tf_config(start, tmp_path, n):
    out = tmp_path / "out"
    code, stdout, stderr = start(["-n", str(n), "--", "python", ECHO, str(out)]).wait(60)
    assert code == 0, stderr
    got = records(out)
    assert set(got) == set(range(n))
    clusters = {json.dumps(r["tf_config"]["cluster"], sort_keys=True) for r in got.values()}
    assert len(clusters) == 1
    workers = got[0]["tf_config"]["cluster"]["worker"]
    assert len(set(workers)) == n and all(w.startswith("localhost:") for w in workers)
    assert [got[i]["tf_config"]["task"] for i in range(n)] == [
        {"type": "worker", "index": i} for i in range(n)]
    from mirrorkit.distribute.cluster import parse_tf_config
    chiefs = [i for i in range(n) if parse_tf_config(got[i]["tf_config"]).is_chief]
    assert chiefs == [0]
    assert all(r["restart"] == 0 and r["unbuffered"] == "1" for r in got.values())
    # n workers share this machine's cores: cores // n intra-op threads each.
    assert {r["intra_op_threads"] for r in got.values()} == {str(max(1, usable_cores() // n))}
    assert "intra-op thread(s) (TF_NUM_INTRAOP_THREADS=" in stderr
    for i in range(n):
        assert f"[{i}] hello from worker {i} restart 0" in stdout.splitlines()
        assert f"[{i}] stderr of worker {i}" in stderr.splitlines()
    assert "all %d worker(s) succeeded" % n in stderr


def test_launcher_never_imports_tensorflow(tmp_path):
    code = ("import sys, io\n"
            "import mirrorkit.commands.launch\n"
            "from mirrorkit.launcher import LaunchSpec, launch\n"
            f"r = launch(LaunchSpec(command=('python', {ECHO!r}, {str(tmp_path)!r}), nproc=2),"
            " stdout=io.StringIO(), stderr=io.StringIO())\n"
            "print(r.exit_code, 'tensorflow' in sys.modules, 'keras' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=clean_env(), timeout=60)
    assert proc.stdout.strip() == "0 False False", proc.stderr


def test_gpus_per_worker_gives_disjoint_slices(tmp_path):
    spec = LaunchSpec(command=("python", ECHO, str(tmp_path)), nproc=2, gpus_per_worker=2,
                      env={"CUDA_VISIBLE_DEVICES": "3,4,5,6", "TF_NUM_INTRAOP_THREADS": "5"})
    import io
    result = launch(spec, stdout=io.StringIO(), stderr=io.StringIO())
    assert result.state is WorkerState.SUCCEEDED
    assert {i: r["cuda"] for i, r in records(tmp_path).items()} == {0: "3,4", 1: "5,6"}
    # A thread count the user chose is passed through untouched.
    assert {r["intra_op_threads"] for r in records(tmp_path).values()} == {"5"}
    with pytest.raises(ValueError, match="lists 4"):
        launch(LaunchSpec(command=("python", ECHO, str(tmp_path)), nproc=3, gpus_per_worker=2,
                          env={"CUDA_VISIBLE_DEVICES": "3,4,5,6"}),
               stdout=io.StringIO(), stderr=io.StringIO())


def test_failed_worker_restarts_whole_group_with_count_and_logs(start, tmp_path):
    out, logs = tmp_path / "out", tmp_path / "logs"
    code, stdout, stderr = start([
        "-n", "2", "--max-restarts", "2", "--log-dir", str(logs), "--",
        "python", ECHO, str(out), "--fail-rank", "1", "--fail-times", "1"]).wait(60)
    assert code == 0, stderr
    assert {i: r["restart"] for i, r in records(out).items()} == {0: 1, 1: 1}
    assert "[1] hello from worker 1 restart 0" in stdout
    assert "[1] hello from worker 1 restart 1" in stdout
    # One job name for every worker and attempt (mirrorkit train's default folder).
    run_ids = {line.split("run id ", 1)[1] for line in stdout.splitlines() if "run id " in line}
    assert len(run_ids) == 1 and run_ids != {"None"}
    assert "worker 1 (pid" in stderr and "exited with code 3" in stderr
    assert "restarting the whole group (restart 1 of 2)" in stderr
    assert "all 2 worker(s) succeeded" in stderr and "(1 restarts)" in stderr
    log = (logs / "worker-1.log").read_text().splitlines()
    markers = [line for line in log if line.startswith("===== mirrorkit launch: attempt")]
    assert len(markers) == 2 and "attempt 2 (restart 1)" in markers[1]
    assert "hello from worker 1 restart 0" in log and "worker 1 failing on purpose" in log
    assert (logs / "worker-0.log").exists()


def test_out_of_restarts_summary_names_worker_code_and_tail(start, tmp_path):
    logs = tmp_path / "logs"
    # Worker 1 fails once its launcher has logged its stdout lines (so has them in
    # its tail), not a fixed time after printing them: the launcher reads stdout and
    # stderr in two threads, which a busy machine can run in either order.
    code, stdout, stderr = start([
        "-n", "2", "--max-restarts", "1", "--log-dir", str(logs), "--", "python", ECHO,
        str(tmp_path / "out"), "--fail-rank", "1", "--exit-code", "7", "--lines", "20",
        "--after-logged", str(logs / "worker-1.log")]).wait(60)
    assert code == 7
    assert "FAILED after 1 restart(s)" in stderr
    assert "Root cause: worker 1 (pid" in stderr and "exited with code 7" in stderr
    assert "the first worker to fail in attempt 2" in stderr
    tail = stderr.split("Last 10 output line(s) of worker 1:\n", 1)[1].splitlines()
    # stdout and stderr interleave by arrival; the failure message is among the last 10.
    assert "  worker 1 failing on purpose" in tail and len(tail) == 10


def test_signal_death_is_named_in_summary(start, tmp_path):
    script = tmp_path / "die.py"
    script.write_text("import os, signal, json, sys\n"
                      "if json.loads(os.environ['TF_CONFIG'])['task']['index'] == 1:\n"
                      "    print('about to die', flush=True); os.kill(os.getpid(), signal.SIGKILL)\n"
                      "import time; time.sleep(60)\n")
    t0 = time.monotonic()
    code, _, stderr = start(["-n", "2", "--grace-period", "1", "--", "python",
                             str(script)]).wait(60)
    assert code == 128 + signal.SIGKILL
    assert "Root cause: worker 1" in stderr and "was killed by SIGKILL" in stderr
    assert "  about to die" in stderr
    assert time.monotonic() - t0 < 20  # worker 0 was stopped, not waited for


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_the_launcher_stops_every_worker(start, tmp_path, sig, code):
    out = tmp_path / "out"
    launcher = start(["-n", "2", "--grace-period", "2", "--", "python", ECHO, str(out),
                      "--sleep", "120"])
    wait_for(lambda: len(records(out)) == 2, 30, "both workers to start")
    pids = [r["pid"] for r in records(out).values()]
    t0 = time.monotonic()
    os.kill(launcher.proc.pid, sig)
    rc, _, stderr = launcher.wait(30)
    assert rc == code, stderr
    assert time.monotonic() - t0 < 10
    assert not [p for p in pids if alive(p)]
    assert f"received {signal.Signals(sig).name}" in stderr


def test_stubborn_worker_is_killed_after_grace_period(start, tmp_path):
    out = tmp_path / "out"
    launcher = start(["-n", "2", "--grace-period", "1", "--", "python", ECHO, str(out),
                      "--sleep", "120", "--ignore-sigterm"])
    wait_for(lambda: len(records(out)) == 2, 30, "both workers to start")
    pids = [r["pid"] for r in records(out).values()]
    t0 = time.monotonic()
    os.kill(launcher.proc.pid, signal.SIGINT)
    rc, _, _ = launcher.wait(30)
    assert rc == 130 and 0.9 < time.monotonic() - t0 < 10
    assert not [p for p in pids if alive(p)]


def test_a_workers_own_children_do_not_outlive_it(start, tmp_path):
    out = tmp_path / "out"
    code, _, stderr = start(["-n", "2", "--", "python", ECHO, str(out), "--child"]).wait(60)
    assert code == 0, stderr
    children = [r["child"] for r in records(out).values()]
    assert len(children) == 2
    wait_for(lambda: not [p for p in children if alive(p)], 10, "grandchildren to die")


def test_workers_die_with_a_sigkilled_launcher(start, tmp_path):
    out = tmp_path / "out"
    launcher = start(["-n", "2", "--", "python", ECHO, str(out), "--sleep", "120"])
    wait_for(lambda: len(records(out)) == 2, 30, "both workers to start")
    pids = [r["pid"] for r in records(out).values()]
    os.kill(launcher.proc.pid, signal.SIGKILL)
    launcher.wait(30)
    wait_for(lambda: not [p for p in pids if alive(p)], 10, "orphaned workers to die")
    assert len(pids) == 2 and not [p for p in pids if alive(p)]


def test_fixed_port_is_used_and_a_busy_one_is_an_error(start, tmp_path):
    base = consecutive_free_ports(2)
    code, _, stderr = start(["-n", "2", "--port", str(base), "--", "python", ECHO,
                             str(tmp_path / "a")]).wait(60)
    assert code == 0, stderr
    assert records(tmp_path / "a")[0]["tf_config"]["cluster"]["worker"] == [
        f"localhost:{base}", f"localhost:{base + 1}"]
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base + 1))
        busy.listen()
        t0 = time.monotonic()
        code, _, stderr = start(["-n", "2", "--port", str(base), "--", "python", ECHO,
                                 str(tmp_path / "b")]).wait(30)
    assert code == 1 and time.monotonic() - t0 < 10
    assert stderr.strip().splitlines() == [
        f"Error: Port {base + 1} is already in use on this machine (Address already in use); "
        f"workers here need ports {base}..{base + 1}. Choose another base port, or leave it "
        "unset (no --port) to pick free ports."]
    assert not (tmp_path / "b").exists()


def test_multi_node_by_hand_two_launchers_form_one_cluster(start, tmp_path):
    # Two "nodes" on one machine: each hosts entry carries that node's first port.
    p0, p1 = free_ports(2)
    hosts = f"localhost:{p0},localhost:{p1}"
    out = tmp_path / "out"
    launchers = [start(["-n", "2", "--hosts", hosts, "--node-rank", str(r), "--", "python",
                        ECHO, str(out)]) for r in (0, 1)]
    results = [launcher.wait(60) for launcher in launchers]
    assert [r[0] for r in results] == [0, 0], results
    got = records(out)
    assert set(got) == {0, 1, 2, 3}
    expected = [f"localhost:{p0}", f"localhost:{p0 + 1}", f"localhost:{p1}",
                f"localhost:{p1 + 1}"]
    assert all(r["tf_config"]["cluster"]["worker"] == expected for r in got.values())
    assert "[2] hello from worker 2" in results[1][1] and "[0] hello" in results[0][1]


# --- real training ------------------------------------------------------------

@pytest.mark.slow
def test_two_workers_train_the_multi_worker_app(start, tmp_path):
    out = tmp_path / "run"
    code, stdout, stderr = start(["-n", "2", "--", "python", str(APP), "--epochs", "1",
                                  "--per-replica-batch", "48", "--output", str(out)]).wait(240)
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    for rank in (0, 1):
        assert f"[{rank}] [worker:{rank}] strategy=multi_worker replicas=2, 2 workers" in stdout
        assert f"[{rank}] [worker:{rank}] done:" in stdout
    assert (out / "model.keras").exists()


TUTORIAL = str(FIXTURES / "scripts" / "tf_multi_worker_tutorial.py")


@pytest.mark.slow
@pytest.mark.parametrize("compat", ["on", "off"])
def test_unmodified_tutorial_script_trains_because_launch_applies_the_fixes(
        start, tmp_path, compat):
    # The script never imports mirrorkit: stock Keras 3 fails under
    # MultiWorkerMirroredStrategy (keras#20585) unless the launcher's
    # bootstrap applies mirrorkit's fixes; MIRRORKIT_COMPAT=off shows it.
    env = {"MIRRORKIT_COMPAT": "off"} if compat == "off" else {}
    code, stdout, stderr = start(["-n", "2", "--", "python", TUTORIAL],
                                 env=env).wait(240)
    if compat == "on":
        assert code == 0, stdout[-3000:] + stderr[-3000:]
        assert {p.name for p in tmp_path.glob("worker-*.json")} == {"worker-0.json",
                                                                   "worker-1.json"}
    else:
        assert code != 0
        assert "PerReplica" in stdout + stderr
        assert not list(tmp_path.glob("worker-*.json"))


def test_bootstrap_runs_a_shadowed_sitecustomize_and_installs_the_hook(tmp_path):
    from mirrorkit.launcher.bootstrap import SITE_DIR

    (tmp_path / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = '1'\n")
    code = ("import os, sys\n"
            "print(os.environ.get('USER_SITE_RAN'),"
            " any(type(f).__name__ == 'AfterImport' for f in sys.meta_path),"
            " 'tensorflow' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=clean_env(PYTHONPATH=os.pathsep.join([str(SITE_DIR),
                                                                    str(tmp_path)])),
                          timeout=60)
    assert proc.stdout.split() == ["1", "True", "False"], proc.stderr


def history(out: Path, rank: int) -> list[tuple[int, int]]:
    """(restart, epoch) of every epoch worker ``rank`` finished, in order."""
    lines = (out / f"history-{rank}.jsonl").read_text().splitlines()
    return [(r["restart"], r["epoch"]) for r in map(json.loads, lines)]


@pytest.mark.slow
def test_killed_worker_restarts_and_resumes_after_last_backup(start, tmp_path):
    out, marker = tmp_path / "run", tmp_path / "killed-once"
    code, stdout, stderr = start([
        "-n", "2", "--max-restarts", "1", "--grace-period", "1", "--", "python", TRAIN,
        str(out), "--epochs", "4", "--backup", "--kill-rank", "1", "--kill-epoch", "2",
        "--marker", str(marker)]).wait(240)
    assert code == 0, stdout[-3000:] + stderr[-3000:]
    assert marker.exists() and "[1] worker 1 SIGKILLs itself in epoch 2" in stdout
    assert "worker 1 (pid" in stderr and "was killed by SIGKILL" in stderr
    # Epoch 1 was backed up before the kill; the restarted group (restart 1)
    # resumed at epoch 2 and every epoch finished exactly once.
    for rank in (0, 1):
        assert history(out, rank) == [(0, 1), (1, 2), (1, 3), (1, 4)]
    assert (out / "model.keras").exists()
    assert "all 2 worker(s) succeeded" in stderr and "(1 restarts)" in stderr


# The same kill with no restarts (the killed worker is the named root cause) is
# tests/launcher/test_scratch_cleanup.py::test_crashed_worker_is_the_named_root_cause_and_
# leaves_no_private_folder: one run checks both, so its two TensorFlow workers start once.


@pytest.mark.slow
def test_ctrl_c_during_real_training_stops_every_worker(start, tmp_path):
    out = tmp_path / "run"
    launcher = start(["-n", "2", "--grace-period", "2", "--", "python", TRAIN, str(out),
                      "--epochs", "500"])
    wait_for(lambda: len(list(out.glob("history-*.jsonl"))) == 2, 150, "a finished epoch")
    pids = [json.loads(p.read_text())["pid"] for p in out.glob("runtime-*.json")]
    assert len(pids) == 2 and all(alive(p) for p in pids)
    t0 = time.monotonic()
    os.kill(launcher.proc.pid, signal.SIGINT)
    rc, _, stderr = launcher.wait(60)
    # TensorFlow workers ignore SIGTERM, so the stop takes the grace period, no more.
    assert rc == 130 and time.monotonic() - t0 < 2 + 5, stderr[-2000:]
    assert not [p for p in pids if alive(p)]
    assert "stopped by SIGINT" in stderr
