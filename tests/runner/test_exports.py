"""Every stock way to export and reuse a trained model works under ``mirrorkit run``.

``tests/fixtures/scripts/export_and_reload.py`` trains, then exports and
reloads the model every stock way (``model.export``, ``tf.saved_model.save``
with and without ``signatures=``, ``ExportArchive``, ``tf.saved_model.load`` +
calls, ``TFSMLayer`` called and fine-tuned, the three TFLite converters) and
reports each path's largest difference from ``model.predict`` in the same
run. Run plain, under ``mirrorkit run --simulate-cpus 2`` and as two launched
workers, every path matches Keras within 1e-5 and the files are plain
Python's; launched, the files on disk are the chief's.

Controls, each patch turned off by name (MIRRORKIT_COMPAT_DISABLE), each
running only the paths it asserts about (``EXPORTS_ONLY``):

* ``loaded-function-calls`` off: every call of a loaded function at the
  script's top level fails with TensorFlow's ``InvalidArgumentError`` ("a
  graph generated from the cross-replica context in an in-replica context").
* ``chief-only-saved-model`` off: worker 1's ``ExportArchive.write_out``
  replaces the chief's files with its own (the fixture starts it once the
  chief's archive is complete, so the outcome does not depend on timing).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import REPO, clean_env

pytestmark = pytest.mark.slow

SCRIPT = str(REPO / "tests" / "fixtures" / "scripts" / "export_and_reload.py")
RUN = [sys.executable, "-m", "mirrorkit", "run"]
LAUNCH = [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--", "mirrorkit", "run"]
# The paths that call a function of a loaded SavedModel at the script's top level.
LOADED = ("export", "export_signature", "export_tf_saved_model", "saved_model",
          "saved_model_signatures", "export_archive", "tfsm_layer")
TFLITE = ("tflite_from_keras_model", "tflite_from_saved_model",
          "tflite_from_concrete_functions")


def _run(command: list[str], cwd: Path, **env: str) -> list[dict]:
    cwd.mkdir()
    proc = subprocess.run([*command, SCRIPT, "out"], cwd=str(cwd), env=clean_env(**env),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Launched workers' lines carry a "[rank] " prefix.
    return [json.loads(line.split("EXPORTS ", 1)[1]) for line in proc.stdout.splitlines()
            if "EXPORTS " in line]


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _scratch() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("mirrorkit-savedmodel-*")}


def _assert_like_keras(result: dict) -> None:
    assert set(result["results"]) == {*LOADED, *TFLITE}
    for name, diff in result["results"].items():
        assert isinstance(diff, float) and diff <= 1e-5, (result["task"], name, diff)


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> dict:
    (result,) = _run([sys.executable], tmp_path_factory.mktemp("plain") / "run")
    _assert_like_keras(result)     # the fixture itself: every path works in plain Python
    assert result["replicas"] == 1 and result["archive_written_by"] == "local"
    return result


def test_two_replicas_export_and_reload_as_plain_python(plain, tmp_path):
    (result,) = _run([*RUN, "--simulate-cpus", "2"], tmp_path / "run")
    assert result["replicas"] == 2
    _assert_like_keras(result)
    assert result["files"] == plain["files"] == _files(tmp_path / "run" / "out")
    assert result["archive_written_by"] == "local"
    # Fine-tuning the reloaded layer trains (its variables are mirrored); the
    # loss is plain Python's up to the summation order of 2 replicas.
    assert result["fine_tune_loss"] == pytest.approx(plain["fine_tune_loss"], abs=2e-3)


def test_launched_workers_reload_the_chiefs_export(plain, tmp_path):
    before = _scratch()
    results = sorted(_run(LAUNCH, tmp_path / "launch"), key=lambda r: r["task"])
    assert [r["task"] for r in results] == ["worker0", "worker1"]
    for result in results:
        _assert_like_keras(result)
        assert result["replicas"] == 2
        assert result["files"] == plain["files"]
        # Both workers loaded the chief's files: worker 1 wrote only its private copy.
        assert result["archive_written_by"] == "worker0"
    assert _files(tmp_path / "launch" / "out") == plain["files"]
    assert results[0]["fine_tune_loss"] == results[1]["fine_tune_loss"]
    assert results[0]["fine_tune_loss"] == pytest.approx(plain["fine_tune_loss"], abs=2e-3)
    assert _scratch() <= before       # the non-chief's private copies are gone


def test_control_loaded_function_calls_off_fails_as_upstream(tmp_path):
    # Every path whose outcome is asserted (the fine-tuning is not: left out).
    (result,) = _run([*RUN, "--simulate-cpus", "2"], tmp_path / "run",
                     MIRRORKIT_COMPAT_DISABLE="loaded-function-calls",
                     EXPORTS_ONLY=",".join((*LOADED, *TFLITE)))
    for name in LOADED:
        assert result["results"][name].startswith("error: InvalidArgumentError"), name
    assert "cross-replica context in an in-replica context" in result["results"]["saved_model"]
    # Converting never calls a loaded function at the top level: unaffected.
    assert all(isinstance(result["results"][name], float) for name in TFLITE)


def test_control_chief_only_saved_model_off_lets_a_worker_replace_the_chiefs_files(tmp_path):
    results = _run(LAUNCH, tmp_path / "launch",
                   MIRRORKIT_COMPAT_DISABLE="chief-only-saved-model",
                   EXPORTS_ONLY="export_archive")
    written_by = {r["task"]: r["archive_written_by"] for r in results}
    assert written_by["worker1"] == "worker1"
