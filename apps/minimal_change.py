"""The minimal change: a single-device Keras script plus two mirrorkit lines.

The two lines are marked ``# mirrorkit: line 1/2`` and ``line 2/2``: import
mirrorkit, and build + compile the model inside ``mirrorkit.scope()``. The rest
is the usual single-GPU script: a small CNN on the 8x8 UCI digits images
(``digits_data.load_digits`` reads the copy mirrorkit ships, as scikit-learn's
``load_digits`` would; nothing is downloaded).

    python apps/minimal_change.py                             # all local GPUs, else 1 CPU
    MIRRORKIT_SIMULATE_CPUS=2 python apps/minimal_change.py   # 2 replicas on a CPU

``batch_size`` in ``fit`` is the global batch: with N replicas each computes on
``batch_size / N`` examples per step, so the training math is that of one
device. Takes ~15 s on 2 CPU cores and reaches ~97% test accuracy.
"""

import keras
import numpy as np
from digits_data import load_digits

import mirrorkit  # mirrorkit: line 1/2

keras.utils.set_random_seed(0)
digits = load_digits()
x = (digits.images / 16.0).astype("float32")[..., None]   # (n, 8, 8, 1) in [0, 1]
y = digits.target.astype("int32")
order = np.random.default_rng(0).permutation(len(x))
x, y = x[order], y[order]
split = int(0.8 * len(x))
x_train, y_train, x_test, y_test = x[:split], y[:split], x[split:], y[split:]

with mirrorkit.scope():  # mirrorkit: line 2/2
    inputs = keras.Input((8, 8, 1))
    h = keras.layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
    h = keras.layers.BatchNormalization()(h)
    h = keras.layers.Conv2D(64, 3, padding="same", activation="relu")(h)
    h = keras.layers.Dropout(0.25)(keras.layers.MaxPooling2D()(h))
    model = keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Flatten()(h)))
    model.compile(optimizer=keras.optimizers.Adam(2e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])

model.fit(x_train, y_train, batch_size=64, epochs=6, verbose=2)
_, accuracy = model.evaluate(x_test, y_test, verbose=0)
print(f"replicas: {model.distribute_strategy.num_replicas_in_sync}")
print(f"test accuracy: {accuracy:.3f}")
