"""How a fix knows it is needed, and what happens when it cannot apply (issue: fixes that survive upstream changes).

Version table inside the tested Keras range, a behavioural probe outside it
(on 2 real replicas), applied in doubt otherwise; never Keras's source text.
A harmless upstream refactor (the patched method wrapped by another function)
keeps every fix working; a needed fix whose target is gone stops the strategy
with one message naming the fix and ``MIRRORKIT_COMPAT_DISABLE`` (never a fix
silently off while its bug is there).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import run_snippet

from mirrorkit import compat


@pytest.mark.fast
def test_tested_keras_is_decided_by_the_version_table():
    for fix in compat.FIXES.values():
        decision = fix.decide(None)
        assert (decision.needed, decision.how) == (True, "version table"), (fix.name, decision)
    assert compat.FIXES["multi-step"].decide(None, keras_version="3.15.1").how == "version table"
    # Past the newest tested version (a release after the pinned nightly): untested.
    assert compat.FIXES["multi-step"].decide(None, keras_version="3.16.1").how == "assumed"


@pytest.mark.fast
def test_untested_keras_with_nothing_to_probe_on_applies_the_fix():
    for fix in compat.FIXES.values():
        decision = fix.decide(None, keras_version="99.0")
        assert (decision.needed, decision.how) == (True, "assumed"), (fix.name, decision)
        assert "99.0 is untested" in decision.detail


PROBES = """
import json, keras, mirrorkit
from mirrorkit import compat
from mirrorkit.compat import probes
strategy = mirrorkit.get_strategy(simulate_cpus=2)
compat.revert()                                   # Keras's own code, as the probe must see it
keras.utils.set_random_seed(7)
before = float(keras.random.uniform(()))
keras.utils.set_random_seed(7)
out = {name: compat.FIXES[name].decide(strategy, keras_version="99.0").__dict__
       for name in ("symbolic-build", "multi-step")}
out["seed_untouched"] = float(keras.random.uniform(())) == before
# The probe measures behaviour: with the fixes in place the bugs are gone.
compat.apply(disable=[])
out["after_fix"] = [probes.uneven_global_batch(strategy), probes.several_steps_per_call(strategy)]
import tensorflow as tf
out["one_replica"] = probes.uneven_global_batch(tf.distribute.get_strategy())
print("RESULT " + json.dumps(out))
"""


def test_untested_keras_is_decided_by_a_probe_on_two_replicas(tmp_path):
    result, _ = run_snippet(PROBES, tmp_path)
    for name in ("symbolic-build", "multi-step"):
        assert result[name]["needed"] is True and result[name]["how"] == "probe", result
        assert "reproduced" in result[name]["detail"]
    assert result["after_fix"] == [False, False], result
    assert result["one_replica"] is None
    assert result["seed_untouched"], "a probe must not draw from Keras's global random state"


WRAPPED = """
import functools, json, numpy as np, keras
from mirrorkit.patching import targets

trainer = targets.owner("backend-trainer")
# What a harmless upstream refactor looks like: the methods mirrorkit patches
# are wrapped by other functions with the same behaviour (and other source).
def same_behaviour(method):
    def wrapper(*args, **kwargs):
        return method(*args, **kwargs)
    return wrapper

for name in ("_maybe_symbolic_build", "_make_function"):
    setattr(trainer, name, same_behaviour(getattr(trainer, name)))

import mirrorkit
from mirrorkit import compat
strategy = mirrorkit.get_strategy(simulate_cpus=2)
x = np.random.RandomState(0).rand(66, 4).astype("float32")
y = np.random.RandomState(1).randint(0, 3, 66)

def fit(batch, spe):
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=spe)
    return model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False).history["loss"]

out = {"status": compat.status(), "uneven": fit(33, 1), "multi_step": fit(22, 3)}
print("RESULT " + json.dumps(out))
"""


def test_a_wrapped_keras_method_keeps_its_fix(tmp_path):
    # Measured before: with source-text detection, this switched the fixes
    # off and a global batch of 33 on 2 replicas failed with the AddN error.
    result, _ = run_snippet(WRAPPED, tmp_path)
    assert result["status"] == dict.fromkeys(compat.FIXES, "applied"), result
    assert all(np.isfinite(v) for v in result["uneven"] + result["multi_step"])


MISSING = """
import dataclasses, json
import mirrorkit
from mirrorkit import compat
from mirrorkit.compat import registry
from mirrorkit.compat.failures import FixMissing
from mirrorkit.training import TrainConfig, make_plan

# Upstream renamed the method the multi-step fix patches, and the bug is still there.
gone = registry.FIXES["multi-step"]
registry.FIXES["multi-step"] = dataclasses.replace(
    gone, target=(gone.target[0], "_make_function_renamed"))
out = {}
try:
    mirrorkit.get_strategy(simulate_cpus=2)
    out["error"] = None
except FixMissing as err:
    out["error"] = str(err)
out["info"] = compat.decisions()["multi-step"]
# The way out the message names: run on without it, knowingly.
again = compat.apply(disable=["multi-step"])
sizes = dict(train_examples=640, val_examples=64, replicas=2)
out.update({"status": again, "works": compat.works("multi-step", 2),
            "auto_spe": make_plan(TrainConfig(), **sizes).steps_per_execution,
            "asked_spe": make_plan(TrainConfig(steps_per_execution=4), **sizes)
            .steps_per_execution})
print("RESULT " + json.dumps(out))
"""


def test_a_needed_fix_whose_target_is_gone_stops_the_strategy_naming_the_way_out(tmp_path):
    result, _ = run_snippet(MISSING, tmp_path)
    error = result["error"]
    assert error is not None, "a needed fix that cannot apply must not be silently off"
    assert "'multi-step'" in error and "keras#19246" in error and "keras 3." in error
    assert "_make_function_renamed" in error and "MIRRORKIT_COMPAT_DISABLE=multi-step" in error
    assert result["info"]["status"] == "unavailable"
    assert "stops with an error" in result["info"]["detail"], result["info"]
    # Turned off by name, what depends on it turns off too, saying so.
    assert result["status"]["multi-step"] == "disabled"
    assert result["status"]["symbolic-build"] == "applied"
    assert result["works"] is False
    assert result["auto_spe"] == 1 and result["asked_spe"] == 1
