"""export-model on a real model.keras that is empty or cut short: Keras says "not found", we say what.

One TensorFlow process saves a small model and shows Keras's own message on
an empty and a truncated copy (the issue's failure); ``mirrorkit
export-model`` then names the file and what is wrong, before TensorFlow
starts, and accepts the intact archive's layout.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner
from conftest import clean_env

from mirrorkit.cli import cli
from mirrorkit.training.run_files import check_model_archive

pytestmark = pytest.mark.slow

SAVE_AND_LOAD = """
    import json, sys
    from pathlib import Path
    import keras

    folder = Path(sys.argv[1])
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.save(folder / "whole" / "model.keras")
    data = (folder / "whole" / "model.keras").read_bytes()
    said = {}
    for name, content in (("empty", b""), ("truncated", data[: len(data) // 2])):
        (folder / name / "model.keras").write_bytes(content)
        try:
            keras.models.load_model(folder / name / "model.keras")
            said[name] = None
        except Exception as err:
            said[name] = f"{type(err).__name__}: {err}"
    print("RESULT " + json.dumps(said))
"""


def test_an_empty_or_truncated_model_keras_is_named_not_called_missing(tmp_path):
    for name in ("whole", "empty", "truncated"):
        (tmp_path / name).mkdir()
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SAVE_AND_LOAD), str(tmp_path)],
                          capture_output=True, text=True, env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout.split("RESULT ", 1)[1])
    # The failure: Keras calls both files, which exist, "not found".
    assert said["empty"] and "not found" in said["empty"].lower(), said
    assert said["truncated"] and "not found" in said["truncated"].lower(), said
    check_model_archive(tmp_path / "whole" / "model.keras")   # Keras's own archive passes
    size = (tmp_path / "truncated" / "model.keras").stat().st_size
    for name, what in (("empty", "is empty (0 bytes)"),
                       ("truncated", f"is truncated (a zip archive cut short at {size} bytes)")):
        run = tmp_path / name
        result = CliRunner().invoke(cli, ["export-model", str(run)])
        assert result.exit_code == 1, result.output
        [line] = result.stderr.strip().splitlines()
        assert line.startswith(f"Error: {run}/model.keras {what}"), line
        assert not (run / "saved_model").exists()
