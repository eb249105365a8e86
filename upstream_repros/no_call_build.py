"""fit under any tf.distribute strategy fails for a model without call() (keras.io's GAN pattern).

What happens: a keras.Model subclass without call() that overrides train_step (keras.io's
GAN/WGAN-GP/CycleGAN guides) trains without a strategy, where Keras defers building to the
step. Under a strategy, TensorFlowTrainer._maybe_symbolic_build -> Trainer._symbolic_build
calls the model on x first and fails: "RuntimeError: Unable to automatically build the
model ... does not have a `call()` method implemented".
Expected: fit trains as without a strategy (the step never calls the model itself).
Versions tested: see README.md in this folder.
mirrorkit's fix (no-call-build): skip the symbolic build for a model whose call() is
Keras's placeholder (and for a custom-step model when Keras's guess fails).
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


class Holder(keras.Model):  # no call(): holds a network, trains it in its own step
    def __init__(self):
        super().__init__()
        self.net = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer="ones")])

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.ops.square(self.net(x) - y))
        self.optimizer.apply(tape.gradient(loss, self.net.trainable_weights), self.net.trainable_weights)
        return {"loss": loss}


def run():
    model = Holder()
    model.compile(keras.optimizers.SGD(0.1))
    model.optimizer.build(model.net.trainable_weights)  # keep optimizer variables out of the trace
    model.fit(x, y, batch_size=32, epochs=1, verbose=0, shuffle=False)
    return model.net.get_weights()[0].ravel()


print("one device kernel:", run())
try:
    with strategy.scope():
        print("2 replicas kernel:", run())
except Exception as e:  # noqa: BLE001
    said = "does not have a `call()` method" in str(e)
    print(f"BUG REPRODUCED: fit under 2 replicas raised {type(e).__name__}: {str(e).split('. ')[0]}"
          + (" ... 'Model Holder does not have a `call()` method implemented'" if said else ""))
    sys.exit(1)
print("NOT REPRODUCED")
