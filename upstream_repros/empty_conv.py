"""oneDNN CPU convolutions return their input for an empty batch; predict fails on 2 replicas.

What happens: on CPU with oneDNN (TensorFlow's default), Conv2D on an empty batch
(shape [0, 8, 8, 8]) returns a tensor shaped like its *input*, [0, 8, 8, 8], instead
of [0, 6, 6, 16]. Under MirroredStrategy with 2 replicas, `model.predict` on one image
leaves replica 1 an empty batch, and the next shape-sensitive op (BatchNormalization)
fails with "Incompatible shapes".
Expected: an empty output of shape [0, 6, 6, 16]; predict returns one device's output.
Earlier instance of the same class of bug (MKL Conv3D): tensorflow/tensorflow#30968.
Versions tested: see README.md in this folder (TF 2.21.0 / Keras 3.15.1, tf-nightly 2.23.0.dev).
mirrorkit's fix (empty-conv): on an empty batch Keras's convolutions run on one zero row
and return its first 0 rows.
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
keras.utils.set_random_seed(0)

out = tf.nn.conv2d(tf.zeros([0, 8, 8, 8]), tf.zeros([3, 3, 8, 16]), 1, "VALID")
print("tf.nn.conv2d on [0, 8, 8, 8] with a 3x3x8x16 filter:", out.shape, "(expected (0, 6, 6, 16))")


def make():
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((8, 8, 8)), keras.layers.Conv2D(16, 3),
                             keras.layers.BatchNormalization(), keras.layers.GlobalAveragePooling2D()])


x = np.random.default_rng(0).normal(size=(1, 8, 8, 8)).astype("float32")
one = make().predict(x, verbose=0)
print("one device predict(1 image):", one.shape, one[0, :3])
with strategy.scope():
    model = make()
try:
    two = model.predict(x, verbose=0)
    print("2 replicas predict(1 image):", two.shape, two[0, :3])
    failed = not np.allclose(one, two, atol=1e-5)
except Exception as e:  # noqa: BLE001
    print("2 replicas predict(1 image) failed:", type(e).__name__,
          [l for l in str(e).splitlines() if "Incompatible" in l or "Error" in l][-1].strip()[:200])
    failed = True
if out.shape != (0, 6, 6, 16) or failed:
    print(f"BUG REPRODUCED: empty conv output shape {tuple(out.shape)}; predict on 2 replicas "
          f"{'failed' if failed else 'ok'}")
    sys.exit(1)
print("NOT REPRODUCED")
