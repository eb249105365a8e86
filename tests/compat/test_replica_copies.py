"""``replica-variable-copies``: a variable each replica assigns from its own rows is named.

``tests/fixtures/scripts/variable_copies.py`` keeps keras.io NNCLR's queue of
the batch's projections in a ``keras.Variable`` (aggregation "none") and
counts its steps in another. Under ``mirrorkit run`` on 2 replicas the
queue's assignment is named once, at the script's line; the counter (the same
value on every replica) and the moving statistics Keras's BatchNormalization
assigns inside the step are not. With the check off by name nothing is said
and training is the same: the check never changes an update.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, clean_env

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "fixtures" / "scripts" / "variable_copies.py"
LINE = "assigns the variable"


def _run(tmp_path, **env: str) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-m", "mirrorkit", "run", "--simulate-cpus", "2",
                           str(SCRIPT)], cwd=str(tmp_path), env=clean_env(**env),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(result[-1][len("RESULT "):]), proc.stderr


def test_a_queue_assigned_from_the_replicas_rows_is_named_once_and_a_counter_is_not(tmp_path):
    (tmp_path / "on").mkdir()
    (tmp_path / "off").mkdir()
    result, stderr = _run(tmp_path / "on")
    named = [line for line in stderr.splitlines() if LINE in line]
    assert len(named) == 1, stderr[-3000:]
    line = named[0]
    assert "variable_copies.py:" in line and "in train_step" in line, line
    assert "aggregation 'none'" in line and "2 replicas" in line and "all_gather" in line
    assert result["seen"] == 8.0     # 256 rows / 64 per step x 2 epochs, on every replica
    # The control: off by name, nothing is said, and the updates are the same.
    off, stderr_off = _run(tmp_path / "off", MIRRORKIT_COMPAT_DISABLE="replica-variable-copies")
    assert LINE not in stderr_off
    assert off == result
