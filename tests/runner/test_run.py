"""`mirrorkit run`: unmodified scripts under a strategy, argv/exit code/batch semantics.

The real CLI runs in fresh processes (the CPU split is per process), all
started at once by one fixture; user mistakes are checked in-process with
CliRunner (they are reported before TensorFlow is imported).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO, clean_env, result_line

from mirrorkit.cli import cli

# A plain Keras script: no mirrorkit, no tf.distribute.
PLAIN = r"""
import json, os, sys
print("ARGV " + json.dumps(sys.argv))
print("NAME " + __name__)
import helper_next_to_script  # importable because the script's dir is on sys.path
import keras
import numpy as np
import tensorflow as tf

class Count(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.n = {"train": 0, "test": 0, "predict": 0}
    def on_train_batch_end(self, batch, logs=None): self.n["train"] += 1
    def on_test_batch_end(self, batch, logs=None): self.n["test"] += 1
    def on_predict_batch_end(self, batch, logs=None): self.n["predict"] += 1

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
model.compile("sgd", "mse")
x, y = np.zeros((64, 4), "float32"), np.zeros((64, 2), "float32")
steps = {}
c = Count()
model.fit(x, y, batch_size=8, epochs=1, verbose=0, callbacks=[c])
model.evaluate(x, y, batch_size=8, verbose=0, callbacks=[c])
model.predict(x, batch_size=8, verbose=0, callbacks=[c])
steps["arrays_batch_8"] = c.n
c = Count()
model.fit(x, y, epochs=1, verbose=0, callbacks=[c])          # Keras's default batch, 32
steps["arrays_default_batch"] = c.n
c = Count()
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
model.fit(ds, epochs=1, verbose=0, callbacks=[c])
model.evaluate(ds, verbose=0, callbacks=[c])
steps["dataset_batch_8"] = c.n
print("REPLICAS %d" % model.distribute_strategy.num_replicas_in_sync)
print("STEPS " + json.dumps(steps))
print("SCALE_ENV " + os.environ.get("MIRRORKIT_SCALE_BATCH", "unset"))
sys.exit(int(os.environ.get("PLAIN_EXIT", "0")))
"""

BOOM = """\
def inner():
    return 1 / 0


inner()
"""

# The library entry point, in one process: restores everything afterwards and
# lets SystemExit / script errors out as documented.
LIBRARY = r"""
import json, os, sys
import keras, tensorflow as tf
from mirrorkit.runner import RunConfig, ScriptFailed, run_script
out = {}
argv, path = list(sys.argv), list(sys.path)
seen = []
try:
    run_script(RunConfig(sys.argv[1], args=("a", "--b"), simulate_cpus=2, scale_batch=True),
               on_start=lambda rt, scaled: seen.append([rt.strategy, rt.replicas, scaled]))
except SystemExit as exit:
    out["exit"] = exit.code
out["on_start"] = seen
out["fit_restored"] = "fit" not in keras.Model.__dict__ and "predict" not in keras.Model.__dict__
out["argv_restored"] = sys.argv == argv
out["path_restored"] = sys.path == path
out["scope_left"] = not tf.distribute.has_strategy()
out["env_restored"] = [k for k in os.environ if k.startswith("MIRRORKIT_")]
try:
    run_script(RunConfig(sys.argv[2], simulate_cpus=2))
except ScriptFailed as failed:
    out["failed_message"] = str(failed)
    out["failed_traceback"] = failed.traceback_text
print("RESULT " + json.dumps(out))
"""


# Strategies the script creates itself, and the fit safeguards, seen from
# inside a script run through the library (so restoration can be checked).
OWN = r"""
import json, keras, numpy as np, tensorflow as tf
out = {}
ours = tf.distribute.get_strategy()
out["ours"] = [type(ours).__name__, ours.num_replicas_in_sync]
out["adopted"] = {
    "MirroredStrategy()": tf.distribute.MirroredStrategy() is ours,
    "cross_device_ops": tf.distribute.MirroredStrategy(
        cross_device_ops=tf.distribute.ReductionToOneDevice()) is ours,
    "same devices": tf.distribute.MirroredStrategy(["/cpu:1", "/cpu:0"]) is ours,
    "MultiWorkerMirroredStrategy()": tf.distribute.MultiWorkerMirroredStrategy() is ours,
    "experimental": tf.distribute.experimental.MultiWorkerMirroredStrategy() is ours,
}
out["isinstance"] = [isinstance(ours, tf.distribute.MirroredStrategy),
                     isinstance(ours, tf.distribute.MultiWorkerMirroredStrategy),
                     issubclass(type(ours), tf.distribute.MirroredStrategy)]

def bn_model():
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                          keras.layers.BatchNormalization(), keras.layers.Dense(1)])
    m.compile("sgd", "mse")
    return m

class Count(keras.callbacks.Callback):
    def on_train_begin(self, logs=None): self.n = {"train": 0, "test": 0}
    def on_train_batch_end(self, batch, logs=None): self.n["train"] += 1
    def on_test_batch_end(self, batch, logs=None): self.n["test"] += 1

rng = np.random.default_rng(0)
x, y = rng.random((43, 3), "float32"), rng.random((43, 1), "float32")
w = rng.random(43).astype("float32")
model = bn_model()
c = Count()
# Keras validates on the last 22 (floor(43 * 0.5) = 21 train); 21 % 4 == 1 < 2
# replicas: the one trailing training example is left out (5 batches, not 6).
history = model.fit(x, y, sample_weight=w, batch_size=4, validation_split=0.5,
                    epochs=1, verbose=0, callbacks=[c])
out["trim_batches"] = c.n
out["val_loss_is_last_22"] = abs(history.history["val_loss"][0] - model.evaluate(
    x[21:], y[21:], sample_weight=w[21:], batch_size=4, verbose=0)) < 1e-5
c = Count()
model.fit(x[:40], y[:40], batch_size=4, epochs=1, verbose=0, callbacks=[c])
out["even_batches"] = c.n["train"]

# A dataset is not rewritten (last batch: 1 example). After Dense, BatchNormalization
# turns the weights into NaN (warned); after Conv2D it fails (the error explains).
dense = bn_model()
dense.fit(tf.data.Dataset.from_tensor_slices((x[:21], y[:21])).batch(4), epochs=2, verbose=0)
out["dataset_dense_nan"] = bool(np.isnan(dense.get_weights()[0]).any())
conv = keras.Sequential([keras.Input((4, 4, 1)), keras.layers.Conv2D(2, 3),
                         keras.layers.BatchNormalization(), keras.layers.Flatten(),
                         keras.layers.Dense(1)])
conv.compile("sgd", "mse")
try:
    conv.fit(tf.data.Dataset.from_tensor_slices((np.zeros((21, 4, 4, 1)), y[:21])).batch(4),
             verbose=0)
    out["dataset_conv"] = "trained"
except tf.errors.InvalidArgumentError as err:
    out["dataset_conv"] = getattr(err, "__notes__", [])

# A strategy pinned to devices is used as written; mirrorkit steps aside.
one = tf.distribute.OneDeviceStrategy("/cpu:0")
out["after_pinned_has_strategy"] = tf.distribute.has_strategy()
with one.scope():
    out["one_device_replicas"] = bn_model().distribute_strategy.num_replicas_in_sync
explicit = tf.distribute.MirroredStrategy(["/cpu:1"])
with explicit.scope():
    m = bn_model()
m.fit(x, y, batch_size=4, verbose=0)
out["explicit"] = [explicit is ours, m.distribute_strategy.num_replicas_in_sync]
print("OWN " + json.dumps(out))
"""

OWN_DRIVER = r"""
import json, sys
import tensorflow as tf
from mirrorkit.runner import RunConfig, run_script
original = tf.distribute.MirroredStrategy, tf.distribute.experimental.MultiWorkerMirroredStrategy
run_script(RunConfig(sys.argv[1], simulate_cpus=2))
restored = {
    "classes_restored": (tf.distribute.MirroredStrategy,
                         tf.distribute.experimental.MultiWorkerMirroredStrategy) == original
                        and tf.compat.v2.distribute.MirroredStrategy is original[0],
    "scope_left": not tf.distribute.has_strategy(),
}
# Does this CPU mis-shape empty-batch convolutions? The fix's own probe, asked
# afresh (not the answer the run cached), here rather than in a process of its own
# (conftest.conv_mis_shapes_empty_batches asks the same in a new interpreter).
from mirrorkit.compat import empty_conv
empty_conv._broken = None
print("RESULT " + json.dumps({**restored, "conv_mis_shapes": empty_conv._kernel_is_broken()}))
"""


def _start(args: list[str], cwd: Path, **env: str | None) -> subprocess.Popen:
    return subprocess.Popen(args, cwd=str(cwd), env=clean_env(**env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    (tmp / "scripts").mkdir()
    plain = tmp / "scripts" / "plain.py"
    plain.write_text(PLAIN)
    (tmp / "scripts" / "helper_next_to_script.py").write_text("")
    boom = tmp / "scripts" / "boom.py"
    boom.write_text(BOOM)
    (tmp / "library.py").write_text(LIBRARY)
    (tmp / "scripts" / "own.py").write_text(OWN)
    (tmp / "own_driver.py").write_text(OWN_DRIVER)
    mk = [sys.executable, "-m", "mirrorkit.cli", "run"]
    procs = {
        "global": _start([*mk, "--simulate-cpus", "2", str(plain), "--epochs", "3", "-x"],
                         tmp, PLAIN_EXIT="3"),
        # --scale-batch via its flag; the CPU split via the environment twin.
        "scaled": _start([*mk, "--scale-batch", str(plain)], tmp, MIRRORKIT_SIMULATE_CPUS="2"),
        "boom": _start([*mk, "--strategy", "default", str(boom)], tmp),
        # No MIRRORKIT_* variable to begin with: the library must leave none behind.
        "library": _start([sys.executable, str(tmp / "library.py"), str(plain), str(boom)], tmp,
                          PLAIN_EXIT="4", MIRRORKIT_COLLECTIVE_TIMEOUT=None),
        "app": _start([*mk, "--simulate-cpus", "2", "apps/plain_keras_script.py", "--epochs", "2",
                       "--batch-size", "64"], REPO),
        "minimal": _start([*mk, "--simulate-cpus", "2", "apps/minimal_change.py"], REPO),
        "own": _start([sys.executable, str(tmp / "own_driver.py"), str(tmp / "scripts" / "own.py")],
                      tmp),
    }
    done = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    done["paths"] = {"plain": str(plain), "boom": str(boom)}
    return done


def _lines(text: str, prefix: str) -> list[str]:
    return [line[len(prefix):] for line in text.splitlines() if line.startswith(prefix)]


def _announcement(stderr: str) -> str:
    # TensorFlow's C++ start-up lines may precede ours; ours is the first of ours.
    return next(line for line in stderr.splitlines() if line.startswith("mirrorkit run:"))


def test_plain_script_trains_on_two_replicas_with_its_own_argv_and_exit_code(runs):
    proc = runs["global"]
    assert proc.returncode == 3, proc.stderr
    assert json.loads(_lines(proc.stdout, "ARGV ")[0]) == [runs["paths"]["plain"], "--epochs", "3", "-x"]
    assert _lines(proc.stdout, "NAME ") == ["__main__"]
    assert _lines(proc.stdout, "REPLICAS ") == ["2"]
    line = _announcement(proc.stderr)
    assert "strategy=mirrored replicas=2" in line and "on a CPU-only machine" in line
    assert "batch_size is the global batch" in line


def test_without_scale_batch_the_script_batch_is_global(runs):
    steps = json.loads(_lines(runs["global"].stdout, "STEPS ")[0])
    # 64 examples / global batch 8 = 8 steps (4 examples per replica).
    assert steps["arrays_batch_8"] == {"train": 8, "test": 8, "predict": 8}
    assert steps["arrays_default_batch"]["train"] == 2           # 64 / 32
    assert _lines(runs["global"].stdout, "SCALE_ENV ") == ["0"]


def test_scale_batch_makes_the_script_batch_per_replica(runs):
    proc = runs["scaled"]
    assert proc.returncode == 0, proc.stderr
    steps = json.loads(_lines(proc.stdout, "STEPS ")[0])
    # batch_size=8 per replica x 2 replicas = global 16: 4 steps.
    assert steps["arrays_batch_8"] == {"train": 4, "test": 4, "predict": 4}
    assert steps["arrays_default_batch"]["train"] == 1           # 32 x 2 = 64
    # Already-batched datasets keep their batch as the global batch; said once.
    assert steps["dataset_batch_8"] == {"train": 8, "test": 8, "predict": 0}
    assert proc.stderr.count("--scale-batch does not apply") == 1
    assert "per replica (x2)" in _announcement(proc.stderr)
    assert _lines(proc.stdout, "SCALE_ENV ") == ["1"]


def test_uncaught_exception_prints_the_scripts_own_traceback_and_exits_1(runs):
    proc = runs["boom"]
    assert proc.returncode == 1
    tail = proc.stderr[proc.stderr.index("Traceback (most recent call last):"):]
    assert f'File "{runs["paths"]["boom"]}", line 5, in <module>' in tail
    assert "line 2, in inner" in tail
    assert tail.rstrip().endswith("ZeroDivisionError: division by zero")
    assert "runpy" not in tail and "mirrorkit" not in tail and "click" not in tail


def test_library_restores_state_and_passes_exits_and_errors_through(runs):
    proc = runs["library"]
    assert proc.returncode == 0, proc.stderr
    r = json.loads(_lines(proc.stdout, "RESULT ")[0])
    assert r["exit"] == 4 and r["on_start"] == [["mirrored", 2, True]]
    assert r["fit_restored"] and r["argv_restored"] and r["path_restored"] and r["scope_left"]
    assert r["env_restored"] == []
    assert r["failed_message"] == "ZeroDivisionError: division by zero"
    assert r["failed_traceback"].startswith("Traceback (most recent call last):\n  File ")


def test_scripts_own_strategies_are_mirrorkits_unless_pinned_to_devices(runs):
    proc = runs["own"]
    assert proc.returncode == 0, proc.stderr
    own = json.loads(_lines(proc.stdout, "OWN ")[0])
    assert own["ours"] == ["MirroredStrategy", 2]
    assert all(own["adopted"].values()), own["adopted"]
    assert own["isinstance"] == [True, False, True]
    # Pinned to devices: created as written, and mirrorkit's scope is left for it.
    assert own["after_pinned_has_strategy"] is False
    assert own["one_device_replicas"] == 1
    assert own["explicit"] == [False, 1]
    restored = result_line(proc.stdout)
    assert {k: restored[k] for k in ("classes_restored", "scope_left")} == \
        {"classes_restored": True, "scope_left": True}


def test_fit_leaves_out_the_examples_that_would_leave_a_replica_empty(runs):
    own = json.loads(_lines(runs["own"].stdout, "OWN ")[0])
    assert own["trim_batches"] == {"train": 5, "test": 6}
    assert own["val_loss_is_last_22"] is True
    assert own["even_batches"] == 10                     # 40 / 4: nothing left out
    assert runs["own"].stderr.count("fit leaves out the last 1 of 21 training examples") == 1


def test_an_uneven_dataset_is_not_rewritten_and_its_failure_says_why(runs):
    own = json.loads(_lines(runs["own"].stdout, "OWN ")[0])
    notes = own["dataset_conv"]
    if result_line(runs["own"].stdout)["conv_mis_shapes"]:
        assert len(notes) == 1 and "drop_remainder=True" in notes[0], notes
    else:
        assert notes == "trained"   # this CPU's kernels shape the empty replica batch right
    assert own["dataset_dense_nan"] is True                  # upstream: silent NaN
    nan_warnings = [line for line in runs["own"].stderr.splitlines()
                    if line.startswith("fit's loss is NaN on 2 replicas")]
    assert len(nan_warnings) == 1 and "drop_remainder=True" in nan_warnings[0]


def test_example_apps_train_on_two_replicas(runs):
    for name in ("app", "minimal"):
        proc = runs[name]
        assert proc.returncode == 0, proc.stderr
        assert _lines(proc.stdout, "replicas: ") == ["2"], name
        accuracy = float(_lines(proc.stdout, "test accuracy: ")[0])
        assert accuracy > 0.8, (name, accuracy)


def _code_lines(path: Path) -> list[str]:
    # The module docstring mentions mirrorkit (how to run); only code counts.
    text = path.read_text()
    docstring_end = ast.parse(text).body[0].end_lineno
    return text.splitlines()[docstring_end:]


@pytest.mark.fast
def test_minimal_change_script_has_exactly_two_mirrorkit_lines():
    code = [line for line in _code_lines(REPO / "apps" / "minimal_change.py") if "mirrorkit" in line]
    assert [line.split("# ")[-1] for line in code] == ["mirrorkit: line 1/2", "mirrorkit: line 2/2"]
    assert code[0] == "import mirrorkit  # mirrorkit: line 1/2"
    assert code[1].startswith("with mirrorkit.scope():")
    assert not [line for line in _code_lines(REPO / "apps" / "plain_keras_script.py")
                if "mirrorkit" in line or "tf.distribute" in line]


# --- user mistakes: one line, non-zero exit, no traceback ---------------------

@pytest.mark.fast
@pytest.mark.parametrize("args, expected", [
    (["surely_missing.py"], "Error: Script not found. Received: script='surely_missing.py'"),
    (["README.md"], "Error: The script must be a Python file ending in .py. Received: script='README.md'"),
    (["apps"], "Error: The script must be a Python file ending in .py. Received: script='apps'"),
])
def test_bad_script_is_one_clear_line(args, expected, monkeypatch):
    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(cli, ["run", *args])
    assert result.exit_code == 1
    assert result.output.strip() == expected
    assert "Traceback" not in result.output


@pytest.mark.fast
@pytest.mark.parametrize("args, fragment", [
    (["--simulate-cpus", "0", "x.py"], "Invalid value for '--simulate-cpus'"),
    (["--strategy", "turbo", "x.py"], "Invalid value for '--strategy'"),
    (["--bogus", "x.py"], "No such option: --bogus"),
    ([], "Missing argument 'SCRIPT'"),
])
def test_bad_options_are_usage_errors(args, fragment):
    result = CliRunner().invoke(cli, ["run", *args])
    assert result.exit_code == 2
    assert fragment in result.output and "Traceback" not in result.output


def test_missing_script_does_not_import_tensorflow():
    code = ("import sys\nfrom mirrorkit.cli import main\n"
            "try:\n    main(['run', 'surely_missing.py'])\nexcept SystemExit as e:\n"
            "    print('EXIT', e.code, 'TF' if 'tensorflow' in sys.modules else 'NOTF')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=clean_env(), timeout=60)
    assert "EXIT 1 NOTF" in out.stdout, out.stdout + out.stderr
    assert out.stderr.strip() == "Error: Script not found. Received: script='surely_missing.py'"
