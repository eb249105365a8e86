"""LR scaling rules and WarmupSchedule: values, errors, config round trip, .keras save.

Everything runs in one fresh interpreter (schedules.py imports Keras); the
tests check its JSON findings.
"""

from __future__ import annotations

import pytest
from conftest import run_snippet

SCHEDULES = r"""
import json, os, sys, tempfile
import numpy as np
import mirrorkit
# Lazy: the top-level package must not have loaded Keras by itself.
out = {"lazy": "keras" not in sys.modules}
from mirrorkit import WarmupSchedule, scale_learning_rate
import keras

from snippet_helpers import errors

out["linear"] = scale_learning_rate(0.1, 256, 1024)
out["sqrt"] = scale_learning_rate(1e-3, 32, 128, rule="sqrt")
out["none"] = scale_learning_rate(0.1, 256, 1024, rule="none")
out["err_rule"] = errors(lambda: scale_learning_rate(0.1, 256, 512, rule="cubic"))
out["err_lr"] = errors(lambda: scale_learning_rate(0, 256, 512))
out["err_base"] = errors(lambda: scale_learning_rate(0.1, -1, 512))
out["err_global"] = errors(lambda: scale_learning_rate(0.1, 256, "512"))

def values(schedule, steps):
    return [round(float(schedule(s)), 6) for s in steps]

out["constant"] = values(WarmupSchedule(0.4, 100), [0, 25, 50, 99, 100, 1000])
out["from_base"] = values(WarmupSchedule(0.4, 100, initial_lr=0.1), [0, 50, 100])
out["no_warmup"] = values(WarmupSchedule(0.4, 0), [0, 10])
decay = keras.optimizers.schedules.PiecewiseConstantDecay([1000], [0.4, 0.04])
out["offset"] = values(WarmupSchedule(decay, 100), [50, 100, 1100, 1101])
out["absolute"] = values(WarmupSchedule(decay, 100, offset=False), [50, 100, 1000, 1001])
cosine = keras.optimizers.schedules.CosineDecay(0.4, decay_steps=1000)
out["cosine"] = values(WarmupSchedule(cosine, 100), [0, 50, 100, 600, 1100])
out["tensor_step"] = round(float(WarmupSchedule(0.4, 100)(keras.ops.convert_to_tensor(50, "int64"))), 6)

# K batches per optimizer step: Keras calls the schedule on every batch.
per_step = WarmupSchedule(decay, 100, initial_lr=0.1)
per_batch = WarmupSchedule(decay, 100, initial_lr=0.1, steps_per_update=4)
out["per_update"] = values(per_batch, [0, 3, 4, 203, 4403]) == values(per_step, [0, 0, 1, 50, 1100])
out["per_update_config"] = WarmupSchedule.from_config(per_batch.get_config()).steps_per_update
out["err_per_update"] = errors(lambda: WarmupSchedule(0.1, 5, steps_per_update=0))
out["err_steps"] = errors(lambda: WarmupSchedule(0.1, -5))
out["err_steps_float"] = errors(lambda: WarmupSchedule(0.1, 2.5))
out["err_initial"] = errors(lambda: WarmupSchedule(0.1, 5, initial_lr=-1))
out["err_schedule"] = errors(lambda: WarmupSchedule("fast", 5))

wrapped = WarmupSchedule(cosine, 100, initial_lr=0.05, offset=False)
config = wrapped.get_config()
json.dumps(config)  # the config must be plain JSON
back = WarmupSchedule.from_config(config)
out["round_trip_config"] = back.get_config() == config
out["round_trip_values"] = values(back, [0, 50, 500]) == values(wrapped, [0, 50, 500])
generic = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(wrapped))
out["generic_type"] = type(generic).__name__
out["wrapped_type"] = type(generic.schedule).__name__

# A model compiled with the schedule saves as .keras and reloads with it.
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile(keras.optimizers.SGD(learning_rate=wrapped), loss="mse")
model.fit(np.ones((8, 3), "float32"), np.ones((8, 1), "float32"), epochs=1, verbose=0, batch_size=4)
path = os.path.join(tempfile.mkdtemp(), "m.keras")
model.save(path)
loaded = keras.models.load_model(path)
lr = loaded.optimizer._learning_rate
out["loaded_type"] = type(lr).__name__
out["loaded_config"] = lr.get_config() == config
out["loaded_iterations"] = int(loaded.optimizer.iterations.numpy())
out["loaded_weights"] = all(np.array_equal(a, b) for a, b in zip(model.get_weights(), loaded.get_weights()))
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    result, proc = run_snippet(SCHEDULES, tmp_path_factory.mktemp("schedules"))
    return result


def test_schedules_load_lazily(found):
    assert found["lazy"]


def test_scaling_rules(found):
    assert found["linear"] == pytest.approx(0.4)
    assert found["sqrt"] == pytest.approx(0.002)
    assert found["none"] == pytest.approx(0.1)


def test_warmup_ramps_linearly_then_holds(found):
    assert found["constant"] == [0.0, 0.1, 0.2, 0.396, 0.4, 0.4]
    assert found["from_base"] == [0.1, 0.25, 0.4]      # Goyal et al.: from the base rate
    assert found["no_warmup"] == [0.4, 0.4]
    assert found["tensor_step"] == 0.2


def test_warmup_then_wrapped_schedule_offset_or_absolute(found):
    # offset=True: the decay's step 1000 boundary moves to 1100.
    assert found["offset"] == [0.2, 0.4, 0.4, 0.04]
    # offset=False: the boundary stays at the absolute step 1000.
    assert found["absolute"] == [0.2, 0.4, 0.4, 0.04]
    cosine = found["cosine"]
    assert cosine[:3] == [0.0, 0.2, 0.4] and cosine[3] == pytest.approx(0.2, abs=1e-6)
    assert cosine[4] == pytest.approx(0.0, abs=1e-6)


def test_config_round_trip_with_a_wrapped_schedule(found):
    assert found["round_trip_config"] and found["round_trip_values"]
    assert (found["generic_type"], found["wrapped_type"]) == ("WarmupSchedule", "CosineDecay")


def test_warmup_counts_optimizer_steps_under_gradient_accumulation(found):
    assert found["per_update"] and found["per_update_config"] == 4


def test_model_compiled_with_warmup_saves_and_reloads(found):
    assert found["loaded_type"] == "WarmupSchedule" and found["loaded_config"]
    assert found["loaded_iterations"] == 2 and found["loaded_weights"]


@pytest.mark.parametrize("key, fragment", [
    ("err_rule", "Received: rule='cubic'; accepted: linear, sqrt, none"),
    ("err_lr", "Received: base_lr=0"),
    ("err_base", "Received: base_batch=-1"),
    ("err_global", "Received: global_batch='512'"),
    ("err_steps", "Received: warmup_steps=-5"),
    ("err_steps_float", "Received: warmup_steps=2.5"),
    ("err_initial", "Received: initial_lr=-1"),
    ("err_schedule", "Received: schedule='fast'"),
    ("err_per_update", "Received: steps_per_update=0"),
])
def test_bad_arguments_raise_value_error_naming_the_value(found, key, fragment):
    assert found[key] is not None and fragment in found[key], found[key]
