"""Control of ``one-replica-step-notice``: a step called outside every replica is named once.

One fresh interpreter runs four unmodified scripts through ``run_script`` on 2
simulated CPUs and counts the runner's lines that say an update ran outside
fit and strategy.run: a custom loop that calls its ``tf.function`` step
directly (once, however many steps), the same with the patch off by name
(none), a loop through the script's own ``strategy.run`` (none) and ``fit``
(none). Training is unchanged: the direct loop's losses are the same with
the patch on and off.
"""

from __future__ import annotations

import textwrap

import pytest
from conftest import run_snippet

DIRECT = """
import json, numpy as np, tensorflow as tf, keras
keras.utils.set_random_seed(0)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
optimizer = keras.optimizers.SGD(0.1)
x, y = np.random.rand(8, 4).astype("float32"), np.random.rand(8, 1).astype("float32")

@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean((model(x) - y) ** 2)
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss

print("LOSSES " + json.dumps([float(train_step(x, y)) for _ in range(3)]))
"""
REPLICAS = """
import numpy as np, tensorflow as tf, keras
strategy = tf.distribute.MirroredStrategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.1)
x, y = np.ones((8, 4), "float32"), np.ones((8, 1), "float32")

@tf.function
def train_step(x, y):
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    strategy.run(step, args=(x, y))

for _ in range(2):
    train_step(x, y)
"""
FIT = """
import numpy as np, keras
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(np.ones((16, 4), "float32"), np.ones((16, 1), "float32"), batch_size=8, verbose=0)
"""
DRIVER = """
import json, logging
from mirrorkit import _env
from mirrorkit.runner import RunConfig, run_script

said = []

class Lines(logging.Handler):
    def emit(self, record):
        said.append(record.getMessage())

log = logging.getLogger("mirrorkit.runner")
log.addHandler(Lines())
log.setLevel(logging.INFO)
out = {}
for case, script, off in (("direct", "direct.py", ""),
                          ("direct_off", "direct.py", "one-replica-step-notice"),
                          ("replicas", "replicas.py", ""), ("fit", "fit.py", "")):
    said.clear()
    with _env.patch({_env.COMPAT_DISABLE: off}):
        run_script(RunConfig(script, simulate_cpus=2))
    out[case] = sum("outside fit and strategy.run" in line for line in said)
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
def test_a_step_outside_every_replica_is_named_once_and_trains_as_before(tmp_path):
    for name, text in (("direct", DIRECT), ("replicas", REPLICAS), ("fit", FIT)):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    found, proc = run_snippet(DRIVER, tmp_path)
    assert found == {"direct": 1, "direct_off": 0, "replicas": 0, "fit": 0}, proc.stderr[-3000:]
    losses = [line for line in proc.stdout.splitlines() if line.startswith("LOSSES ")]
    assert len(losses) == 2 and losses[0] == losses[1], proc.stdout
