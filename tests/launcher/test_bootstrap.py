"""Under ``mirrorkit launch``: the script's MirroredStrategy passes isinstance, and
TF_CONFIG / mirrorkit's bootstrap stay out of the processes the script starts.

Real launched workers (``python -m mirrorkit launch -n 2 -- mirrorkit run``)
run tests/fixtures/launch_child_env.py, which starts a subprocess, an
``os.system`` command and a ``multiprocessing`` spawn child, and a child that
imports TensorFlow and creates ``MultiWorkerMirroredStrategy()`` (it must be a
one-process strategy, not a copy of the worker joining the cluster).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, clean_env

from mirrorkit.launcher import bootstrap

SCRIPT = REPO / "tests" / "fixtures" / "launch_child_env.py"


def test_install_hides_the_bootstrap_and_tf_config_from_children(monkeypatch):
    site = str(bootstrap.SITE_DIR)
    monkeypatch.setattr(bootstrap, "_done", [])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([site, "/user/lib"]))
    monkeypatch.setenv("TF_CONFIG", '{"cluster": {}}')
    try:
        assert bootstrap.keep_out_of_children() == ["PYTHONPATH", "TF_CONFIG"]
        assert bootstrap.keep_out_of_children() == []                     # idempotent
        assert os.environ["PYTHONPATH"] == "/user/lib"
        assert os.environ["TF_CONFIG"] == '{"cluster": {}}'  # this process still reads it
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ.get('TF_CONFIG'), "
             "os.environ.get('PYTHONPATH'))"], capture_output=True, text=True, check=True)
        assert child.stdout.split() == ["None", "/user/lib"]
    finally:
        os.environ.pop("TF_CONFIG", None)   # monkeypatch restores the variable


@pytest.mark.slow
@pytest.mark.parametrize("runner", [["mirrorkit", "run"], ["python"]])
def test_launched_worker_children_do_not_join_the_cluster(tmp_path, runner):
    command = [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--", *runner,
               str(SCRIPT)]
    proc = subprocess.run(command, cwd=tmp_path, env=clean_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = {line.split(" ", 1)[0]: json.loads(line.split("CHILD_ENV ", 1)[1])
             for line in proc.stdout.splitlines() if "CHILD_ENV " in line}
    assert set(lines) == {"[0]", "[1]"}, proc.stdout
    for out in lines.values():
        assert out["isinstance_mirrored"] is True, out
        assert out["worker_sees_tf_config"] is True
        assert out["os_system"] == 0, out
        for child in (out["subprocess"], out["spawn"]):
            assert child["tf_config"] is None, child
            assert str(bootstrap.SITE_DIR) not in child["pythonpath"], child
            assert child["bootstrap"] is False, child
        assert out["tf_child"] == {"replicas": 1, "multi_worker": False}, out
    if runner[0] == "mirrorkit":
        assert {out["replicas"] for out in lines.values()} == {2}
