"""fit with a train_step that applies its optimizer twice is not repeatable (Grappler).

What happens: a train_step that takes two optimizer steps per batch (keras.io's WGAN-GP takes
several critic steps, a GAN one per network) reads the weights the first step wrote. With the
same seed, the same data and no strategy, identical fits in one process give different losses
now and then (here 6 fits; measured up to 0.0027-0.0089 apart, from the first step on): the
step's variable reads and writes do not always run in the order written. Grappler's dependency
optimizer is involved: with
tf.config.optimizer.set_experimental_options({"dependency_optimization": False}) every fit
gives the same losses. It shows on TensorFlow 2.21 / Keras 3.15.1 too; with
tests/fixtures/scripts/step_draws.py (two critic steps per batch) it showed on the nightly pair
only, whose Keras runs one step per call as a tf.function called on a batch fetched in Python
(plain Python's first-epoch loss -0.39957, -0.39723, -0.40012 and -0.39737 in four runs there,
repeatable with the dependency optimizer off or steps_per_execution=2; -0.37113 in five runs on
2.21 / 3.15.1).
Not a bug mirrorkit works around: it is why tests/compat/test_replica_seeds.py, which compares
that script under mirrorkit with plain Python to 1e-6, cannot pass on the nightly pair.
Expected: identical fits give identical losses (the step's reads ordered after its writes).
Versions tested: see README.md in this folder.
"""
import sys

import numpy as np
import tensorflow as tf
import keras
from keras import layers, ops


class TwoUpdates(keras.Model):  # two optimizer steps per batch, as a WGAN-GP critic takes
    def __init__(self):
        super().__init__()
        self.critic = keras.Sequential([keras.Input((4,)), layers.Dense(8, activation="relu"),
                                        layers.Dense(1)])
        self.tracker = keras.metrics.Mean(name="loss")

    @property
    def metrics(self):
        return [self.tracker]

    def train_step(self, data):
        real, _ = data
        for _ in range(2):
            fake = real * 0.5
            with tf.GradientTape() as tape:
                loss = ops.mean(self.critic(fake)) - ops.mean(self.critic(real)) \
                    + 0.1 * ops.mean(ops.square(self.critic(real + fake)))
            grads = tape.gradient(loss, self.critic.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.critic.trainable_weights))
        self.tracker.update_state(loss)
        return {"loss": self.tracker.result()}


x = np.random.RandomState(0).rand(96, 4).astype("float32")


def run():
    keras.utils.set_random_seed(3)
    model = TwoUpdates()
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    return model.fit(x, x[:, :1], batch_size=32, epochs=2, shuffle=False,
                     verbose=0).history["loss"]


losses = np.array([run() for _ in range(6)])
for row in losses:
    print("epoch losses:", row)
spread = float(np.ptp(losses, axis=0).max())
if spread > 1e-6:
    print(f"BUG REPRODUCED: 6 identical fits gave losses up to {spread:.3g} apart")
    sys.exit(1)
print("NOT REPRODUCED")
