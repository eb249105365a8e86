"""The one-line account of a lost peer, from TensorFlow's own error texts.

The texts are those TensorFlow 2.21 raised on network-namespace hosts when a
peer was frozen (SIGSTOP), killed, or cut off (link down); the real runs are
in ``tests/distribute/test_multi_host.py``. Here each text goes through
:func:`mirrorkit.distribute.peer_loss.explain` with real ``tf.errors`` classes,
plus the excepthook, the runner and the launcher summary that use it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import tensorflow as tf

from mirrorkit.distribute import peer_loss
from mirrorkit.launcher import RunResult, WorkerFailure, WorkerState

CLUSTER = {"worker": ["hosta:23400", "hostb:23400"]}

FROZEN = """Collective ops is aborted by: Error reported from /job:worker/task:1: The following \
tasks are unhealthy (stopped sending heartbeats):
/job:worker/replica:0/task:1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. \
preemption, eviction) to debug further.
The error could be from a previous operation. Restart your program to reset.
\t [[{{node CollectiveReduceV2}}]] [Op:__inference_multi_step_on_iterator_782]"""

REFUSED = """Collective ops is aborted by: failed to connect to all addresses; last error: \
UNKNOWN: ipv4:10.231.20.2:23400: Failed to connect to remote host: Connection refused
Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling \
/tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_message:"failed to connect to all addresses; last \
error: UNKNOWN: ipv4:10.231.20.2:23400: Failed to connect to remote host: Connection refused", \
grpc_status:14}"""

RESET = """{{function_node __wrapped__CollectiveReduceV2_device_/job:worker/replica:0/task:0/\
device:CPU:0}} Collective ops is aborted by: recvmsg:Connection reset by peer
Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling \
/tensorflow.WorkerService/RecvBuf:
:UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset by peer"}"""

LEADER_CUT = """Collective ops is aborted by: Deadline Exceeded
RPC: /tensorflow.CoordinationService/Heartbeat
The error could be from a previous operation. Restart your program to reset.
\t [[{{node CollectiveReduceV2}}]] [Op:__inference_multi_step_on_iterator_772]"""


@pytest.mark.fast
@pytest.mark.parametrize("kind, text, expected", [
    (tf.errors.UnavailableError, FROZEN,
     "worker 1 at hostb:23400 (stopped sending heartbeats)"),
    (tf.errors.UnavailableError, REFUSED, "worker 1 at hostb:23400 (connection refused)"),
    (tf.errors.UnavailableError, RESET, "worker 1 at hostb:23400 (connection reset)"),
    # The follower's side of a cut: the coordination leader (worker 0) is gone.
    (tf.errors.DeadlineExceededError, LEADER_CUT,
     "worker 0 at hosta:23400 (heartbeat deadline exceeded: the coordination leader is "
     "unreachable)"),
])
def test_each_observation_names_the_lost_task_and_its_address(kind, text, expected):
    line = peer_loss.explain(kind(None, None, text), cluster=CLUSTER, waited=6.25)
    assert line == f"mirrorkit: lost peer {expected}; no training step finished for 6.2 s"


@pytest.mark.fast
def test_the_leader_is_the_chief_when_there_is_one():
    cluster = {"chief": ["c:1"], "worker": ["w:2"]}
    line = peer_loss.explain(tf.errors.DeadlineExceededError(None, None, LEADER_CUT),
                             cluster=cluster, waited=1.0)
    assert line.startswith("mirrorkit: lost peer chief 0 at c:1 (heartbeat deadline")


@pytest.mark.fast
def test_the_address_is_matched_through_name_resolution_when_grpc_omits_the_task():
    text = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:5002: " \
           "Failed to connect to remote host: Connection refused"
    cluster = {"worker": ["localhost:5001", "localhost:5002"]}
    line = peer_loss.explain(tf.errors.UnavailableError(None, None, text), cluster=cluster,
                             waited=0.5)
    assert "worker 1 at localhost:5002 (connection refused)" in line


@pytest.mark.fast
def test_without_progress_the_heartbeat_timeout_is_named(monkeypatch):
    monkeypatch.setattr(peer_loss, "_last_progress", None)
    monkeypatch.setattr(peer_loss, "_heartbeat_timeout", 7.0)
    line = peer_loss.explain(tf.errors.UnavailableError(None, None, FROZEN), cluster=CLUSTER)
    assert line.endswith("(stopped sending heartbeats); heartbeat timeout 7 s")


@pytest.mark.fast
@pytest.mark.parametrize("err", [
    ValueError("Connection refused"),  # not a TensorFlow runtime error
    tf.errors.UnavailableError(None, None, "Socket is not connected to any dataset"),
    tf.errors.InvalidArgumentError(None, None, FROZEN),
])
def test_other_errors_are_left_alone(err):
    assert peer_loss.explain(err, cluster=CLUSTER) is None


@pytest.mark.fast
def test_the_cause_chain_is_searched():
    try:
        try:
            raise tf.errors.UnavailableError(None, None, FROZEN)
        except tf.errors.UnavailableError as inner:
            raise RuntimeError("fit failed") from inner
    except RuntimeError as outer:
        assert "worker 1 at hostb:23400" in peer_loss.explain(outer, cluster=CLUSTER, waited=1)


def test_a_worker_dying_of_a_lost_peer_ends_with_the_line_not_a_traceback(tmp_path):
    code = (
        "import json, os, tensorflow as tf\n"
        "from mirrorkit.distribute import peer_loss\n"
        "peer_loss.install(heartbeat_timeout=10)\n"
        f"raise tf.errors.UnavailableError(None, None, {FROZEN!r})\n")
    env = {"TF_CONFIG": '{"cluster": {"worker": ["hosta:23400", "hostb:23400"]}, '
                        '"task": {"type": "worker", "index": 0}}'}
    from conftest import clean_env

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=clean_env(**env), timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    assert lines[-1].startswith("mirrorkit: lost peer worker 1 at hostb:23400 "
                                "(stopped sending heartbeats); heartbeat timeout 10 s"), proc.stderr
    assert lines[-2].startswith("UnavailableError: Collective ops is aborted by:")


def test_other_exceptions_keep_their_traceback(tmp_path):
    code = ("from mirrorkit.distribute import peer_loss\npeer_loss.install()\n"
            "raise KeyError('mine')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert "Traceback" in proc.stderr and proc.stderr.strip().endswith("KeyError: 'mine'")


@pytest.mark.fast
def test_the_launcher_summary_leads_with_the_lost_peer():
    line = "mirrorkit: lost peer worker 1 at hostb:23400 (stopped sending heartbeats); " \
           "no training step finished for 6.1 s"
    failure = WorkerFailure(rank=0, pid=7, returncode=1, restart=0,
                            tail=("UnavailableError: Collective ops is aborted by: ...", line))
    text = RunResult(WorkerState.FAILED, 1, 0, (failure,), {}, None, 3.0).summary()
    assert text.splitlines()[0] == f"worker 0 reports: {line}"
    assert "Root cause: worker 0 (pid 7) exited with code 1" in text


@pytest.mark.fast
def test_this_workers_own_task_is_never_named_lost(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": CLUSTER,
                                                "task": {"type": "worker", "index": 0}}))
    text = ("{{function_node __wrapped__X_device_/job:worker/replica:0/task:0/device:CPU:0}} "
            "Socket closed while talking to /job:worker/replica:0/task:1")
    line = peer_loss.explain(tf.errors.UnavailableError(None, None, text), waited=2.0)
    assert line.startswith("mirrorkit: lost peer worker 1 at hostb:23400 (connection closed)")
