"""``mirrorkit run --sync-batch-norm``: a model with BatchNormalization trains as on one device.

One small CNN with two BatchNormalization layers (tests/fixtures/scripts/
batch_norm_cnn.py), three ways at once: ``python script.py`` (the
reference); ``mirrorkit run --sync-batch-norm --compare-one-device`` on 2
replicas (the losses, moving means and weights of plain Python, and the
one-device check says "same"); and, the control, ``mirrorkit run`` without
the flag, whose per-replica statistics move every number (one line says so
and names the flag). In-process: an explicit ``synchronized`` argument is kept
and nothing outlives the block; only trainable, unsynchronised layers count
as per-replica.
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO, clean_env, result_line

SCRIPT = REPO / "tests" / "fixtures" / "scripts" / "batch_norm_cnn.py"
RUN = [sys.executable, "-m", "mirrorkit", "run", "--simulate-cpus", "2"]
COMMANDS = {
    "plain": [sys.executable, str(SCRIPT)],
    "sync": [*RUN[:4], "--sync-batch-norm", "--compare-one-device", *RUN[4:], str(SCRIPT)],
    "per_replica": [*RUN, str(SCRIPT)],
}


def _run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=str(SCRIPT.parent), env=clean_env(),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_synchronised_batch_norm_gives_plain_pythons_numbers_and_per_replica_does_not():
    with ThreadPoolExecutor(max_workers=2) as pool:
        procs = dict(zip(COMMANDS, pool.map(_run, COMMANDS.values())))
    for name, proc in procs.items():
        assert proc.returncode == 0, (name, proc.stdout[-2000:], proc.stderr[-3000:])
    plain, sync, per_replica = (result_line(procs[n].stdout) for n in COMMANDS)
    assert plain["synchronized"] == [False, False]
    assert sync["synchronized"] == [True, True]
    for key in ("loss", "moving_mean"):
        assert sync[key] == pytest.approx(plain[key], rel=2e-6), key
    assert sync["evaluate"] == pytest.approx(plain["evaluate"], rel=2e-6)
    assert sync["weights"] == pytest.approx(plain["weights"], rel=1e-6)
    stderr = procs["sync"].stderr
    assert "synchronise their statistics across the 2 replicas (--sync-batch-norm)" in stderr
    assert "mirrorkit: one-device check: same (" in stderr, stderr[-2000:]
    # Without the flag each replica normalises its own 16 examples, and one line says so.
    assert per_replica["loss"][0] != pytest.approx(plain["loss"][0], rel=1e-4)
    assert per_replica["moving_mean"] != pytest.approx(plain["moving_mean"], rel=1e-3)
    assert procs["per_replica"].stderr.count("normalise each replica's slice of the batch") == 1
    assert "2 BatchNormalization layers of 'sequential'" in procs["per_replica"].stderr
    assert "--sync-batch-norm gives plain Python's numbers" in procs["per_replica"].stderr
    assert "normalise each replica's slice" not in stderr


@pytest.mark.fast
def test_an_explicit_setting_is_kept_and_nothing_outlives_the_block():
    keras = pytest.importorskip("keras")
    from mirrorkit.runner.sync_bn import synchronized_batch_norm

    class Mine(keras.layers.BatchNormalization):
        def __init__(self, **kwargs):
            super().__init__(momentum=0.9, **kwargs)

    with synchronized_batch_norm(True):
        assert keras.layers.BatchNormalization().synchronized
        assert Mine().synchronized                       # a subclass's super().__init__
        assert not keras.layers.BatchNormalization(synchronized=False).synchronized
    assert not keras.layers.BatchNormalization().synchronized
    with synchronized_batch_norm(False):
        assert not keras.layers.BatchNormalization().synchronized


@pytest.mark.fast
def test_only_trainable_unsynchronised_batch_norm_is_per_replica():
    keras = pytest.importorskip("keras")
    from mirrorkit.strategy_facts import per_replica_batch_norm

    frozen = keras.layers.BatchNormalization(name="frozen")
    frozen.trainable = False   # inference mode: the same statistics on any slice
    inner = keras.Sequential([keras.layers.BatchNormalization(name="inner")], name="block")
    model = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(name="own"),
                              keras.layers.BatchNormalization(name="synced", synchronized=True),
                              frozen, inner])
    assert per_replica_batch_norm(model) == ("own", "inner")
