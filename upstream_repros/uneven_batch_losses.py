"""An unevenly split batch weighs each replica's mean 1/N: the update differs from one device's.

What happens: Keras divides each replica's mean loss by N (scale_loss_for_distribution) so
that the summed gradients are the global batch's mean. With a batch that does not divide
by the replicas (21 examples at batch_size=8: last batch 5 = 3 + 2 rows), each replica's mean
still counts 1/N, so a row of the smaller slice counts more than on one device. The weights
after one epoch differ from one device's, silently.
Expected: the same weights as on one device (up to float rounding, ~1e-7).
Versions tested: see README.md in this folder.
mirrorkit's fix (uneven-batch-losses): weigh a replica's loss share by its rows over the
global batch's rows (and the logged value by the inverse).
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x, y = rng.normal(size=(21, 4)).astype("float32"), rng.normal(size=(21, 1)).astype("float32")


def run():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer="ones")])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    loss = model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False).history["loss"][0]
    return np.concatenate([w.ravel() for w in model.get_weights()]), loss


one, loss1 = run()
with strategy.scope():
    two, loss2 = run()
print("one device : loss %.6f weights %s" % (loss1, one))
print("2 replicas : loss %.6f weights %s" % (loss2, two))
diff = np.abs(one - two).max()
if diff > 1e-5:
    print(f"BUG REPRODUCED: weights after 1 epoch (21 rows, batch 8) differ by {diff:.3g} on 2 replicas")
    sys.exit(1)
print(f"NOT REPRODUCED (max weight difference {diff:.3g})")
