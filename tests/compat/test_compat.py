"""mirrorkit.compat: each fix is needed, idempotent, disableable, and proven on 2 real workers.

The multi-worker test disables one fix at a time and asserts the upstream
error still happens -- the day it stops happening, upstream has fixed the bug
and the fix can go. How a fix decides it is needed: test_detection.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from conftest import clean_env
from workers import run_workers

import mirrorkit
from mirrorkit import _env, compat


@pytest.fixture
def restore_keras():
    yield
    compat.revert()


def test_importing_compat_does_not_import_tensorflow():
    code = ("import sys, mirrorkit, mirrorkit.compat\n"
            "print('tensorflow' in sys.modules, 'keras' in sys.modules,"
            " mirrorkit.fix_multi_worker.__module__ == 'mirrorkit.distribute.fixes',"
            " 'fix_multi_worker' in mirrorkit.__all__)")
    out = subprocess.run([sys.executable, "-c", code], env=clean_env(),
                         capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False", "True", "True"]


@pytest.mark.fast
def test_apply_is_idempotent_and_revert_restores_keras(restore_keras):
    from mirrorkit.patching import targets

    trainer, module = targets.owner("backend-trainer"), targets.owner("backend-trainer-module")

    def current():
        return (trainer._maybe_symbolic_build, module.reduce_per_replica, trainer._make_function)

    original = current()
    assert compat.status() == dict.fromkeys(compat.FIXES, "not-applied")
    assert compat.apply(disable=[]) == dict.fromkeys(compat.FIXES, "applied")
    patched = current()
    assert all(p is not o for p, o in zip(patched, original))
    compat.apply(disable=[])
    assert current() == patched
    assert compat.status() == dict.fromkeys(compat.FIXES, "applied")
    compat.revert()
    assert current() == original


@pytest.mark.fast
def test_disable_by_argument_and_by_environment(restore_keras):
    assert compat.apply(disable=["scalar-logs"]) == {
        **dict.fromkeys(compat.FIXES, "applied"), "scalar-logs": "disabled"}
    # Disabling later reverts a fix applied earlier in the process.
    assert compat.apply(disable="all") == dict.fromkeys(compat.FIXES, "disabled")
    assert compat.status()["symbolic-build"] == "not-applied"
    with _env.patch({_env.COMPAT: "off", _env.COMPAT_DISABLE: None}):
        assert set(compat.apply().values()) == {"disabled"}
    with _env.patch({_env.COMPAT: None, _env.COMPAT_DISABLE: "symbolic-build"}):
        assert compat.apply() == {**dict.fromkeys(compat.FIXES, "applied"),
                                  "symbolic-build": "disabled"}
    with _env.patch({_env.COMPAT: None, _env.COMPAT_DISABLE: None}):
        assert compat.apply() == dict.fromkeys(compat.FIXES, "applied")


@pytest.mark.fast
def test_unknown_fix_names_are_rejected_with_the_valid_ones(restore_keras):
    from mirrorkit.patching import PATCHES

    with pytest.raises(ValueError, match="accepted: all, " + ", ".join(PATCHES)):
        compat.apply(disable=["scalar_logs"])
    with _env.patch({_env.COMPAT_DISABLE: "nope"}):
        with pytest.raises(ValueError, match="MIRRORKIT_COMPAT_DISABLE"):
            compat.apply()


UNEVEN = """
import json, numpy as np, keras
import mirrorkit
from mirrorkit import compat
from snippet_helpers import without_fix
strategy = mirrorkit.get_strategy(simulate_cpus=3)    # applies the fixes
x = np.random.RandomState(0).rand(96, 8).astype("float32")
y = np.random.RandomState(1).randint(0, 10, 96)

def fit(batch_size=32):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(10)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    # 32 over 3 replicas is split 11/11/10; 48 evenly, 16 each.
    hist = model.fit(x, y, batch_size=batch_size, epochs=2, verbose=0, shuffle=False)
    return hist.history["loss"], [w.tolist() for w in model.get_weights()]

out = {"applied": compat.status()["symbolic-build"], "losses": fit()[0], "even": fit(48)}
# Building from the input's spec (symbolic-build-order) avoids the failing peek too.
out["upstream"] = without_fix("symbolic-build,symbolic-build-order", fit)
# Where upstream works (an even split), the patched build changes nothing.
out["even_upstream"] = fit(48)
print("RESULT " + json.dumps(out))
"""


def test_uneven_split_over_local_replicas_needs_the_symbolic_build_fix(tmp_path):
    # Not only multi-worker: a global batch that does not divide by the local
    # replica count breaks Keras 3 fit under MirroredStrategy too.
    from conftest import run_snippet

    result, _ = run_snippet(UNEVEN, tmp_path)
    assert result["applied"] == "applied"
    assert all(np.isfinite(v) for v in result["losses"]) and len(result["losses"]) == 2
    assert "must have the same size and shape" in result["upstream"]
    # 3 replicas run the patched code path; on an even split it must equal upstream's.
    (loss, weights), (plain_loss, plain_weights) = result["even"], result["even_upstream"]
    assert loss == pytest.approx(plain_loss, rel=1e-6)
    assert all(np.allclose(a, b, atol=1e-7) for a, b in zip(weights, plain_weights))


MULTI_STEP = """
import json, numpy as np, keras, tensorflow as tf
import mirrorkit
from mirrorkit import compat
from snippet_helpers import without_fix
strategy = mirrorkit.get_strategy(simulate_cpus=2)    # applies the fixes
x = np.random.RandomState(0).rand(200, 8).astype("float32")
y = np.random.RandomState(1).randint(0, 3, 200)
# Finite, partial last batch: 7 steps an epoch, i.e. 4 + 3 at 4 per call.
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)

def run(steps_per_execution):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(3)])
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"], steps_per_execution=steps_per_execution)
    hist = model.fit(data, epochs=2, verbose=0)
    return (model.get_weights(), hist.history["loss"], model.evaluate(data, verbose=0),
            int(model.optimizer.iterations.numpy()))

one, four = run(1), run(4)
# The fix's fallback for batches its loop's optional would not mirror: the
# first step of each call before the loop.
from mirrorkit.compat import multistep
multistep.looser_spec, looser_spec = (lambda static, loose: None), multistep.looser_spec
fallback = run(4)
multistep.looser_spec = looser_spec
out = {"applied": compat.status()["multi-step"],
       "max_diff": max(float(np.abs(a - b).max()) for a, b in zip(one[0], four[0])),
       "fallback_max_diff": max(float(np.abs(a - b).max()) for a, b in zip(one[0], fallback[0])),
       "losses": [one[1], four[1], fallback[1]], "evaluate": [one[2], four[2]],
       "iterations": [one[3], four[3], fallback[3]],
       "upstream": without_fix("multi-step", lambda: run(4))}
print("RESULT " + json.dumps(out))
"""


def test_several_steps_per_execution_on_two_replicas_need_the_multi_step_fix(tmp_path):
    # keras#19246: with the fix, 4 steps per call train bit for bit like 1 step
    # per call (and stop at the end of a finite dataset); without it Keras fails.
    from conftest import run_snippet

    result, _ = run_snippet(MULTI_STEP, tmp_path)
    assert result["applied"] == "applied"
    assert result["iterations"] == [14, 14, 14]
    assert result["max_diff"] < 1e-6 and result["fallback_max_diff"] < 1e-6, result
    assert result["losses"][0] == pytest.approx(result["losses"][1], rel=1e-5)
    assert result["losses"][0] == pytest.approx(result["losses"][2], rel=1e-5)
    assert result["evaluate"][0] == pytest.approx(result["evaluate"][1], rel=1e-5)
    assert compat.FIXES["multi-step"].error in result["upstream"]


@pytest.mark.fast
def test_failure_detection_settings_are_validated():
    with pytest.raises(ValueError, match="peer_timeout must be a positive number"):
        mirrorkit.configure_failure_detection(peer_timeout=0)
    with _env.patch({_env.COLLECTIVE_TIMEOUT: "soon"}):
        with pytest.raises(ValueError, match="MIRRORKIT_COLLECTIVE_TIMEOUT must be a positive"):
            mirrorkit.configure_failure_detection()
    with _env.patch({_env.JOIN_TIMEOUT: "-3"}):
        with pytest.raises(ValueError, match="MIRRORKIT_JOIN_TIMEOUT"):
            mirrorkit.configure_failure_detection()


_WORKER = textwrap.dedent('''
    import json, os, sys
    import tensorflow as tf

    # A user-created strategy, fixed with the public call.
    import mirrorkit
    from mirrorkit import compat
    compat.configure_failure_detection()
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    import keras
    import numpy as np

    x = np.random.RandomState(0).rand(96, 8, 8, 1).astype("float32")
    y = np.random.RandomState(1).randint(0, 10, 96)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(),
                                  keras.layers.Dense(10)])
        model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])

    def attempt(step):
        try:
            step()
            return "ok"
        except Exception as err:  # the upstream errors are what we record
            return f"{type(err).__name__}: {err}"[:400]

    fit = lambda: model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    out = {}
    # Each upstream failure happens before any collective runs (while tracing
    # or building), on every worker alike, so the cluster stays usable.
    os.environ["MIRRORKIT_COMPAT"] = "off"            # the environment switch
    out["status_off"] = compat.apply()
    out["no_fixes"] = attempt(fit)
    del os.environ["MIRRORKIT_COMPAT"]
    # Building from the input's spec (symbolic-build-order) avoids the failing peek too.
    out["status_scalar_only"] = mirrorkit.fix_multi_worker(
        disable=["symbolic-build", "symbolic-build-order"])
    out["without_symbolic_build"] = attempt(fit)
    out["status_build_only"] = compat.apply(disable=["scalar-logs"])
    out["without_scalar_logs"] = attempt(fit)
    out["status_all"] = compat.apply()
    out["fit"] = attempt(fit)
    out["evaluate"] = model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)
    # The logs reduced over workers equal one device's on all the data.
    single = keras.models.clone_model(model)
    single.set_weights(model.get_weights())
    single.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                   metrics=["accuracy"])
    out["evaluate_one_device"] = single.evaluate(x, y, batch_size=32, verbose=0,
                                                 return_dict=True)
    pred = model.predict(x, batch_size=32, verbose=0)
    out["predict_max_diff"] = float(np.abs(pred - model(x).numpy()).max())

    # keras#19246: several steps per call train exactly like one step per call
    # (3 steps an epoch at 2 per call: one full call, one short call).
    start = model.get_weights()

    def fit_with(steps_per_execution):
        model.set_weights(start)
        with strategy.scope():
            model.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          metrics=["accuracy"], steps_per_execution=steps_per_execution)
        fit()
        return model.get_weights()

    pairs = zip(fit_with(1), fit_with(2))
    out["multi_step_max_diff"] = max(float(np.abs(a - b).max()) for a, b in pairs)
    print("RESULT " + json.dumps(out), flush=True)
''')


@pytest.mark.slow
def test_each_fix_is_needed_and_sufficient_on_two_workers(tmp_path):
    script = tmp_path / "compat_worker.py"
    script.write_text(_WORKER)
    results, report = run_workers(script, 2, timeout=180, cwd=tmp_path)
    assert all(r.returncode == 0 for r in results), report
    outs = [json.loads(r.stdout.split("RESULT ", 1)[1]) for r in results]
    assert outs[0]["evaluate"] == outs[1]["evaluate"], report
    for out in outs:
        assert set(out["status_off"].values()) == {"disabled"}
        assert out["status_scalar_only"] == {**dict.fromkeys(compat.FIXES, "applied"),
                                             "symbolic-build": "disabled",
                                             "symbolic-build-order": "disabled"}
        build, scalar = compat.FIXES["symbolic-build"], compat.FIXES["scalar-logs"]
        # keras#20585: the symbolic build reduces a PerReplica data batch.
        assert build.error in out["no_fixes"], out
        assert build.error in out["without_symbolic_build"], out
        # tensorflow#72388: scalar logs reduced on axis 0.
        assert scalar.error in out["without_scalar_logs"], out
        assert out["status_all"] == dict.fromkeys(compat.FIXES, "applied")
        assert out["fit"] == "ok", out
        assert out["predict_max_diff"] < 1e-5, out
        assert out["evaluate"] == pytest.approx(out["evaluate_one_device"], rel=1e-5), out
        assert out["multi_step_max_diff"] < 1e-6, out
