"""A contrastive loss in a custom train_step pairs only each replica's slice under N replicas.

What happens: a loss that compares every example of its batch with every other (keras.io's
SimCLR: a (batch, batch) similarity matrix scored with cross-entropy against arange(batch))
has no per-replica form: under 2 replicas each replica pairs only its own 32 of 64 rows, so
the gradient and the update differ from one device's, with no error or warning.
Expected: the same update as on one device, or at least a warning/documentation that
batch-pairing losses need strategy-aware gathering (ops/all_gather) in train_step.
Analogous report in another TF library: tensorflow/similarity#258.
Versions tested: see README.md in this folder.
mirrorkit (paired-step-losses) does not change the result: it names such a loss once and
says how to make it exact (gather the rows with all_gather).
"""
import sys
import numpy as np
import tensorflow as tf
import keras
from keras import ops

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")


class Contrastive(keras.Model):
    def __init__(self):
        super().__init__()
        self.encoder = keras.layers.Dense(8, kernel_initializer=keras.initializers.GlorotUniform(seed=0))
        self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def call(self, x):
        return self.encoder(x)

    def train_step(self, data):
        a = data + 0.1  # two "views" of the batch
        with tf.GradientTape() as tape:
            za, zb = ops.normalize(self(data)), ops.normalize(self(a))
            similarities = ops.matmul(za, ops.transpose(zb)) / 0.1  # (batch, batch)
            loss = self.loss_fn(ops.arange(ops.shape(za)[0]), similarities)
        self.optimizer.apply(tape.gradient(loss, self.trainable_weights), self.trainable_weights)
        return {"loss": loss}


def run():
    model = Contrastive()
    model.compile(keras.optimizers.SGD(1.0))
    model.fit(x, batch_size=64, epochs=1, verbose=0)
    return model.get_weights()[0]


one = run()
with strategy.scope():
    two = run()
diff = np.abs(one - two).max()
print("one device : kernel[0, :4] after one step", one[0, :4])
print("2 replicas : kernel[0, :4] after one step", two[0, :4])
if diff > 1e-5:
    print(f"BUG REPRODUCED: weights after one step differ by {diff:.3g} under 2 replicas (no warning)")
    sys.exit(1)
print(f"NOT REPRODUCED (max difference {diff:.3g})")
