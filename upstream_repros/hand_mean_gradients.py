"""A loss a custom train_step averages by hand gets N times one device's gradient under N replicas.

What happens: Keras divides a keras.losses loss by N inside a training step so that the
all-reduced sum of the replicas' gradients is one device's gradient. A loss written by hand
(keras.io's VAE: ops.mean(...); "Customizing what happens in fit()": ops.mean((y_pred -
y) ** 2)) gets no such division: each replica differentiates the mean over its own rows
and the sum is 2x one device's gradient under 2 replicas; one SGD step moves 2x as far.
Expected: either the same update as on one device, or a documented requirement (and
error/warning) to scale hand-written losses by 1/num_replicas_in_sync in Keras's fit.
Versions tested: see README.md in this folder.
mirrorkit's fix (hand-mean-gradients): in fit's step on 2+ replicas, the gradient of a
hand-written mean over the replica's rows is weighed by 1/N.
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 1)).astype("float32") + 3


class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1, kernel_initializer="zeros")

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = keras.ops.mean((self(x, training=True) - y) ** 2)
        self.optimizer.apply(tape.gradient(loss, self.trainable_weights), self.trainable_weights)
        return {"loss": loss}


def run():
    model = Net()
    model.compile(keras.optimizers.SGD(0.1))
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    return float(model.get_weights()[1][0])


one = run()
with strategy.scope():
    two = run()
print("one device : bias after one SGD step %.4f" % one)
print("2 replicas : bias after one SGD step %.4f" % two)
if abs(one - two) > 1e-4 * abs(one):
    print(f"BUG REPRODUCED: update x{two / one:.2f} under 2 replicas ({two:.4f} vs {one:.4f})")
    sys.exit(1)
print("NOT REPRODUCED")
