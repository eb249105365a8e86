"""A Keras layer first built inside tf.function(strategy.run) fails with 2 replicas (custom loop).

What happens: Keras 3 creates a layer's weights at its first call. In a custom training loop
(TensorFlow's "Custom training with tf.distribute.Strategy", keras.io's "writing a training
loop from scratch") that first call happens while tf.function traces strategy.run. With 2+
replicas MirroredStrategy initialises replica 1's copy from the primary copy inside the
function, tf.function cannot lift the initializers and runs the whole step inside
tf.cond(initialized, ...), whose branch captures placeholders it never feeds: "You must
feed a value for placeholder tensor 'cond/else/_1/cond/Placeholder'".
Here a Dense layer and an SGD optimizer are both first used in the step. Measured: with the
layer built before the step (optimizer still lazy) it runs, on both stacks tested; with
the layer lazy and the update written by hand (no optimizer) it runs too; together they
fail, on keras-nightly too, which has keras-team/keras#23087.
Expected: the step runs, as on one device (or with one replica).
The optimizer-slot half of this bug is keras-team/keras#23085 (fixed by
keras-team/keras#23087 with tf.init_scope); layer weights are not covered by that fix.
Versions tested: see README.md in this folder.
mirrorkit's fix (step-variables): a Keras variable first created inside a traced step under
2+ replicas is created outside the trace (tf.init_scope, under the strategy's scope).
"""
import sys
import numpy as np
import tensorflow as tf
import keras

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")



def train(b):  # one SGD step (the optimizer is built in the step too, as in the tutorials)
    with tf.GradientTape() as tape:
        loss = keras.ops.mean(layer(b) ** 2)
    opt.apply(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables)
    return loss


layer, opt = keras.layers.Dense(1, kernel_initializer="ones"), keras.optimizers.SGD(0.1)
tf.function(train)(x)
one = layer.kernel.numpy().sum()
print("one device: kernel sum after one step", one)
with strategy.scope():
    layer, opt = keras.layers.Dense(1, kernel_initializer="ones"), keras.optimizers.SGD(0.1)
dist = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(x))
step = tf.function(lambda batch: strategy.run(train, args=(batch,)))
try:
    step(next(iter(dist)))
    two = layer.kernel.numpy().sum()
    print("2 replicas: kernel sum after one step", two)
except Exception as e:  # noqa: BLE001
    msg = [l.strip() for l in str(e).splitlines() if "must feed" in l] or [str(e)[:200]]
    print(f"BUG REPRODUCED: {type(e).__name__}: {msg[0][:250]}")
    sys.exit(1)
print("NOT REPRODUCED")
