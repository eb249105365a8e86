"""``plain_script.py`` ported to ``MirroredStrategy`` by hand: scope, global batch, nothing else.

How to run (arm (c) of ``run.py --sections run-speed``; ~20-40 s for cnn,
~1-3 min for resnet20 on 2 cores)::

    python benchmarks/plain_script_ported.py --replicas 2 --model cnn --batch-size 32

What a user does following the TensorFlow tutorial "Distributed training with
Keras": split the CPU into ``--replicas`` logical devices (a CPU-only machine
has one), create ``MirroredStrategy`` over them, build and compile inside
``strategy.scope()``, and scale the batch: ``--batch-size`` is per replica,
``fit`` gets ``batch_size x replicas``. Same data, model, optimizer, epochs,
seed, timer and report as ``plain_script.py`` (imported from it, so the two
cannot drift apart); stock TensorFlow and Keras, no mirrorkit.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--replicas", type=int, default=1)
    ported, rest = parser.parse_known_args()
    sys.argv[1:] = rest

    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(ported.replicas)])
    strategy = tf.distribute.MirroredStrategy(
        [d.name for d in tf.config.list_logical_devices("CPU")])

    import keras
    from plain_script import EpochTimer, build_model, load_data, parse_args, report

    args = parse_args()
    keras.utils.set_random_seed(args.seed)
    (x_train, y_train), (x_val, y_val) = load_data(
        "digits" if args.model == "cnn" else "synthetic", args.seed)
    global_batch = args.batch_size * strategy.num_replicas_in_sync
    with strategy.scope():
        model = build_model(args.model, x_train.shape[1:])
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    timer = EpochTimer()
    model.fit(x_train, y_train, batch_size=global_batch, epochs=args.epochs,
              validation_data=(x_val, y_val), callbacks=[timer], verbose=2)
    report(model, timer, x_train, (x_val, y_val), global_batch)


if __name__ == "__main__":
    main()
