"""A custom compiled metric that compares examples across its batch logs another value under N replicas.

What happens: under N replicas each replica updates a compiled metric with its own slice of
the batch and Keras sums the replicas' metric variables. That is one device's value only
when the metric adds up per-example terms. keras.io's CategoricalTruePositives ("Training &
evaluation with the built-in methods") compares labels of shape (batch,) with predictions
reshaped to (batch, 1): a (batch, batch) comparison, so each replica pairs only its own
rows. evaluate with identical weights logs a different count on 2 replicas.
Expected: the same metric value as on one device (or documentation that metrics must be
per-example sums under tf.distribute).
Related (different cause): keras-team/keras#21054.
Versions tested: see README.md in this folder.
mirrorkit's fix (batch-wide-metrics): update a metric whose class is not Keras's once per
step on the gathered global batch.
"""
import sys
import numpy as np
import tensorflow as tf
import keras
from keras import ops

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 4)).astype("float32"), rng.integers(0, 3, size=(64,))


class CategoricalTruePositives(keras.metrics.Metric):  # as on keras.io
    def __init__(self, name="categorical_true_positives", **kwargs):
        super().__init__(name=name, **kwargs)
        self.true_positives = self.add_variable(shape=(), name="ctp", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = ops.reshape(ops.argmax(y_pred, axis=1), (-1, 1))
        values = ops.cast(y_true, "int32") == ops.cast(y_pred, "int32")
        self.true_positives.assign_add(ops.sum(ops.cast(values, "float32")))

    def result(self):
        return self.true_positives


def run():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=[CategoricalTruePositives()])
    return model.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)["categorical_true_positives"]


one = run()
with strategy.scope():
    two = run()
print("one device : categorical_true_positives %.0f" % one)
print("2 replicas : categorical_true_positives %.0f" % two)
if one != two:
    print(f"BUG REPRODUCED: metric {two:.0f} under 2 replicas vs {one:.0f} on one device (same weights)")
    sys.exit(1)
print("NOT REPRODUCED")
