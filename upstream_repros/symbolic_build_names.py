"""Under a tf.distribute strategy, fit's symbolic build advances the keras_tensor_N name counter.

What happens: Keras names symbolic tensors from one process-wide counter (keras_tensor,
keras_tensor_1, ...). Under any strategy, and only there, fit first builds the model
symbolically (Trainer._symbolic_build) and creates throwaway symbolic tensors, so tensor
names made after fit differ from plain Python's: TensorFlow's image-classification
tutorial converts its model with TFLiteConverter and calls the signature runner with an
input name that no longer exists ("ValueError: Invalid Input name").
Expected: fit under a strategy leaves the counter where fit without one leaves it.
Versions tested: see README.md in this folder.
mirrorkit's fix (symbolic-build-names): the build's throwaway tensors leave the counter
as plain Python leaves it.
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
keras.Input((1,))  # the first tensor is named "keras_tensor", later ones "keras_tensor_N"


def counter():
    return int(keras.Input((1,)).name.rsplit("_", 1)[1])


def tensors_made_by_fit():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse", metrics=["mae"])
    start = counter()
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    return counter() - start - 1


one = tensors_made_by_fit()
with strategy.scope():
    two = tensors_made_by_fit()
print("one device : keras_tensor names used by fit:", one)
print("2 replicas : keras_tensor names used by fit:", two)
if one != two:
    print(f"BUG REPRODUCED: fit under MirroredStrategy advanced the keras_tensor counter by {two} (plain: {one})")
    sys.exit(1)
print("NOT REPRODUCED")
