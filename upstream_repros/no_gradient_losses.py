"""A keras.losses.Loss called where no gradient is taken reports 1/N of its value under N replicas.

What happens: in a replica context Keras divides every reduced loss by N
(scale_loss_for_distribution) for the gradients' all-reduce. Its own test_step multiplies
the logged loss back; code that takes no gradient does not. A custom test_step that calls
a keras.losses.Loss and logs it with a keras.metrics.Mean reports 1/2 of the one-device
value under 2 replicas.
Expected: evaluate reports the same loss as on one device (nothing is differentiated).
Versions tested: see README.md in this folder.
mirrorkit's fix (no-gradient-losses): divide (and multiply back) only while a gradient
tape records.
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


class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1, kernel_initializer="ones")
        self.loss_fn = keras.losses.MeanSquaredError()
        self.tracker = keras.metrics.Mean(name="loss")

    def call(self, x):
        return self.dense(x)

    def test_step(self, data):
        x, y = data
        self.tracker.update_state(self.loss_fn(y, self(x)))
        return {"loss": self.tracker.result()}

    @property
    def metrics(self):
        return [self.tracker]


def run():
    model = Net()
    model.compile()
    return model.evaluate(x, y, batch_size=32, verbose=0, return_dict=True)["loss"]


one = run()
with strategy.scope():
    two = run()
print("one device : evaluate loss %.4f" % one)
print("2 replicas : evaluate loss %.4f" % two)
if abs(one - two) > 1e-4 * abs(one):
    print(f"BUG REPRODUCED: custom test_step loss {two:.4f} under 2 replicas vs {one:.4f} (x{two / one:.2f})")
    sys.exit(1)
print("NOT REPRODUCED")
