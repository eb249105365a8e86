"""A seedless keras.random draw in train_step fails under a tf.distribute strategy.

What happens: keras.random.normal(shape) without a seed uses Keras's global SeedGenerator,
kept in thread-local state and created on first use. MirroredStrategy runs each replica's
step in a thread of its own, started anew for every trace, so each replica thread of each
trace makes a new generator: a tf.Variable created on the step's second trace (here the
last, smaller batch of 40 rows at batch_size=16), and TensorFlow stops with "tf.function
only supports singleton tf.Variables created on the first call". Without a strategy it trains.
Expected: fit trains as on one device (one global generator per process).
Versions tested: see README.md in this folder.
mirrorkit's fix (replica-global-seed): a replica thread uses the global SeedGenerator of the
thread that started the replicas.
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
keras.utils.set_random_seed(0)
x = np.random.default_rng(0).normal(size=(40, 3)).astype("float32")


class Noisy(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(1)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        noise = keras.random.normal(keras.ops.shape(x))  # no seed: Keras's global generator
        with tf.GradientTape() as tape:
            loss = keras.ops.mean((self(x + noise) - y) ** 2)
        self.optimizer.apply(tape.gradient(loss, self.trainable_weights), self.trainable_weights)
        return {"loss": loss}


def run():
    model = Noisy()
    model.compile(keras.optimizers.SGD(0.01))
    model.fit(x, x[:, :1], batch_size=16, epochs=1, verbose=0, shuffle=False)
    return model.get_weights()[0].ravel()


print("one device kernel after 1 epoch:", run())
try:
    with strategy.scope():
        print("2 replicas kernel after 1 epoch:", run())
except Exception as e:  # noqa: BLE001
    said = "singleton tf.Variables created on the first call" in str(e)
    print(f"BUG REPRODUCED: fit under 2 replicas raised {type(e).__name__}"
          + (": tf.function only supports singleton tf.Variables created on the first call" if said
             else ": " + str(e)[:200]))
    sys.exit(1)
print("NOT REPRODUCED")
