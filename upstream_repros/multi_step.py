"""fit with steps_per_execution > 1 fails under MirroredStrategy with 2 replicas.

What happens: Keras 3's TensorFlowTrainer._make_function runs k steps per call in a
tf.while_loop whose body wraps each step in tf.cond(has_value, ...). With the step calling
strategy.run over 2 replicas, the cond branch captures per-replica placeholders it never
feeds and the first call fails: "You must feed a value for placeholder tensor
'.../while/cond/Placeholder'".
Expected: fit trains as with steps_per_execution=1 (and as on one device).
Related (same error text, different reproducer): keras-team/keras#19246.
Versions tested: see README.md in this folder.
mirrorkit's fix (multi-step): runs the k steps in a while loop whose condition, not a
cond around the step, checks for the next batch.
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")


def run():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", steps_per_execution=2)
    return model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False).history["loss"][0]


print("one device loss:", run())
try:
    with strategy.scope():
        loss = run()
    print("2 replicas loss:", loss)
except Exception as e:  # noqa: BLE001
    msg = [l.strip() for l in str(e).splitlines() if "must feed" in l or "Error" in l][:1]
    print(f"BUG REPRODUCED: fit(steps_per_execution=2) under 2 replicas raised "
          f"{type(e).__name__}: {(msg or [str(e)[:200]])[0][:300]}")
    sys.exit(1)
print("NOT REPRODUCED")
