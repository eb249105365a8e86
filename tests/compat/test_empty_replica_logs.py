"""A hand-written mean logged by a replica with no rows: nothing, not NaN.

keras.io's depth-estimation example logs the ``tf.reduce_mean`` of its batch's
errors through a ``keras.metrics.Mean`` in its own ``test_step``; a validation
set whose last batch has fewer rows than replicas leaves one replica with
none, whose mean is NaN, and every epoch's ``val_loss`` was NaN under 2
replicas (plain Python: finite). ``logged-step-losses`` weighs a mean over a
replica's rows by those rows (``compat/logged_losses.py``), so an empty
replica logs nothing, and the others make up the batch's mean.
"""

from __future__ import annotations

import math

import pytest
from conftest import REPO, compare_jobs, run_jobs

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "fixtures" / "scripts" / "empty_replica_mean.py"


def test_an_empty_replicas_hand_mean_logs_plain_pythons_validation_loss(tmp_path):
    found = run_jobs(compare_jobs(SCRIPT, off={"MIRRORKIT_COMPAT_DISABLE":
                                               "logged-step-losses"}), tmp_path)
    plain = found["plain"][0]
    assert all(math.isfinite(v) for v in plain["val_loss"]), plain
    for mode in ("run", "launch"):
        assert len(found[mode]) == (2 if mode == "launch" else 1), found[mode]
        for result in found[mode]:
            for key in ("loss", "val_loss"):
                assert result[key] == pytest.approx(plain[key], rel=1e-6), (mode, key, result)
    # The control: Keras alone logs the empty replica's NaN.
    assert all(math.isnan(v) for v in found["off"][0]["val_loss"]), found["off"]
