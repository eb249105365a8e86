"""Controls of ``mirrorkit run``'s patches: each turned off by name, what the script then gets.

* ``script-strategies``: the script's ``tf.distribute.MirroredStrategy()`` is
  mirrorkit's 2-replica strategy; off, it is a strategy of its own that
  cannot even be entered inside mirrorkit's scope (RuntimeError).
* ``script-model-methods``: ``--scale-batch`` makes ``batch_size=8`` per
  replica (4 steps on 64 examples at 2 replicas); off, fit runs 8 steps.
* ``speed-up-fit``: several steps per call; off, 1.
* ``chief-only-callbacks``/``chief-only-model-save``/``chief-only-tf-checkpoint``
  and ``get-file-lock`` (multi-worker only): in force while the block runs,
  untouched when turned off. What breaks without them (two workers writing one
  file) is tests/runner/test_chief_saving.py::test_stock_saving_collides_without_mirrorkit_run
  and tests/runner/test_downloads.py.

All ``mirrorkit run`` cases share one fresh interpreter (one TensorFlow start).
"""

from __future__ import annotations

import json
import textwrap
from types import SimpleNamespace

import pytest
from conftest import run_snippet

from mirrorkit import _env
from mirrorkit.patching import engine
from mirrorkit.runner import chief_saving, downloads

STRATEGY_SCRIPT = """
import json, tensorflow as tf
strategy = tf.distribute.MirroredStrategy()
try:
    with strategy.scope():
        pass
    error = None
except Exception as err:
    error = type(err).__name__
print("STRAT " + json.dumps({"replicas": strategy.num_replicas_in_sync, "error": error}))
"""
FIT_SCRIPT = """
import json, numpy as np, keras
x, y = np.zeros((64, 4), "float32"), np.zeros((64, 1), "float32")
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(x, y, batch_size=8, epochs=1, verbose=0)
print("FIT " + json.dumps({"steps": int(model.optimizer.iterations.numpy()),
                           "spe": int(model.steps_per_execution)}))
"""
DRIVER = """
import json, sys
from mirrorkit import _env
from mirrorkit.runner import RunConfig, run_script
out = {}
for off in ("", "script-strategies", "script-model-methods", "speed-up-fit"):
    with _env.patch({_env.COMPAT_DISABLE: off}):
        for script in ("strategy_script.py", "fit_script.py"):
            run_script(RunConfig(script, simulate_cpus=2, scale_batch=True, speed_up_fit=True))
"""


def _cases(stdout: str) -> list[dict]:
    return [json.loads(line.split(" ", 1)[1]) for line in stdout.splitlines()
            if line.startswith(("STRAT ", "FIT "))]


@pytest.mark.slow
def test_run_patches_off_by_name(tmp_path):
    (tmp_path / "strategy_script.py").write_text(textwrap.dedent(STRATEGY_SCRIPT))
    (tmp_path / "fit_script.py").write_text(textwrap.dedent(FIT_SCRIPT))
    _, proc = run_snippet(DRIVER + "\nprint('RESULT {}')\n", tmp_path)
    cases = _cases(proc.stdout)
    assert len(cases) == 8, proc.stdout
    on, strategies_off, methods_off, speed_off = (cases[i:i + 2] for i in range(0, 8, 2))
    assert on == [{"replicas": 2, "error": None}, {"steps": 4, "spe": 4}]
    assert strategies_off[0]["error"] == "RuntimeError"   # a second strategy inside ours
    assert strategies_off[1] == on[1]
    assert methods_off[0] == on[0]
    assert methods_off[1]["steps"] == 8 and methods_off[1]["spe"] == 1
    assert speed_off == [on[0], {"steps": 4, "spe": 1}]


MULTI_WORKER = SimpleNamespace(is_multi_worker=True)


@pytest.mark.parametrize("name", ["chief-only-callbacks", "chief-only-model-save",
                                  "chief-only-tf-checkpoint"])
def test_chief_only_saving_off_by_name(name):
    import keras
    import tensorflow as tf

    stock = (keras.callbacks.ModelCheckpoint, keras.Model.save, tf.train.Checkpoint.save)
    with chief_saving.installed(MULTI_WORKER):
        assert engine.is_applied(name)
        assert keras.callbacks.ModelCheckpoint is not stock[0]
        assert engine.patched_by(keras.Model.save) == "chief-only-model-save"
        assert engine.patched_by(tf.train.Checkpoint.save) == "chief-only-tf-checkpoint"
    assert (keras.callbacks.ModelCheckpoint, keras.Model.save, tf.train.Checkpoint.save) == stock
    with _env.patch({_env.COMPAT_DISABLE: name}), chief_saving.installed(MULTI_WORKER):
        assert not engine.is_applied(name)
        now = {"chief-only-callbacks": keras.callbacks.ModelCheckpoint is stock[0],
               "chief-only-model-save": keras.Model.save is stock[1],
               "chief-only-tf-checkpoint": tf.train.Checkpoint.save is stock[2]}
        assert now[name], f"{name} turned off but still in force"
        assert sum(now.values()) == 1, "turning one off turned off the others"


def test_get_file_lock_off_by_name():
    from keras.src.utils import file_utils

    stock = file_utils.get_file
    with _env.patch({_env.COMPAT_DISABLE: "get-file-lock"}), downloads.installed(MULTI_WORKER):
        assert file_utils.get_file is stock
    with downloads.installed(MULTI_WORKER):
        assert engine.patched_by(file_utils.get_file) == "get-file-lock"
