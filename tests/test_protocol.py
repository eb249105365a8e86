"""The launcher-to-worker contract (``mirrorkit.protocol``): each message, from one side to the other.

Every test crosses the boundary for real: the launcher side is ``mirrorkit
launch`` (or the launcher module that reads the message), the worker side is
the code a worker runs (``_env``'s readers, ``training.targets``,
``training.monitoring``, ``distribute.peer_loss``), so a change to one side
that the other does not follow fails here.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest
from conftest import clean_env, consecutive_free_ports

from mirrorkit import _env, protocol
from mirrorkit.launcher import worker_status
from mirrorkit.launcher.state import RunResult, WorkerFailure, WorkerState

# A TensorFlow-free worker: reports what it read through _env, or ends as told.
WORKER = textwrap.dedent("""
    import json, os, signal, sys
    from pathlib import Path
    from mirrorkit import _env, protocol

    out, mode = Path(sys.argv[1]), sys.argv[2]
    if mode == "env":
        config = json.loads(_env.tf_config_text())
        attempt, rank = _env.restart_count(), config["task"]["index"]
        seen = {"tf_config": config, "restart_count": attempt, "run_id": _env.run_id(),
                "original_rank": _env.original_rank(), "restart_reason": _env.restart_reason(),
                "elastic_batch": _env.elastic_batch(), "status_dir": _env.status_dir(),
                "status_dir_exists": os.path.isdir(_env.status_dir() or ""),
                "network": _env.get(_env.NETWORK),
                "threads": _env.get(_env.TF_INTRA_OP_THREADS),
                "names": sorted(k for k in _env.snapshot() if k.startswith("MIRRORKIT_"))}
        (out / f"{attempt}-{rank}.json").write_text(json.dumps(seen))
        if (attempt, rank) == (0, 1):   # one failure: one restart
            # Once worker 0 has written its file: the launcher stops it when this one fails.
            import time
            deadline = time.monotonic() + 120
            while not (out / "0-0.json").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            sys.exit(1)
        sys.exit(0)
    if mode == "missed":
        from mirrorkit.training import targets
        results = targets.evaluate([targets.parse_target("val_accuracy>=0.95")],
                                   {"val_accuracy": 0.5})
        print("\\n".join(targets.missed_lines(results)), file=sys.stderr)
        sys.exit(targets.MISSED_EXIT_CODE)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(mode))
""")


def _launch(tmp_path, *args: str, mode: str, env: dict[str, str | None] | None = None):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", *args, "--", "python", str(script),
         str(tmp_path), mode], env=clean_env(**(env or {})), capture_output=True, text=True,
        timeout=180)


# --- Environment variables ----------------------------------------------------------------------

def test_every_variable_the_launcher_sets_reaches_the_workers_reader(tmp_path):
    # Without the suite's own MIRRORKIT_COLLECTIVE_TIMEOUT: only what the launcher sets.
    proc = _launch(tmp_path, "-n", "2", "--max-restarts", "1", "--min-workers", "1",
                   "--elastic-batch", "per-replica", mode="env",
                   env={"MIRRORKIT_COLLECTIVE_TIMEOUT": None})
    assert proc.returncode == protocol.ExitCode.OK, proc.stdout[-2000:] + proc.stderr[-2000:]
    seen = {(a, r): json.loads((tmp_path / f"{a}-{r}.json").read_text())
            for a in (0, 1) for r in (0, 1)}
    for (attempt, rank), s in seen.items():
        assert s["tf_config"]["task"] == {"type": "worker", "index": rank}
        assert len(s["tf_config"]["cluster"]["worker"]) == 2
        assert s["restart_count"] == attempt
        assert s["original_rank"] == rank
        assert s["elastic_batch"] == "per-replica"
        assert s["status_dir_exists"]
        assert s["network"] in (None, protocol.NETWORK_ISOLATED)
        assert s["threads"] is not None and int(s["threads"]) >= 1
        # Whatever MIRRORKIT_* name the launcher gives a worker is part of the protocol.
        assert set(s["names"]) <= set(protocol.WORKER_ENV), s["names"]
    assert len({s["run_id"] for s in seen.values()}) == 1 and seen[0, 0]["run_id"]
    assert len({s["status_dir"] for s in seen.values()}) == 1
    assert seen[0, 0]["restart_reason"] is None
    assert "worker 1" in seen[1, 0]["restart_reason"] == seen[1, 1]["restart_reason"]


READERS = [
    (protocol.TF_CONFIG, '{"cluster": {}}', _env.tf_config_text, '{"cluster": {}}'),
    (protocol.RESTART_COUNT, "2", _env.restart_count, 2),
    (protocol.RUN_ID, "20250101-000000", _env.run_id, "20250101-000000"),
    (protocol.JOB_START, "1735689600.25", _env.job_start, 1735689600.25),
    (protocol.ORIGINAL_RANK, "3", _env.original_rank, 3),
    (protocol.RESTART_REASON, "worker 1 exited with code 1", _env.restart_reason,
     "worker 1 exited with code 1"),
    (protocol.ELASTIC_BATCH, "global", _env.elastic_batch, "global"),
    (protocol.STATUS_DIR, "/tmp/status", _env.status_dir, "/tmp/status"),
    # Only an existing folder: a worker never recreates a root the launcher removed.
    (protocol.SCRATCH_DIR, tempfile.gettempdir(), _env.scratch_dir, tempfile.gettempdir()),
    (protocol.NETWORK, protocol.NETWORK_ISOLATED, lambda: _env.get(_env.NETWORK), "isolated"),
    (protocol.JOIN_TIMEOUT, "7", _env.join_timeout, 7.0),
    (protocol.CUDA_VISIBLE_DEVICES, "1,2", _env.cuda_visible_devices, "1,2"),
    (protocol.TF_INTRA_OP_THREADS, "4", lambda: _env.get(_env.TF_INTRA_OP_THREADS), "4"),
]


@pytest.mark.parametrize("name, value, reader, expected", READERS,
                         ids=[r[0] for r in READERS])
def test_each_name_is_read_back_by_env(name, value, reader, expected):
    # _env re-exports the protocol's names, and its reader finds what the launcher wrote.
    assert getattr(_env, [k for k, v in vars(protocol).items() if v == name][0]) == name
    with _env.patch({name: value}):
        assert reader() == expected
    with _env.patch({name: None}):
        assert reader() != expected


def test_every_worker_variable_has_a_reader_case():
    assert {r[0] for r in READERS} >= set(protocol.WORKER_ENV)
    assert set(protocol.ELASTIC_BATCH_CHOICES) == {"global", "per-replica"}


# --- Exit codes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("mode, state, code, restarts", [
    ("0", "succeeded", protocol.ExitCode.OK, 0),
    ("1", "FAILED", protocol.ExitCode.FAILED, 1),
    # Finished with missed targets: no restart, and the launcher exits with it too.
    ("missed", "succeeded", protocol.ExitCode.TARGET_MISSED, 0),
    # The same code without the report is an ordinary failure.
    ("3", "FAILED", protocol.ExitCode.TARGET_MISSED, 1),
    ("kill", "FAILED", protocol.signal_exit_code(signal.SIGKILL), 1),
])
def test_the_launcher_reads_each_exit_code(tmp_path, mode, state, code, restarts):
    proc = _launch(tmp_path, "-n", "1", "--max-restarts", "1", mode=mode)
    summary = proc.stderr[proc.stderr.rindex("[launch] "):]
    assert proc.returncode == code, proc.stderr[-2000:]
    assert state in summary and f"{restarts} restart" in summary, summary
    if mode == "missed":
        assert "[0] target missed: val_accuracy>=0.95 (measured 0.5)" in proc.stderr
        assert f"target(s) missed, exit code {int(protocol.ExitCode.TARGET_MISSED)}" in summary


def test_exit_code_values_and_the_signal_rule():
    from mirrorkit.training import targets

    assert [int(c) for c in protocol.ExitCode] == [0, 1, 2, 3]
    assert targets.MISSED_EXIT_CODE == protocol.ExitCode.TARGET_MISSED
    failure = WorkerFailure(rank=0, pid=1, returncode=-int(signal.SIGTERM), restart=0, tail=())
    assert failure.exit_code == protocol.signal_exit_code(signal.SIGTERM) == 143


def test_a_usage_error_exits_with_usage():
    proc = subprocess.run([sys.executable, "-m", "mirrorkit", "launch", "-n", "two", "--",
                           "python"], env=clean_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == protocol.ExitCode.USAGE, proc.stderr


# --- Output lines -------------------------------------------------------------------------------

def test_the_lost_peer_line_a_worker_prints_is_the_one_the_launcher_reads():
    import tensorflow as tf

    from mirrorkit.distribute import peer_loss

    err = tf.errors.UnavailableError(None, None, "Collective ops is aborted by: The following "
                                     "tasks are unhealthy (stopped sending heartbeats):\n"
                                     "/job:worker/task:1")
    line = peer_loss.explain(err, cluster={"worker": ["a:1", "b:2"]}, waited=6.0)
    assert peer_loss.MARKER == protocol.LOST_PEER_MARKER
    failure = WorkerFailure(rank=0, pid=7, returncode=1, restart=0,
                            tail=("UnavailableError: Collective ops is aborted by: ...", line))
    assert failure.lost_peer == line
    assert protocol.parse_lost_peer(failure.lost_peer) == (
        "worker 1 at b:2", "stopped sending heartbeats", "no training step finished for 6.0 s",
        line)
    summary = RunResult(WorkerState.FAILED, 1, 0, (failure,), {}, None, 1.0).summary()
    assert summary.splitlines()[0] == f"worker 0 reports: {line}"


@pytest.mark.parametrize("lost, what, wait", [
    ("worker 1 at hostb:23400", "connection refused", "heartbeat timeout 10 s"),
    ("a peer (TensorFlow did not name it)", "deadline exceeded",
     "no training step finished for 0.3 s"),
    ("chief 0 at [::1]:2222, worker 2 at c:1",
     "heartbeat deadline exceeded: the coordination leader is unreachable",
     "TensorFlow's heartbeat timeout"),
])
def test_a_lost_peer_line_parses_back_to_its_parts(lost, what, wait):
    line = protocol.format_lost_peer(lost, what, wait)
    assert protocol.parse_lost_peer(f"  {line}\n") == (lost, what, wait, line)


def test_what_is_not_a_lost_peer_line_is_not_read_as_one():
    for text in ("", "worker 1 exited", "[0] mirrorkit: lost peer worker 1 (x); y",
                 "mirrorkit: lost peer worker 1", "mirrorkit: lost peer worker 1 (x) y"):
        assert protocol.parse_lost_peer(text) is None, text
    assert WorkerFailure(0, 1, 1, 0, ("mirrorkit: lost peer",)).lost_peer is None
    with pytest.raises(ValueError, match="cannot be read back"):
        protocol.format_lost_peer("worker 1", "refused (twice)", "1 s")
    with pytest.raises(ValueError, match="single-line"):
        protocol.format_lost_peer("worker 1\nworker 2", "refused", "1 s")


def test_the_missed_target_line_parses_back():
    from mirrorkit.training import targets

    results = targets.evaluate([targets.parse_target("val_loss<0.2"),
                                targets.parse_target("images_per_second>=1")],
                               {"val_loss": 0.25})
    lines = targets.missed_lines(results)
    assert [protocol.parse_target_missed(line) for line in lines] == [
        ("val_loss<0.2", 0.25), ("images_per_second>=1", None)]
    assert all(line.startswith(targets.MISSED_PREFIX) for line in lines)
    assert protocol.parse_target_missed("target missed: x (measured lots)") is None
    assert protocol.parse_target_missed("val_loss<0.2 (measured 0.25)") is None


# --- The status file ----------------------------------------------------------------------------

def _monitor_writes(folder, epochs: int = 1):
    """A worker's WorkerMonitor, with the real default strategy, ends ``epochs`` epochs."""
    import tensorflow as tf

    from mirrorkit.training.monitoring import WorkerMonitor

    path = folder / protocol.status_file_name(0)
    monitor = WorkerMonitor(tf.distribute.get_strategy(), workers=1, global_batch=64,
                            per_replica_batch=64, status_path=path)
    for epoch in range(epochs):
        monitor.on_epoch_begin(epoch)
        monitor.on_train_batch_end(0)
        monitor.on_epoch_end(epoch, {})
    return path


def test_a_status_file_the_monitor_writes_is_what_the_launcher_reads(tmp_path):
    path = _monitor_writes(tmp_path, epochs=2)
    assert json.loads(path.read_text())["version"] == protocol.STATUS_VERSION
    [status] = worker_status.read(tmp_path)
    assert set(status) == set(protocol.STATUS_FIELDS)
    assert status["rank"] == 0 and status["epoch"] == 2 and status["step_ms"] >= 0
    assert status == protocol.read_status(path)
    assert worker_status.lines([status])[0].startswith("worker 0: ")
    assert not list(tmp_path.glob("*.tmp"))


OLD = {"rank": 1, "epoch": 2, "step_ms": 39.4, "images_per_second": 812.4, "local_step_ms": 37.1}
GOOD = {"version": protocol.STATUS_VERSION, **OLD}


@pytest.mark.parametrize("text, message", [
    (json.dumps(OLD), "older mirrorkit"),
    (json.dumps({**GOOD, "version": protocol.STATUS_VERSION + 1}), "another mirrorkit"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({k: v for k, v in GOOD.items() if k != "epoch"}), r"missing \['epoch'\]"),
    (json.dumps({**GOOD, "speed": 1}), r"unknown \['speed'\]"),
    (json.dumps({**GOOD, "rank": "1"}), "`rank` must be a non-negative int"),
    (json.dumps({**GOOD, "rank": True}), "`rank` must be a non-negative int"),
    (json.dumps({**GOOD, "step_ms": -1.0}), "`step_ms` must be a non-negative"),
])
def test_a_malformed_or_older_status_file_is_rejected_clearly(tmp_path, caplog, text, message):
    _monitor_writes(tmp_path)
    bad = tmp_path / protocol.status_file_name(1)
    bad.write_text(text)
    with pytest.raises(ValueError, match=message):
        protocol.read_status(bad)
    with caplog.at_level(logging.WARNING, logger="mirrorkit.launcher.worker_status"):
        assert [s["rank"] for s in worker_status.read(tmp_path)] == [0]
    assert "worker-1.json" in caplog.text and "skipping" in caplog.text


def test_a_status_file_named_for_another_rank_is_rejected(tmp_path):
    path = tmp_path / protocol.status_file_name(2)
    protocol.write_status(path, **OLD)
    with pytest.raises(ValueError, match="must be named 'worker-1.json'"):
        protocol.read_status(path)
    with pytest.raises(ValueError, match="`epoch` must be"):
        protocol.encode_status(**{**OLD, "epoch": 1.5})


# --- Timeouts -----------------------------------------------------------------------------------

def test_the_launcher_and_the_workers_wait_by_the_same_timeouts(run_python):
    from mirrorkit import compat
    from mirrorkit.distribute import failure_detection
    from mirrorkit.launcher import rendezvous

    for name in ("DEFAULT_PEER_TIMEOUT", "DEFAULT_JOIN_TIMEOUT", "EXIT_MARGIN"):
        assert getattr(failure_detection, name) == getattr(compat, name) == getattr(protocol,
                                                                                     name)
    assert rendezvous.DEFAULT_JOIN_TIMEOUT == protocol.DEFAULT_JOIN_TIMEOUT
    # A worker's coordination service, configured with nothing set:
    out = run_python("""
        import json
        from mirrorkit.distribute.failure_detection import configure_failure_detection
        print("RESULT", json.dumps(configure_failure_detection()))
    """, env={"TF_CONFIG": json.dumps({"cluster": {"worker": ["localhost:1"]},
                                       "task": {"type": "worker", "index": 0}}),
              "MIRRORKIT_COLLECTIVE_TIMEOUT": None})
    assert json.loads(out.stdout.split("RESULT ")[-1]) == {
        "peer_timeout": protocol.DEFAULT_PEER_TIMEOUT,
        "join_timeout": protocol.DEFAULT_JOIN_TIMEOUT}
    # ...and the launcher's rendezvous, by default and with the override both read.
    from mirrorkit.launcher.spec import LaunchSpec

    for value, expected in ((None, protocol.DEFAULT_JOIN_TIMEOUT), ("7", 7.0)):
        spec = LaunchSpec(command=("python",), nproc=1, hosts=("127.0.0.1",),
                          port=consecutive_free_ports(2), min_workers=1, max_restarts=1)
        with _env.patch({protocol.JOIN_TIMEOUT: value}):
            client = rendezvous.RendezvousClient(spec, threading.Event())
        try:
            assert client._join_timeout == expected
            assert client.first_view().members == (0,)
        finally:
            client.close()


def test_the_protocol_imports_only_the_standard_library():
    # Both sides import it, the launcher without TensorFlow: nothing else may come with it.
    import ast

    tree = ast.parse(open(protocol.__file__).read())
    names = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
             for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module}
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names
