"""A custom train_step that logs the loss it computed reports 1/N of it under N replicas.

What happens: inside a training step under N replicas a keras.losses.Loss returns each
replica's share of the global loss (its mean divided by N). Keras's own train_step
multiplies the share back before logging; a custom train_step written as the keras.io
guides write it (loss = self.loss_fn(y, y_pred) in the tape, then
self.loss_tracker.update_state(loss)) logs the share: 1/2 of the one-device loss under 2
replicas, while the weights train correctly.
Expected: the same logged loss as on one device.
Related (tf.keras 2, different mechanics): keras-team/keras#15509.
Versions tested: see README.md in this folder.
mirrorkit's fix (logged-step-losses): a share handed to keras.metrics.Mean (or returned as
a log) from Keras's step is logged N times over.
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")


class Net(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1, kernel_initializer="ones")
        self.loss_fn = keras.losses.MeanSquaredError()
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.loss_fn(y, self(x, training=True))
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply(grads, self.trainable_weights)
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}

    @property
    def metrics(self):
        return [self.loss_tracker]


def run():
    model = Net()
    model.compile(keras.optimizers.SGD(0.1))
    loss = model.fit(x, y, batch_size=64, epochs=1, verbose=0).history["loss"][0]
    return loss, model.get_weights()[0].ravel()


(one, w1) = run()
with strategy.scope():
    (two, w2) = run()
print("one device : logged loss %.4f, kernel after one step %s" % (one, w1))
print("2 replicas : logged loss %.4f, kernel after one step %s" % (two, w2))
if abs(one - two) > 1e-4 * abs(one):
    print(f"BUG REPRODUCED: logged loss {two:.4f} under 2 replicas vs {one:.4f} (x{two / one:.2f}); "
          f"weights {'equal' if np.allclose(w1, w2, atol=1e-6) else 'differ'}")
    sys.exit(1)
print("NOT REPRODUCED")
