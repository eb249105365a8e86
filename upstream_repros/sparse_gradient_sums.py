"""An embedding's IndexedSlices gradient under N replicas gives Adam another update than one device.

What happens: a variable read through a lookup (Embedding, ops.take) gets an IndexedSlices
gradient. Under N replicas tf.distribute all-reduces it by concatenating the replicas'
slices, so a row every replica looks up (a position embedding looked up with
ops.arange, keras.io's ViT and text Transformer) arrives N times, each with its replica's
part. Keras's Adam squares the slices one by one: its second moment is a^2 + b^2 where one
device has (a + b)^2, so the update differs silently (here after one Adam step).
Expected: the same update as on one device (as SGD gives).
Versions tested: see README.md in this folder.
mirrorkit's fix (sparse-gradient-sums): after the all-reduce, add up row by row the
replicas' slices that carry the same indices in the same order.
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 5, 3)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")


class AddPositions(keras.layers.Layer):
    def build(self, shape):
        self.positions = keras.layers.Embedding(5, 3, embeddings_initializer="ones")

    def call(self, x):
        return x + self.positions(keras.ops.arange(5))


def run():
    model = keras.Sequential([keras.Input((5, 3)), AddPositions(), keras.layers.Flatten(),
                              keras.layers.Dense(1, kernel_initializer="ones")])
    model.compile(keras.optimizers.Adam(0.1), "mse")
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    return model.layers[0].positions.get_weights()[0]


one = run()
with strategy.scope():
    two = run()
diff = np.abs(one - two).max()
print("one device : position embedding row 0 after one Adam step", one[0])
print("2 replicas : position embedding row 0 after one Adam step", two[0])
if diff > 1e-5:
    print(f"BUG REPRODUCED: position embedding differs by {diff:.3g} after one Adam step under 2 replicas")
    sys.exit(1)
print(f"NOT REPRODUCED (max difference {diff:.3g})")
