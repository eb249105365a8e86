"""``paired-step-losses``: a step loss that pairs its batch's examples is named, once.

keras.io's SimCLR example computes a contrastive loss over the (batch, batch)
similarity matrix inside its own ``train_step``: each replica pairs only its
slice's rows, so under N replicas the loss differs from one device's with no
error. The check names that product in one line; a per-example loss in a
custom step and MultiHeadAttention's products (within each example) are not
named. The check never changes training: with it off by name the numbers
are the same and nothing is named.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, clean_env, result_line

SCRIPT = REPO / "tests" / "fixtures" / "paired_losses.py"
NAMED = "mirrorkit: the loss this step differentiates pairs the examples of its batch"


def _result(tmp_path, **env: str) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, str(SCRIPT), "2"], cwd=str(tmp_path),
                          env=clean_env(**env), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return result_line(proc.stdout), proc.stderr


@pytest.mark.slow
def test_a_contrastive_step_loss_is_named_once_and_training_is_unchanged(tmp_path):
    checked, stderr = _result(tmp_path)
    assert checked["applied"] == "applied"
    named = [line for line in stderr.splitlines() if NAMED in line]
    # One product (the similarity matrix), named once for both replicas' traces.
    assert len(named) == 1, stderr[-3000:]
    # Named by the script's line that makes the similarity matrix.
    line = next(i for i, text in enumerate(SCRIPT.read_text().splitlines(), start=1)
                if "similarities = tf.matmul(p1, p2" in text)
    assert f"(paired_losses.py:{line} in train_step multiplies" in named[0], named
    assert "under 2 replicas" in named[0]
    assert "all_gather" in named[0]
    runs = checked["runs"]
    # What it names is true: the pairs lost across slices change the loss.
    assert runs["contrastive-2"]["c_loss"][0] != pytest.approx(runs["contrastive-1"]["c_loss"][0],
                                                                rel=1e-3)
    # Per-example losses and attention within each example train as on one device.
    for case, key in (("per_example", "p_loss"), ("attention", "loss")):
        assert runs[f"{case}-2"][key] == pytest.approx(runs[f"{case}-1"][key], rel=1e-5), case

    unchecked, stderr_off = _result(tmp_path, MIRRORKIT_COMPAT_DISABLE="paired-step-losses")
    assert unchecked["applied"] == "disabled"
    assert NAMED not in stderr_off
    assert unchecked["runs"] == checked["runs"]   # the check changes no number
