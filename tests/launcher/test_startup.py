"""Controls of the start-up patches, ``deferred-optional-imports`` and ``import-gc-freeze``.

A script run by the real ``mirrorkit run`` (the console entry point, which
installs both first) in an environment that has pandas and matplotlib, with
both patches, and with each turned off by name:

* deferred imports: with the patch, importing Keras imports neither package;
  the script's own ``import pandas`` gives Keras's array adapter pandas and
  its types, a DataFrame trains to the same loss, the galleries draw. Off,
  Keras imports both at once (what the patch saves, at every worker start).
* the collector: with the patch, TensorFlow's import objects are frozen and
  the collector is on, and still frees a cycle the script makes; off, nothing
  is frozen. Same losses either way.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import clean_env, result_line

SCRIPT = """
import gc, json, sys, weakref
import numpy as np
import keras

class Node:
    pass
cycle = Node()
cycle.self = cycle
alive = weakref.ref(cycle)
del cycle
gc.collect()

facts = {"pandas_with_keras": "pandas" in sys.modules,
         "matplotlib_with_keras": "matplotlib" in sys.modules,
         "gc_enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
         "cycle_freed": alive() is None}
import pandas as pd
from keras.src.trainers.data_adapters import array_slicing

facts["adapter_has_pandas"] = array_slicing.pandas is pd and array_slicing.ARRAY_TYPES[-2:] == (
    pd.Series, pd.DataFrame)
keras.utils.set_random_seed(0)
x = pd.DataFrame(np.random.rand(64, 3))  # float64 columns: Keras casts them to float32
y = np.random.rand(64, 1).astype("float32")
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
facts["loss"] = model.fit(x, y, batch_size=16, epochs=2, verbose=0).history["loss"]
keras.visualization.plot_image_gallery(np.random.rand(4, 8, 8, 3), rows=2, cols=2,
                                       path="gallery.png")
import matplotlib
facts["pyplot_attribute"] = hasattr(matplotlib, "pyplot")
print("RESULT " + json.dumps(facts))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, dict]:
    folder = tmp_path_factory.mktemp("deferred")
    (folder / "script.py").write_text(SCRIPT)
    out = {}
    for arm, extra in {"on": {}, "off": {"MIRRORKIT_COMPAT_DISABLE": "deferred-optional-imports"},
                       "gc-off": {"MIRRORKIT_COMPAT_DISABLE": "import-gc-freeze"}}.items():
        png = folder / "gallery.png"
        png.unlink(missing_ok=True)
        proc = subprocess.run([sys.executable, "-m", "mirrorkit", "run", "script.py"],
                              cwd=folder, capture_output=True, text=True, timeout=300,
                              env=clean_env(optional_packages=True, **extra))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        out[arm] = {**result_line(proc.stdout), "png": png.stat().st_size > 0}
    return out


def test_keras_imports_neither_package_with_the_patch_and_both_without(runs):
    assert (runs["on"]["pandas_with_keras"], runs["on"]["matplotlib_with_keras"]) == (False, False)
    assert (runs["off"]["pandas_with_keras"], runs["off"]["matplotlib_with_keras"]) == (True, True)


def test_the_script_sees_the_keras_it_would_have_had(runs):
    for arm in ("on", "off"):
        assert runs[arm]["adapter_has_pandas"], arm
        assert runs[arm]["pyplot_attribute"], arm
        assert runs[arm]["png"], arm
    assert runs["on"]["loss"] == runs["off"]["loss"]


def test_tensorflows_objects_are_frozen_and_the_collector_still_works(runs):
    # TensorFlow + Keras make ~300,000 objects; frozen, the collector skips them.
    assert runs["on"]["frozen"] > 100_000 and runs["off"]["frozen"] > 100_000
    assert runs["gc-off"]["frozen"] == 0
    for arm in runs:
        assert runs[arm]["gc_enabled"] and runs[arm]["cycle_freed"], arm
    assert runs["gc-off"]["loss"] == runs["on"]["loss"]
