"""A plain Keras training script, as a user has it: arrays in, ``model.fit``, no distribution.

How to run (``run.py --sections run-speed`` alternates the three ways below;
each run ~20-40 s for cnn, ~1-3 min for resnet20 on 2 cores)::

    mirrorkit run --simulate-cpus 2 benchmarks/plain_script.py --model cnn --batch-size 64   # (a)
    mirrorkit run --speed-up-fit --simulate-cpus 2 benchmarks/plain_script.py \\
        --model cnn --batch-size 64                                                          # (b)
    python benchmarks/plain_script_ported.py --replicas 2 --model cnn --batch-size 32     # (c)

The models are defined here, with stock Keras layers (a small CNN for the
8x8 digits, a CIFAR-style ResNet-20 for 32x32 images); the data are
the UCI digits mirrorkit embeds or synthetic class templates plus noise, generated with
NumPy. The script keeps Keras's defaults (``steps_per_execution=1``, arrays
handed to ``fit``, ``validation_data``), and times its own epochs with an
epoch-level callback (no per-batch hook: ``--speed-up-fit`` may act), so the
training images/s excludes the validation pass and epoch 1 (warm-up).
The last line, ``RESULT {json}``, is what ``run.py`` reads.
"""

from __future__ import annotations

import argparse
import json
import time

import keras
import numpy as np
from keras import layers


def load_data(name: str, seed: int = 0):
    """``(x_train, y_train), (x_val, y_val)``: digits (8x8x1) or synthetic (32x32x3), in [0, 1]."""
    if name == "digits":
        from mirrorkit.datasets import digits_arrays

        x, y = digits_arrays()
        order = np.random.default_rng(seed).permutation(len(x))
        x, y = x[order], y[order]
        split = int(0.8 * len(x))
        return (x[:split], y[:split]), (x[split:], y[split:])
    rng = np.random.default_rng(seed)
    templates = rng.uniform(0, 1, (10, 32, 32, 3)).astype("float32")

    def make(n: int, offset: int):
        y = (np.arange(n) + offset) % 10
        noise = np.random.default_rng(offset + 1).uniform(0, 1, (n, 32, 32, 3))
        return (0.5 * templates[y] + 0.5 * noise).astype("float32"), y.astype("int32")

    return make(1024, 0), make(208, 1024)


def build_model(name: str, input_shape: tuple[int, ...]) -> keras.Model:
    """A small CNN, or ResNet-20 (He et al. 2016: 3 stages of 3 blocks, 16/32/64 filters)."""
    inputs = keras.Input(input_shape)
    if name == "cnn":
        x = layers.Conv2D(32, 3, padding="same", activation="relu")(inputs)
        x = layers.Conv2D(64, 3, padding="same", activation="relu")(x)
        x = layers.MaxPooling2D()(x)
        x = layers.Flatten()(layers.Dropout(0.25)(x))
        x = layers.Dense(128, activation="relu")(x)
    else:
        def conv_bn(x, filters, strides=1, relu=True):
            x = layers.Conv2D(filters, 3, strides=strides, padding="same", use_bias=False)(x)
            x = layers.BatchNormalization()(x)
            return layers.ReLU()(x) if relu else x

        x = conv_bn(inputs, 16)
        for stage, filters in enumerate((16, 32, 64)):
            for block in range(3):
                strides = 2 if stage and not block else 1
                shortcut = x
                y = conv_bn(conv_bn(x, filters, strides), filters, relu=False)
                if strides != 1 or shortcut.shape[-1] != filters:
                    shortcut = layers.Conv2D(filters, 1, strides=strides, use_bias=False)(x)
                x = layers.ReLU()(layers.Add()([y, shortcut]))
        x = layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, layers.Dense(10, activation="softmax")(x))


class EpochTimer(keras.callbacks.Callback):
    """Seconds of training per epoch: epoch begin to the start of validation (or epoch end)."""

    def __init__(self) -> None:
        super().__init__()
        self.seconds: list[float] = []
        self._start = None

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_test_begin(self, logs=None):
        self._stop()

    def on_epoch_end(self, epoch, logs=None):
        self._stop()

    def _stop(self) -> None:
        if self._start is not None:
            self.seconds.append(time.perf_counter() - self._start)
            self._start = None


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn", choices=("cnn", "resnet20"))
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def report(model: keras.Model, timer: EpochTimer, x_train, val, batch_size: int) -> None:
    """Print training images/s over epochs 2..N and the final validation scores."""
    loss, accuracy = model.evaluate(*val, batch_size=batch_size, verbose=0)
    timed = timer.seconds[1:]
    print("RESULT " + json.dumps({
        "images_per_sec": round(len(timed) * len(x_train) / sum(timed), 2) if timed else 0.0,
        "epoch_seconds": [round(s, 3) for s in timer.seconds],
        "val_accuracy": round(float(accuracy), 4), "val_loss": round(float(loss), 4),
        "global_batch": batch_size, "steps_per_execution": int(model.steps_per_execution),
        "replicas": model.distribute_strategy.num_replicas_in_sync,
    }), flush=True)


def main() -> None:
    args = parse_args()
    keras.utils.set_random_seed(args.seed)
    (x_train, y_train), (x_val, y_val) = load_data(
        "digits" if args.model == "cnn" else "synthetic", args.seed)
    model = build_model(args.model, x_train.shape[1:])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    timer = EpochTimer()
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              validation_data=(x_val, y_val), callbacks=[timer], verbose=2)
    report(model, timer, x_train, (x_val, y_val), args.batch_size)


if __name__ == "__main__":
    main()
