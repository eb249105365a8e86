"""``mirrorkit.weights_in_sync``: every worker's weights compared bit for bit.

The real check runs 2 worker processes under ``mirrorkit launch`` and makes
worker 1 change one weight outside the strategy after training: the
collective report must name worker 1 on both workers, and the weights each
worker wrote must differ exactly there. The in-sync case is covered by every
multi-worker run (``mirrorkit train`` records it in metrics.json; the
multi-host tests assert it).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, clean_env

from mirrorkit.distribute.sync import checksums, compare

TRAIN = str(REPO / "tests" / "fixtures" / "launch_train.py")


@pytest.mark.fast
def test_compare_names_the_workers_that_differ_from_the_chief():
    assert compare([[1, 2], [1, 2]]) == {"workers": 2, "identical": True,
                                         "differing_workers": []}
    assert compare([[1, 2], [1, 3], [1, 2]])["differing_workers"] == [1]


@pytest.mark.fast
def test_checksums_see_a_one_ulp_change():
    import numpy as np

    w = np.linspace(-1, 1, 100, dtype="float32")
    nudged = w.copy()
    nudged[37] = np.nextafter(nudged[37], np.float32(2))
    assert checksums([w]) == checksums([w.copy()]) and checksums([w]) != checksums([nudged])


@pytest.mark.fast
def test_single_process_reports_one_worker():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    assert compare([checksums(model.get_weights())]) == __import__("mirrorkit").weights_in_sync(
        model)


@pytest.mark.slow
def test_a_worker_whose_weights_drift_is_named_on_every_worker(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--", "python", TRAIN,
         str(out), "--epochs", "1", "--steps", "4", "--perturb-rank", "1"],
        capture_output=True, text=True, env=clean_env(), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    w0, w1 = (json.loads((out / f"weights-{r}.json").read_text()) for r in (0, 1))
    # Only the first layer's kernel was changed, on worker 1 only.
    assert w0["checksums"][0] != w1["checksums"][0]
    assert w0["checksums"][1:] == w1["checksums"][1:]
    expected = {"workers": 2, "identical": False, "differing_workers": [1]}
    assert w0["in_sync"] == w1["in_sync"] == expected
