"""``mirrorkit launch --ray``'s pure parts: the job spec, the worker environment, the journal.

In process, no Ray cluster (``tests/launcher/test_ray.py`` runs the real one);
the CLI's refusals go through click's runner and end before Ray is imported.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mirrorkit.cli import cli
from mirrorkit.launcher.ray_job import RayJobSpec
from mirrorkit.launcher.ray_journal import Journal
from mirrorkit.launcher.ray_worker import child_env, run_folder
from mirrorkit.launcher.state import WorkerState
from mirrorkit.protocol import ExitCode

pytestmark = pytest.mark.fast


def test_the_spec_maps_to_ray_trains_scaling_and_checks_its_fields():
    spec = RayJobSpec(command=("mirrorkit", "train"), nproc=3, cpus_per_worker=2,
                      gpus_per_worker=1, min_workers=2, max_restarts=2)
    assert spec.scaling() == {"num_workers": (2, 3), "use_gpu": True,
                              "resources_per_worker": {"CPU": 2.0, "GPU": 1.0}}
    assert spec.elastic_batch == "global"
    for bad, field in (({"nproc": 0}, "`nproc`"), ({"min_workers": 4}, "`min_workers`"),
                       ({"cpus_per_worker": 0}, "`cpus_per_worker`"),
                       ({"elastic_batch": "local"}, "`elastic_batch`"),
                       ({"command": ()}, "`command`")):
        with pytest.raises(ValueError, match=field):
            RayJobSpec(**{"command": ("x",), "nproc": 3, **bad})


def test_the_driver_passes_its_mirrorkit_and_tensorflow_variables_but_not_the_protocols():
    env = RayJobSpec(command=("x",), nproc=2, env={"A": "1"}).worker_env(
        {"MIRRORKIT_COLLECTIVE_TIMEOUT": "5", "TF_CPP_MIN_LOG_LEVEL": "2", "HOME": "/h",
         "TF_CONFIG": "{}", "MIRRORKIT_RESTART_COUNT": "4", "MIRRORKIT_RUN_ID": "job"})
    assert env == {"MIRRORKIT_COLLECTIVE_TIMEOUT": "5", "TF_CPP_MIN_LOG_LEVEL": "2",
                   "MIRRORKIT_RUN_ID": "job", "A": "1"}


def test_a_workers_program_gets_a_local_launchs_environment_with_rays_tf_config():
    env = child_env({"TF_USE_LEGACY_KERAS": "1", "PYTHONPATH": "/mine", "PATH": "/bin"},
                    tf_config='{"task": 1}', rank=1, attempt=2, reason="worker 0 was killed",
                    job={"MIRRORKIT_RUN_ID": "r"}, status_dir="/s", scratch="/t", threads=3)
    # Ray's backend asks for tf_keras; the program runs Keras 3.
    assert "TF_USE_LEGACY_KERAS" not in env
    assert env["PYTHONPATH"].endswith("/mirrorkit/launcher/_site:/mine")
    assert (env["TF_CONFIG"], env["MIRRORKIT_RESTART_COUNT"], env["MIRRORKIT_ORIGINAL_RANK"],
            env["MIRRORKIT_RESTART_REASON"], env["MIRRORKIT_STATUS_DIR"],
            env["TF_NUM_INTRAOP_THREADS"], env["PYTHONUNBUFFERED"]) == (
        '{"task": 1}', "2", "1", "worker 0 was killed", "/s", "3", "1")
    assert run_folder(["mirrorkit", "train", "--output", "o"]) == "o"


def test_the_journal_counts_attempts_and_ends_in_a_local_launchs_result():
    journal = Journal()
    assert [journal.begin(r, f"10.0.0.{r + 1}", 100 + r) for r in (0, 1)] == [(0, None)] * 2
    journal.failed({"rank": 1, "pid": 101, "returncode": -9, "restart": 0, "tail": ["x"]})
    journal.failed({"rank": 0, "pid": 100, "returncode": 1, "restart": 0, "tail": []})
    again = [journal.begin(r, f"10.0.0.{2 - r}", 200 + r) for r in (0, 1)]
    assert again == [(1, "worker 1 (pid 101, node 10.0.0.2) was killed by SIGKILL")] * 2
    journal.lines([("out", "[0] hello")])
    assert journal.take() == [("out", "[0] hello")] and journal.take() == []
    status = {"rank": 0, "epoch": 2, "images_per_second": 100.0, "local_step_ms": 5.0}
    journal.finished(0, 1, False, status)
    journal.finished(1, 1, True, None)
    done = journal.result(True)
    assert (done.state, done.exit_code, done.restarts) == (
        WorkerState.SUCCEEDED, ExitCode.TARGET_MISSED, 1)
    assert done.summary().startswith("all 2 worker(s) succeeded in ")
    assert "worker 0: 100 images/s (epoch 2), local step 5.0 ms" in done.summary()
    failed = journal.result(False, "Ray Train: too many failures")
    # The last attempt lost nobody through its program: Ray's error leads.
    assert failed.exit_code == ExitCode.FAILED
    assert failed.summary().splitlines()[0] == "Ray Train: too many failures"


def test_options_of_a_local_launch_are_refused_with_ray_in_one_line():
    result = CliRunner().invoke(cli, ["launch", "--ray", "-n", "2", "--hosts", "a,b", "--",
                                      "mirrorkit", "train"])
    assert result.exit_code == 2
    assert "--hosts cannot be used with --ray" in result.output
    result = CliRunner().invoke(cli, ["launch", "-n", "2", "--storage", "/s", "--", "x"])
    assert result.exit_code == 2 and "apply to --ray jobs only" in result.output


def test_an_address_without_a_ray_head_is_one_line_not_minutes_of_retries():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]      # closed again below: nothing listens there
    result = CliRunner().invoke(cli, ["launch", "--ray", f"127.0.0.1:{port}", "-n", "2", "--",
                                      "mirrorkit", "train"])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: Cannot connect to the Ray cluster at "
                                     f"'127.0.0.1:{port}' (ConnectionRefusedError")
    # A program that is not found fails before Ray is asked for anything.
    result = CliRunner().invoke(cli, ["launch", "--ray", f"127.0.0.1:{port}", "-n", "2", "--",
                                      "no-such-program-here"])
    assert result.exit_code == 1 and "Command not found: 'no-such-program-here'" in result.output


def test_the_backend_writes_ray_trains_tf_config_and_a_reachable_address():
    pytest.importorskip("ray")
    from mirrorkit.launcher import ray_backend

    assert json.loads(ray_backend.tf_config(["10.0.0.1:5001", "10.0.0.2:5002"], 1)) == {
        "cluster": {"worker": ["10.0.0.1:5001", "10.0.0.2:5002"]},
        "task": {"type": "worker", "index": 1}}
    host, port = ray_backend._address().rsplit(":", 1)
    assert host and 0 < int(port) < 65536
