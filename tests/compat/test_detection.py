"""How a fix knows it is needed, and what happens when it cannot apply (issue: fixes that survive upstream changes).

Version table inside the tested Keras range, a behavioural probe outside it
(on 2 real replicas), applied in doubt otherwise; never Keras's source text.
A harmless upstream refactor (the patched method wrapped by another function)
keeps every fix working; a target that is gone makes the fix ``unavailable``
with one warning, and what depends on it turns off -- strategy creation never
fails.
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
    assert compat.FIXES["multi-step"].decide(None, keras_version="3.15.2").how == "assumed"


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
from keras.src.backend.tensorflow import trainer

# What a harmless upstream refactor looks like: the methods mirrorkit patches
# are wrapped by other functions with the same behaviour (and other source).
def same_behaviour(method):
    def wrapper(*args, **kwargs):
        return method(*args, **kwargs)
    return wrapper

for name in ("_maybe_symbolic_build", "_make_function"):
    setattr(trainer.TensorFlowTrainer, name,
            same_behaviour(getattr(trainer.TensorFlowTrainer, name)))

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
import dataclasses, json, logging, io
import mirrorkit
from mirrorkit import compat
from mirrorkit.compat import registry
from mirrorkit.training import TrainConfig, make_plan

log = io.StringIO()
logging.getLogger("mirrorkit").addHandler(logging.StreamHandler(log))
# Upstream renamed the method the multi-step fix patches.
gone = registry.FIXES["multi-step"]
registry.FIXES["multi-step"] = dataclasses.replace(
    gone, target=(gone.target[0], "_make_function_renamed", gone.target[2]))
strategy = mirrorkit.get_strategy(simulate_cpus=2)     # must not fail
again = compat.apply()
sizes = dict(train_examples=640, val_examples=64, replicas=2)
out = {"replicas": strategy.num_replicas_in_sync, "status": again,
       "works": compat.works("multi-step", 2),
       "auto_spe": make_plan(TrainConfig(), **sizes).steps_per_execution,
       "asked_spe": make_plan(TrainConfig(steps_per_execution=4), **sizes).steps_per_execution,
       "warnings": [line for line in log.getvalue().splitlines()
                    if line.startswith("mirrorkit: compat fix")],
       "fallback": [line for line in log.getvalue().splitlines() if "using 1 step" in line],
       "info": compat.decisions()["multi-step"]}
print("RESULT " + json.dumps(out))
"""


def test_a_missing_target_warns_once_turns_its_feature_off_and_never_breaks_the_strategy(
        tmp_path):
    result, _ = run_snippet(MISSING, tmp_path)
    assert result["replicas"] == 2
    assert result["status"]["multi-step"] == "unavailable"
    assert result["status"]["symbolic-build"] == "applied"
    assert result["works"] is False
    assert result["auto_spe"] == 1 and result["asked_spe"] == 1
    assert len(result["warnings"]) == 1, result["warnings"]
    warning = result["warnings"][0]
    assert "'multi-step'" in warning and "keras#19246" in warning and "keras 3." in warning
    assert "_make_function_renamed" in warning
    assert len(result["fallback"]) == 1, "an explicit steps_per_execution falls back, saying so"
    assert result["info"]["status"] == "unavailable"
