"""Every replica draws the same Dropout mask (one shared SeedGenerator state) under N replicas.

What happens: Keras 3 draws Dropout masks, noise, random augmentation and keras.random.*
from stateless ops seeded by a SeedGenerator whose state all replicas share. Each replica
draws for its own slice with the same seed, so every replica gets the same numbers: here a
Dropout(0.5) on a batch of 8 ones gives rows 4..7 identical to rows 0..3 under 2 replicas;
on one device the two halves differ. Training is less random than on one device (keras.io's
Antirectifier with Dropout(0.5): lower test accuracy under 2 replicas).
Expected: different masks on different replicas (ideally one device's draw for the batch).
Related (errors, not identical masks): keras-team/keras#20611, keras-team/keras#20612.
Versions tested: see README.md in this folder.
mirrorkit's fix (replica-random): a batch-shaped draw inside strategy.run draws the global
batch's shape and keeps this replica's rows.
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
x = np.ones((8, 6), "float32")

dropout = keras.layers.Dropout(0.5, seed=1)
one = dropout(x, training=True).numpy()
with strategy.scope():
    dropout = keras.layers.Dropout(0.5, seed=1)
dist = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(x))
step = tf.function(lambda batch: strategy.run(lambda b: dropout(b, training=True), args=(batch,)))
two = strategy.gather(step(next(iter(dist))), axis=0).numpy()
print("one device : mask rows 0-3 == rows 4-7:", np.array_equal(one[:4], one[4:]))
print("2 replicas : mask rows 0-3 (replica 0) == rows 4-7 (replica 1):", np.array_equal(two[:4], two[4:]))
print("2 replicas mask:\n", (two > 0).astype(int))
if np.array_equal(two[:4], two[4:]) and not np.array_equal(one[:4], one[4:]):
    print("BUG REPRODUCED: both replicas drew the same Dropout mask for their 4 rows")
    sys.exit(1)
print("NOT REPRODUCED")
