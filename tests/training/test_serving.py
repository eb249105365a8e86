"""Export for serving: a SavedModel that a fresh TensorFlow (no mirrorkit) serves exactly.

A model trained on 2 simulated replicas is exported twice: by ``mirrorkit
train --export saved_model`` and by ``mirrorkit export-model``. A fresh
process that never imports mirrorkit loads each with ``tf.saved_model.load``
and feeds uint8 images, at the training size and larger (resized inside);
the probabilities must equal the Keras model's on the same preprocessing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import clean_env

MIRRORKIT = [sys.executable, "-m", "mirrorkit"]

CHECK = """
import json, sys
import numpy as np, tensorflow as tf, keras
assert "mirrorkit" not in sys.modules
run, exports = sys.argv[1], sys.argv[2:]
model = keras.models.load_model(run + "/model.keras")
rng = np.random.default_rng(0)
small = rng.integers(0, 256, size=(5, 8, 8, 1), dtype=np.uint8)
large = rng.integers(0, 256, size=(3, 20, 12, 1), dtype=np.uint8)
want_small = model.predict(small.astype("float32") / 255.0, verbose=0)
want_large = model.predict(
    tf.image.resize(large.astype("float32") / 255.0, (8, 8)).numpy(), verbose=0)
out = {}
for path in exports:
    serve = tf.saved_model.load(path).signatures["serving_default"]
    got_small = serve(images=tf.constant(small))["probabilities"].numpy()
    got_large = serve(images=tf.constant(large))["probabilities"].numpy()
    out[path] = [float(np.abs(got_small - want_small).max()),
                 float(np.abs(got_large - want_large).max()),
                 list(got_small.shape), bool("mirrorkit" in sys.modules)]
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_a_model_trained_on_two_replicas_serves_from_a_fresh_tensorflow(tmp_path):
    run = tmp_path / "run"
    trained = subprocess.run(
        [*MIRRORKIT, "train", "--simulate-cpus", "2", "--epochs", "1", "--export",
         "saved_model", "--output", str(run)],
        capture_output=True, text=True, env=clean_env(), timeout=300)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-2000:]
    assert "saved_model/" in trained.stdout.strip().splitlines()[-1]

    again = tmp_path / "again"
    exported = subprocess.run([*MIRRORKIT, "export-model", str(run), "--output", str(again)],
                              capture_output=True, text=True, env=clean_env(), timeout=300)
    assert exported.returncode == 0, exported.stderr[-2000:]

    check = subprocess.run([sys.executable, "-c", textwrap.dedent(CHECK), str(run),
                            str(run / "saved_model"), str(again)],
                           capture_output=True, text=True, env=clean_env(), timeout=300)
    assert check.returncode == 0, check.stderr[-3000:]
    results = json.loads(check.stdout.split("RESULT ", 1)[1])
    for path, (small, large, shape, imported) in results.items():
        assert shape == [5, 10] and not imported, path
        assert small <= 1e-5 and large <= 1e-5, (path, small, large)


@pytest.mark.fast
def test_export_model_refuses_what_is_not_a_run_and_overwrites_nothing(tmp_path):
    from click.testing import CliRunner

    from mirrorkit.cli import cli

    result = CliRunner().invoke(cli, ["export-model", str(tmp_path)])
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"Error: Not a mirrorkit run: {tmp_path}/model.keras does not exist (a run directory "
        f"holds the model.keras that `mirrorkit train` wrote). Received: RUN_DIR='{tmp_path}'")
    (tmp_path / "model.keras").write_bytes(b"")
    (tmp_path / "saved_model").mkdir()
    (tmp_path / "saved_model" / "keep").write_text("mine")
    result = CliRunner().invoke(cli, ["export-model", str(tmp_path)])
    assert result.exit_code == 1 and "already exists; nothing was overwritten" in result.output
    assert (tmp_path / "saved_model" / "keep").read_text() == "mine"
