"""The multi-worker probes see their bugs on 2 real workers, none once fixed, and none alone.

``scalar-logs`` and ``static-batch-shapes`` show only under a
``MultiWorkerMirroredStrategy`` in multi-worker mode, so their probes
(``mirrorkit.compat.probes_workers``, as the fix records name them) run in 2
worker processes on loopback (a TF_CONFIG cluster, tests/workers.py). Each
worker probes at the same moment, as every worker does when it decides its
fixes: with every fix reverted (Keras's and TensorFlow's own code: each bug
must show, also through ``Fix.decide`` on a Keras outside the tested range),
then with every fix applied (each must say the strategy behaves as one
device). That is the probes' own control: a probe that always says True fails
the second half, one that always says None the first. In one process
(MirroredStrategy on 2 simulated CPUs, a one-worker
MultiWorkerMirroredStrategy, no strategy) both must say they cannot tell.
"""

from __future__ import annotations

import textwrap

import pytest
from conftest import result_line, run_snippet
from workers import run_workers

from mirrorkit.compat import FIXES

pytestmark = pytest.mark.slow

# This family's probes, as the fix records name them (the one table).
PROBES = {name: fix.probe for name, fix in FIXES.items()
          if fix.probe and fix.probe.__module__ == "mirrorkit.compat.probes_workers"}

# The worker's probes, read from the same records.
_PROBES = textwrap.dedent('''
    import json
    import keras
    import tensorflow as tf
    from keras.src.utils import naming
    import mirrorkit
    from mirrorkit import compat
    from mirrorkit.strategy_facts import in_multi_worker_mode
    PROBES = {name: fix.probe for name, fix in compat.FIXES.items()
              if fix.probe and fix.probe.__module__ == "mirrorkit.compat.probes_workers"}
''')

_WORKER = _PROBES + textwrap.dedent('''
    mirrorkit.configure_failure_detection()   # a lost peer fails the test, not hangs it
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    out = {"multi_worker": in_multi_worker_mode(strategy)}

    compat.revert()                           # Keras's own code, as a probe must see it
    keras.utils.set_random_seed(7)
    draw = float(keras.random.uniform(()))
    keras.utils.set_random_seed(7)
    tensors = naming.get_uid("keras_tensor")
    out["keras"] = {name: probe(strategy) for name, probe in PROBES.items()}
    out["untouched"] = {"random": float(keras.random.uniform(())) == draw,
                        "names": naming.get_uid("keras_tensor") == tensors + 1}
    # As each worker decides on a Keras outside the tested range: by the probe.
    decided = {name: compat.FIXES[name].decide(strategy, keras_version="9.0")
               for name in PROBES}
    out["decided"] = {name: [d.how, d.needed] for name, d in decided.items()}

    out["status"] = compat.apply(strategy=strategy, disable=[])
    out["fixed"] = {name: probe(strategy) for name, probe in PROBES.items()}
    print("RESULT " + json.dumps(out), flush=True)
''')

_ONE_PROCESS = _PROBES + textwrap.dedent('''
    strategies = {"mirrored": mirrorkit.get_strategy(simulate_cpus=2),
                  # No TF_CONFIG: one worker (one replica: its CPUs are one device).
                  "one_worker": tf.distribute.MultiWorkerMirroredStrategy()}
    out = {"replicas": {k: s.num_replicas_in_sync for k, s in strategies.items()},
           "multi_worker": {k: in_multi_worker_mode(s) for k, s in strategies.items()}}
    compat.revert()
    out["keras"] = {k: {name: probe(s) for name, probe in PROBES.items()}
                    for k, s in strategies.items()}
    compat.apply(disable=[])
    out["fixed"] = {k: {name: probe(s) for name, probe in PROBES.items()}
                    for k, s in strategies.items()}
    out["none"] = {name: probe(None) for name, probe in PROBES.items()}
    print("RESULT " + json.dumps(out))
''')


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    """Each of 2 workers' results: the probes on Keras's own code, then with the fixes."""
    tmp = tmp_path_factory.mktemp("probes_workers")
    script = tmp / "probe_worker.py"
    script.write_text(_WORKER)
    results, report = run_workers(script, 2, timeout=240, cwd=tmp)
    assert [r.returncode for r in results] == [0, 0], report
    return [result_line(r.stdout) for r in results]


def test_the_records_name_both_probes():
    assert sorted(PROBES) == ["scalar-logs", "static-batch-shapes"]


def test_every_worker_sees_each_bug_in_keras_own_code(probed):
    for out in probed:
        assert out["multi_worker"] is True
        assert out["keras"] == dict.fromkeys(PROBES, True), out
        assert out["decided"] == {name: ["probe", True] for name in PROBES}, out


def test_every_worker_sees_the_fixed_code_behave_as_one_device(probed):
    for out in probed:
        assert {name: out["status"][name] for name in PROBES} == dict.fromkeys(PROBES, "applied")
        assert out["fixed"] == dict.fromkeys(PROBES, False), out


def test_probes_leave_keras_random_state_and_names_untouched(probed):
    for out in probed:
        assert out["untouched"]["random"], "a probe must not draw from Keras's global random state"
        assert out["untouched"]["names"], "a probe must not rename the script's tensors"


def test_one_process_cannot_tell(tmp_path):
    out, _ = run_snippet(_ONE_PROCESS, tmp_path, timeout=300)
    assert out["replicas"] == {"mirrored": 2, "one_worker": 1}
    assert out["multi_worker"] == {"mirrored": False, "one_worker": False}
    undecided = dict.fromkeys(PROBES)
    assert out["keras"] == out["fixed"] == {"mirrored": undecided, "one_worker": undecided}
    assert out["none"] == undecided
