"""Batch-end logs under N replicas average the replicas' metric results (not the global batch's).

What happens: Keras's train_step ends with get_metrics_result() read inside each replica
(each metric's result over that replica's slice) and reduce_per_replica averages those
results. For a ratio of sums (a weighted metric, or any metric when the slices differ in
size: a batch of 33 = 17 + 16 rows) the average of the replicas' ratios is not the global
batch's ratio, so on_train_batch_end logs (the progress bar, callbacks, TensorBoard with
update_freq) differ from one device's, loss included. Epoch-end logs are right. Here: one
batch of 34 rows (17 + 17) with sample weights: the batch-end weighted accuracy differs.
(An uneven first batch cannot be shown directly: fit's symbolic build fails on it first,
keras-team/keras#20585 / #19246.)
Expected: batch-end logs equal to one device's (they are computed before the update).
Related (progress bar showed the sum): keras-team/keras#19280.
Versions tested: see README.md in this folder.
mirrorkit's fix (step-metrics): read the step's metric results once for all replicas (a
merge_call summing the metric variables, as at the epoch end).
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x, y = rng.normal(size=(34, 4)).astype("float32"), rng.integers(0, 2, size=(34, 1)).astype("float32")
w = rng.random(34).astype("float32")


class Record(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        self.logs = {k: float(v) for k, v in logs.items()}


def run():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile("sgd", "binary_crossentropy", weighted_metrics=["accuracy"])
    record = Record()
    model.fit(x, y, sample_weight=w, batch_size=34, epochs=1, verbose=0, callbacks=[record])
    return record.logs["loss"], record.logs["accuracy"]


one = run()
with strategy.scope():
    two = run()
print("one device : batch-end loss %.5f, weighted accuracy %.5f" % one)
print("2 replicas : batch-end loss %.5f, weighted accuracy %.5f" % two)
if not np.allclose(one, two, rtol=1e-5):
    print(f"BUG REPRODUCED: batch-end logs (loss, weighted accuracy) {two} vs {one} on one device")
    sys.exit(1)
print("NOT REPRODUCED")
