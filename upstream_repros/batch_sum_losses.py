"""An add_loss value that sums over the batch is divided by N under N replicas.

What happens: Keras divides every add_loss value by the replica count N, right for a mean
or a weight regularizer but wrong for a value summing over the batch: keras.io's
ActivityRegularizationLayer adds ops.sum(inputs) * 0.1, each replica sums only its own
slice, and after the division by N the term weighs 1/N of one device's in the gradients and
in the logged loss.
Expected: the same logged loss and update as on one device.
Versions tested: see README.md in this folder.
mirrorkit's fix (batch-sum-losses): an add_loss value that scales with the batch rows (read
from its graph) is multiplied by the global rows over the replica's rows before Keras divides.
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


class ActivityRegularizationLayer(keras.layers.Layer):  # as on keras.io
    def call(self, inputs):
        self.add_loss(keras.ops.sum(inputs) * 0.1)
        return inputs


def run():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer="ones"),
                              ActivityRegularizationLayer()])
    model.compile(keras.optimizers.SGD(0.01), "mse")
    loss = model.fit(x, y, batch_size=64, epochs=1, verbose=0).history["loss"][0]
    return loss, float(model.get_weights()[1][0])


one = run()
with strategy.scope():
    two = run()
print("one device : logged loss %.4f, bias after one SGD step %.4f" % one)
print("2 replicas : logged loss %.4f, bias after one SGD step %.4f" % two)
if not np.allclose(one, two, rtol=1e-4):
    print(f"BUG REPRODUCED: logged loss {two[0]:.4f} vs {one[0]:.4f}, bias {two[1]:.4f} vs {one[1]:.4f}")
    sys.exit(1)
print("NOT REPRODUCED")
