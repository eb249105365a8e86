"""predict_on_batch / test_on_batch / train_on_batch give the whole batch to every replica.

What happens: under MirroredStrategy with 2 replicas, Keras 3's TensorFlow trainer passes
the *_on_batch batch to strategy.run as plain tensors, so every replica receives the whole
batch. predict_on_batch(32 rows) returns 64 rows (every row twice); a summing metric
(a metric whose variable sums hits) in test_on_batch / train_on_batch counts every example twice, and each
replica does the whole batch's work.
Expected: the batch is split across the replicas as in predict/evaluate/fit: 32 rows, and
one device's metric values.
Versions tested: see README.md in this folder.
mirrorkit's fixes (predict-on-batch, test-on-batch, train-on-batch): split the batch into
contiguous per-replica slices (distributed values) before Keras's method runs.
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x = rng.normal(size=(32, 4)).astype("float32")
y = (rng.random((32, 1)) > 0.5).astype("float32")


class Hits(keras.metrics.Metric):  # counts rows with round(prediction) == label
    def __init__(self, name="tp"):
        super().__init__(name=name)
        self.hits = self.add_variable(shape=(), name="hits", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        self.hits.assign_add(keras.ops.sum(keras.ops.cast(y_true == keras.ops.round(y_pred), "float32")))

    def result(self):
        return self.hits


def run():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile("sgd", "binary_crossentropy", metrics=[Hits()])
    rows = model.predict_on_batch(x).shape[0]
    test = model.test_on_batch(x, y, return_dict=True)["tp"]
    train = model.train_on_batch(x, y, return_dict=True)["tp"]
    return rows, float(test), float(train)


one = run()
with strategy.scope():
    two = run()
print("one device  : predict_on_batch rows %d, test_on_batch hits %.0f, train_on_batch hits %.0f" % one)
print("2 replicas  : predict_on_batch rows %d, test_on_batch hits %.0f, train_on_batch hits %.0f" % two)
if one != two:
    print(f"BUG REPRODUCED: (rows, test hits, train hits) {two} under 2 replicas vs {one} on one device")
    sys.exit(1)
print("NOT REPRODUCED")
