"""Under a tf.distribute strategy, fit peeks at one batch first and so trains in another data order.

What happens: under any strategy, and only there, TensorFlowTrainer._maybe_symbolic_build
takes one batch from the input before fit starts the epoch afresh. That extra pass draws
the input's randomness once more: a generator (or PyDataset) shuffling with NumPy/Python
random, or a reshuffling tf.data pipeline, trains epoch 1 on the order plain Python uses
for epoch 2. Same model, same seed: other weights after one epoch.
Expected: the input is iterated once per epoch, as without a strategy.
Versions tested: see README.md in this folder.
mirrorkit's fix (symbolic-build-order): build from the input's element_spec instead of a
peeked batch (else peek and restore Python's and NumPy's random states).
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


def run():
    np.random.seed(0)
    passes = []

    def batches():  # shuffles with NumPy each time it is iterated
        order = np.random.permutation(64)
        passes.append(order[:4])
        for i in range(0, 64, 16):
            yield x[order[i:i + 16]], y[order[i:i + 16]]

    data = tf.data.Dataset.from_generator(batches, output_signature=(
        tf.TensorSpec((None, 4), tf.float32), tf.TensorSpec((None, 1), tf.float32)))
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer="ones")])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    model.fit(data, epochs=1, verbose=0)
    return len(passes), model.get_weights()[0].ravel()


(n1, w1) = run()
with strategy.scope():
    (n2, w2) = run()
print("one device : input iterated %d time(s) for 1 epoch, kernel %s" % (n1, w1))
print("2 replicas : input iterated %d time(s) for 1 epoch, kernel %s" % (n2, w2))
if n1 != n2 or np.abs(w1 - w2).max() > 1e-5:
    print(f"BUG REPRODUCED: input iterated {n2}x (plain {n1}x), kernel differs by {np.abs(w1 - w2).max():.3g}")
    sys.exit(1)
print("NOT REPRODUCED")
