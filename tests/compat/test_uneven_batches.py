"""``uneven-batch-losses``: a batch that does not split evenly trains as on one device.

``random_layers.py`` trains on 23 examples at ``batch_size=8``: each epoch
ends with 7 rows, 3/2/2 on 3 replicas. Upstream weighs each replica's mean
1/3, so that step moves the weights elsewhere than one device; with the fix
the final weights are plain Python's to 1e-6, and with it off by name they
are not. (Two replicas and two launched workers on the same script:
tests/compat/test_replica_random.py.)
"""

from __future__ import annotations

import sys

import pytest
from test_replica_random import SCRIPT, largest_difference, train

RUN3 = [sys.executable, "-m", "mirrorkit", "run", "--simulate-cpus", "3", str(SCRIPT)]


@pytest.mark.slow
def test_three_replicas_on_a_7_row_last_batch_train_as_one_device(tmp_path):
    (plain,) = train([sys.executable, str(SCRIPT)], tmp_path / "plain")
    (fixed,) = train(RUN3, tmp_path / "fixed")
    assert largest_difference(fixed, plain) < 1e-6
    (upstream,) = train(RUN3, tmp_path / "upstream",
                        MIRRORKIT_COMPAT_DISABLE="uneven-batch-losses")
    assert largest_difference(upstream, plain) > 1e-4
    # Its first epoch's logged loss already differs (one uneven step in it).
    assert abs(upstream["loss"][0] - plain["loss"][0]) > 1e-4
