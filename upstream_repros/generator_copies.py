"""Dataset.from_generator shares the generator's aligned arrays; under 2 replicas fit writes into them.

What happens: Dataset.from_generator (behind keras.utils.PyDataset and generator inputs)
and tf.numpy_function wrap a returned NumPy array whose data is 64-byte aligned without a
copy. Under MirroredStrategy with 2 replicas a training step then writes into those
buffers: a PyDataset returning slices of one array as x and y (as the Keras docs write
__getitem__) ends fit with the user's array overwritten and other weights than on one device.
Expected: the user's array is left unchanged and the weights equal one device's.
Background (NumPy/TF memory sharing): tensorflow/tensorflow#33254.
Versions tested: see README.md in this folder.
mirrorkit's fix (generator-copies): copy each array a generator or numpy_function returns
before TensorFlow wraps it.
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
raw = np.empty(64 + 16, dtype="float32")  # place the data at a 64-byte aligned address,
skip = (-raw.ctypes.data % 64) // 4       # as NumPy does for every large array
data = raw[skip:skip + 64].reshape(64, 1)
data[:] = np.arange(64, dtype="float32").reshape(64, 1) / 64
before = data.copy()


class Batches(keras.utils.PyDataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return data[i * 16:(i + 1) * 16], data[i * 16:(i + 1) * 16]


def run():
    data[:] = before
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, kernel_initializer="zeros")])
    model.compile("sgd", "mse")
    model.fit(Batches(), epochs=2, verbose=0, shuffle=False)
    return float(model.get_weights()[0][0, 0]), float(data.sum())


one = run()
with strategy.scope():
    two = run()
print("one device : kernel %.4f, sum of the user's array after fit %.2f (before %.2f)" % (*one, before.sum()))
print("2 replicas : kernel %.4f, sum of the user's array after fit %.2f (before %.2f)" % (*two, before.sum()))
if two[1] != before.sum() or abs(one[0] - two[0]) > 1e-5:
    print(f"BUG REPRODUCED: user's array sum {before.sum():.2f} -> {two[1]:.2f}, kernel {two[0]:.4f} vs {one[0]:.4f}")
    sys.exit(1)
print("NOT REPRODUCED")
