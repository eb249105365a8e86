"""A keras.losses.Loss called inside a layer for add_loss is divided by N twice under N replicas.

What happens: keras.io's LogisticEndpoint ("Training & evaluation with the built-in
methods") calls a keras.losses.Loss inside call() and passes it to add_loss. Under N
replicas the Loss divides its mean by N (replica context) and add_loss values are divided
by N again (_aggregate_additional_loss): the loss trains at 1/N of its strength.
Expected: the same update (and logged loss) as on one device.
Versions tested: see README.md in this folder.
mirrorkit's fix (layer-losses): a Loss called while a layer is being called is left
unscaled; add_loss scales it once.
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
rng = np.random.default_rng(0)
x, y = rng.normal(size=(64, 4)).astype("float32"), (rng.random((64, 1)) > 0.5).astype("float32")


class LogisticEndpoint(keras.layers.Layer):
    def __init__(self):
        super().__init__()
        self.loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def call(self, targets, logits):
        self.add_loss(self.loss_fn(targets, logits))
        return keras.ops.sigmoid(logits)


def run():
    inputs, targets = keras.Input((4,)), keras.Input((1,))
    logits = keras.layers.Dense(1, kernel_initializer="zeros")(inputs)
    model = keras.Model([inputs, targets], LogisticEndpoint()(targets, logits))
    model.compile(keras.optimizers.SGD(1.0))
    loss = model.fit([x, y], batch_size=64, epochs=1, verbose=0).history["loss"][0]
    return np.concatenate([w.ravel() for w in model.get_weights()]), loss


one, loss1 = run()
with strategy.scope():
    two, loss2 = run()
print("one device : logged loss %.4f, weights after one step %s" % (loss1, one))
print("2 replicas : logged loss %.4f, weights after one step %s" % (loss2, two))
if not np.allclose(one, two, rtol=1e-4, atol=1e-6) or abs(loss1 - loss2) > 1e-4:
    print(f"BUG REPRODUCED: update x{np.linalg.norm(two) / np.linalg.norm(one):.2f}, "
          f"logged loss x{loss2 / loss1:.2f} under 2 replicas")
    sys.exit(1)
print("NOT REPRODUCED")
