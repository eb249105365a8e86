"""A masked loss averages over each replica's own valid entries under N replicas.

What happens: with a Keras mask (Embedding(mask_zero=True), ignore_class) the loss is
averaged over the valid entries. Under N replicas each replica divides by its *own* valid
count and the replicas' means are then averaged, so a replica holding short sequences
weighs its entries more than on one device. Here: 8 sequences, the first 4 with 1 valid
token, the last 4 with 6, batch 8 on 2 replicas: evaluate's loss differs from one
device's (and so do gradients in fit).
Expected: the mean over the global batch's valid entries, as on one device.
Versions tested: see README.md in this folder.
mirrorkit's fix (masked-loss-means): divide each replica's weighted sum by the global
batch's valid count (one sum of the replicas' counts per loss call).
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
tokens = rng.integers(1, 10, size=(8, 6))
tokens[:4, 1:] = 0  # short sequences (1 valid token) on replica 0, long (6) on replica 1
targets = rng.normal(size=(8, 6, 1)).astype("float32")


def run():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,), dtype="int32"),
                              keras.layers.Embedding(10, 4, mask_zero=True), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    return model.evaluate(tokens, targets, batch_size=8, verbose=0)


one = run()
with strategy.scope():
    two = run()
print("one device : evaluate loss %.5f" % one)
print("2 replicas : evaluate loss %.5f" % two)
if abs(one - two) > 1e-4 * abs(one):
    print(f"BUG REPRODUCED: masked loss {two:.5f} under 2 replicas vs {one:.5f} on one device")
    sys.exit(1)
print("NOT REPRODUCED")
