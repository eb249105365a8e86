"""saving_lib.get_attr_skipset reads one cache key and stores another: every save builds an Optimizer.

What happens: keras/src/saving/saving_lib.py get_attr_skipset() looks the cache up under
"saving_attr_skiplist_{obj_type}" but stores it under "saving_attr_skipset_{obj_type}", so
the cache never hits and every model.save / load_model builds throw-away reference objects
(a Layer, a Metric, an Optimizer(1.0)...). Under MultiWorkerMirroredStrategy creating an
Optimizer is a collective, so a chief-only save or restore desynchronises the workers.
No strategy is needed to show the cache miss; this script counts Optimizer constructions.
Expected: the second call returns the cached set; saves after the first build no Optimizer.
Versions tested: see README.md in this folder.
mirrorkit's fix (saving-skipset-cache): cache the skipset per type (filled on every worker).
"""
import os, sys, tempfile  # noqa: E401
import numpy as np  # noqa: F401
import tensorflow as tf  # noqa: F401
import keras
from keras.src.saving import saving_lib

a, b = saving_lib.get_attr_skipset("Optimizer"), saving_lib.get_attr_skipset("Optimizer")
print("get_attr_skipset('Optimizer') cached (second call returns the same set):", a is b)
made = []
init = keras.optimizers.Optimizer.__init__
keras.optimizers.Optimizer.__init__ = lambda self, *args, **kw: (made.append(1), init(self, *args, **kw))[1]
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
model.compile("adam", "mse")
path = os.path.join(tempfile.mkdtemp(), "m.keras")
model.save(path)
n = len(made)
model.save(path)
print("Optimizer objects built by a second model.save:", len(made) - n)
if a is not b or len(made) > n:
    print(f"BUG REPRODUCED: skipset cache miss; a second save built {len(made) - n} Optimizer(s)")
    sys.exit(1)
print("NOT REPRODUCED")
