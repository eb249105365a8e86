"""A plain single-device Keras script: no mirrorkit import, no tf.distribute.

It trains a small CNN on the 8x8 UCI digits images (1,797 images, 10 classes;
``digits_data.load_digits`` reads the copy mirrorkit ships, as scikit-learn's
``load_digits`` would; nothing is downloaded). Run it unchanged on every
local device with ``mirrorkit run``:

    python apps/plain_keras_script.py --epochs 3              # 1 replica
    mirrorkit run --simulate-cpus 2 apps/plain_keras_script.py --epochs 3
    mirrorkit run --simulate-cpus 2 --scale-batch apps/plain_keras_script.py --batch-size 32

Under ``mirrorkit run`` the model is built inside the strategy's scope, so it
reports 2 replicas; ``--batch-size`` is the global batch unless
``--scale-batch`` makes it the per-replica batch. Takes ~15 s on 2 CPU cores.
"""

import argparse

import keras
import numpy as np
from digits_data import load_digits


def load_data(seed=0):
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]   # (n, 8, 8, 1) in [0, 1]
    y = digits.target.astype("int32")
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order], y[order]
    split = int(0.8 * len(x))
    return (x[:split], y[:split]), (x[split:], y[split:])


def build_model():
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.Adam(2e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    keras.utils.set_random_seed(args.seed)
    (x_train, y_train), (x_test, y_test) = load_data(args.seed)
    model = build_model()
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs, verbose=2)
    _, accuracy = model.evaluate(x_test, y_test, batch_size=args.batch_size, verbose=0)
    print(f"replicas: {model.distribute_strategy.num_replicas_in_sync}")
    print(f"test accuracy: {accuracy:.3f}")


if __name__ == "__main__":
    main()
