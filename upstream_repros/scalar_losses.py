"""A loss function returning one value for the batch is not divided by N under N replicas.

What happens: with compile(loss=fn) where fn returns a scalar (ops.mean of the squared
errors), Keras returns that shape-() value before its per-replica scaling in reduce_values,
but the trainer still unscales the logged loss and the all-reduce still sums the gradients.
Under 2 replicas evaluate reports 2x the one-device loss and one SGD step moves the weights
2x as far.
Expected: the same loss and update as on one device (as for a per-example loss).
Related (tf.keras 2 era, reported 1/x): keras-team/keras#16285, tensorflow/tensorflow#35093.
Versions tested: see README.md in this folder.
mirrorkit's fix (scalar-losses): scale such a value like a per-example loss's mean.
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


def mean_squared(y_true, y_pred):  # one value for the batch
    return keras.ops.mean(keras.ops.square(y_true - y_pred))


def run():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile(keras.optimizers.SGD(0.1), mean_squared)
    loss = model.evaluate(x, y, batch_size=64, verbose=0)
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    return loss, float(model.get_weights()[1][0])


one = run()
with strategy.scope():
    two = run()
print("one device : evaluate loss %.4f, bias after one SGD step %.4f" % one)
print("2 replicas : evaluate loss %.4f, bias after one SGD step %.4f" % two)
if not np.allclose(one, two, rtol=1e-4):
    print(f"BUG REPRODUCED: loss x{two[0] / one[0]:.2f}, update x{two[1] / one[1]:.2f} under 2 replicas")
    sys.exit(1)
print("NOT REPRODUCED")
