"""A keras.Variable (aggregation "none") assigned in a replica's step silently diverges across replicas.

What happens: a variable created with aggregation "none" (keras.Variable's default) and
assigned inside strategy.run is written on each replica's own copy, without
synchronisation or error (tf.distribute values._on_write_update_replica). When the value
comes from the replica's rows (keras.io's NNCLR feature queue) the copies differ from each
other and from one device's value, and each replica then reads its own copy.
Expected: an error, a warning, or one value (as TensorFlow raises for other aggregations
that cannot be honoured); at least not two silently different copies of one variable.
Loosely related: tensorflow/tensorflow#60128.
Versions tested: see README.md in this folder.
mirrorkit (replica-variable-copies) changes nothing: it names such an assignment once,
with the ways to make it exact.
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
x = np.arange(8, dtype="float32").reshape(8, 1)

v1 = keras.Variable(0.0)
v1.assign(keras.ops.mean(x))  # one device: the mean of the batch
with strategy.scope():
    v2 = keras.Variable(0.0)
print("aggregation:", v2.aggregation)
dist = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(x))


@tf.function
def step(batch):
    strategy.run(lambda b: v2.assign(keras.ops.mean(b)), args=(batch,))


step(next(iter(dist)))
copies = [float(c.numpy()) for c in v2.value.values]  # the MirroredVariable's per-device copies
print("one device value:", float(v1.numpy()))
print("2 replicas copies:", copies)
if len(set(copies)) > 1:
    print(f"BUG REPRODUCED: one variable, copies {copies} (one device {float(v1.numpy())}), no error")
    sys.exit(1)
print("NOT REPRODUCED")
