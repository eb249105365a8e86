"""A keras.losses.Loss subclass overriding __call__ is never divided by N under N replicas.

What happens: a Loss subclass whose __call__ returns one value for the batch (keras.io's
supervised contrastive learning example) skips Loss.__call__ and its reduce_values, where
Keras divides a loss by the replica count for the gradients' all-reduce (a sum). The
trainer still unscales the logged loss: under 2 replicas fit logs 2x the loss and one SGD
step moves the weights 2x as far. Here with a plain mean squared error.
Expected: the same logged loss and update as on one device.
Versions tested: see README.md in this folder.
mirrorkit's fix (overridden-loss-call): wrap such a loss where CompileLoss builds it, run it
on the gathered global batch and scale its scalar like a per-example loss's mean.
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 1)).astype("float32") + 3


class MeanSquared(keras.losses.Loss):
    def __call__(self, y_true, y_pred, sample_weight=None):
        return keras.ops.mean(keras.ops.square(y_true - y_pred))


def run():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile(keras.optimizers.SGD(0.1), MeanSquared())
    loss = model.fit(x, y, batch_size=64, epochs=1, verbose=0).history["loss"][0]
    return loss, float(model.get_weights()[1][0])


one = run()
with strategy.scope():
    two = run()
print("one device : logged loss %.4f, bias after one SGD step %.4f" % one)
print("2 replicas : logged loss %.4f, bias after one SGD step %.4f" % two)
if not np.allclose(one, two, rtol=1e-4):
    print(f"BUG REPRODUCED: logged loss x{two[0] / one[0]:.2f}, update x{two[1] / one[1]:.2f} under 2 replicas")
    sys.exit(1)
print("NOT REPRODUCED")
