"""The training fixes' behaviour probes see each bug in Keras's own code, and none once fixed.

One fresh process on 2 simulated CPUs runs every probe of
``mirrorkit.compat.probes_training`` (as the fix records name them) twice: with every fix
reverted (Keras's and TensorFlow's own code: each bug must show) and with
every fix applied (each must say the strategy behaves as one device). That is
the probes' own control: a probe that cannot see its bug, or that sees it
through the fix, fails here. It also checks that the probes leave Keras's
global random state and its tensor names as they found them.
"""

from __future__ import annotations

import pytest
from conftest import conv_mis_shapes_empty_batches, run_snippet

from mirrorkit.compat import FIXES

# This family's probes, as the fix records name them (the one table).
PROBES = {name: fix.probe for name, fix in FIXES.items()
          if fix.probe and fix.probe.__module__.startswith("mirrorkit.compat.probes_training")}

# (The bugs of multi-worker mode are probed across workers: tests/compat/test_probes_workers.py.)
# Bugs gone upstream from a Keras version on: none yet. step-variables is not gone on
# the Keras 3.16-dev nightly, only narrower: its optimizers make their variables under
# tf.init_scope (keras-team/keras#23087), so TensorFlow's custom-loop tutorial trains
# there under a stock 2-replica strategy, but a layer first built in the step still
# fails (upstream_repros/step_variables_layer_weights.py), and the probe builds both.
GONE_FROM: dict[str, tuple[int, int]] = {}

SNIPPET = """
import json, time
import keras, mirrorkit
from keras.src.utils import naming
from mirrorkit import compat
PROBES = {name: fix.probe for name, fix in compat.FIXES.items()
          if fix.probe and fix.probe.__module__.startswith("mirrorkit.compat.probes_training")}

strategy = mirrorkit.get_strategy(simulate_cpus=2)

def run_all():
    out, start = {}, time.perf_counter()
    for name, probe in PROBES.items():
        out[name] = probe(strategy)
    return out, time.perf_counter() - start

compat.revert()                                   # Keras's own code, as a probe must see it
keras.utils.set_random_seed(7)
draw = float(keras.random.uniform(()))
keras.utils.set_random_seed(7)
tensors = naming.get_uid("keras_tensor")          # the next tensor's number
upstream, upstream_seconds = run_all()
untouched = {"random": float(keras.random.uniform(())) == draw,
             "names": naming.get_uid("keras_tensor") == tensors + 1}
compat.apply(disable=[])
fixed, fixed_seconds = run_all()
print(f"probes: {upstream_seconds:.1f} s on Keras's own code, {fixed_seconds:.1f} s fixed")
print("RESULT " + json.dumps({"upstream": upstream, "fixed": fixed, "untouched": untouched,
                              "none": {n: p(None) for n, p in PROBES.items()},
                              "keras": keras.__version__,
                              "seconds": [upstream_seconds, fixed_seconds]}))
"""


@pytest.fixture(scope="module")
def probed(tmp_path_factory):
    result, proc = run_snippet(SNIPPET, tmp_path_factory.mktemp("probes"), timeout=600)
    print(next(line for line in proc.stdout.splitlines() if line.startswith("probes: ")))
    return result


def test_every_probe_sees_its_bug_in_keras_own_code(probed):
    expected = dict.fromkeys(PROBES, True)
    keras = tuple(int(part) for part in probed["keras"].split(".")[:2])
    expected.update({name: False for name, since in GONE_FROM.items() if keras >= since})
    if not conv_mis_shapes_empty_batches():
        # oneDNN picks its kernels by instruction set: on a CPU whose empty-batch
        # convolutions come out right (and with the TensorFlow 2.23-dev nightlies,
        # measured on this machine) the bug cannot show, and the probe says so.
        expected["empty-conv"] = False
    assert probed["upstream"] == expected


def test_every_probe_sees_the_fixed_code_behave_as_one_device(probed):
    expected = dict.fromkeys(PROBES, False)
    assert probed["fixed"] == expected


def test_no_strategy_is_undecided(probed):
    assert probed["none"] == dict.fromkeys(PROBES)


def test_probes_leave_keras_random_state_and_names_untouched(probed):
    assert probed["untouched"]["random"], "a probe must not draw from Keras's global random state"
    assert probed["untouched"]["names"], "a probe must not rename the script's tensors"
