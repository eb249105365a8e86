"""Side A: the hand-written tf.distribute code a user would write without mirrorkit.

It follows the TensorFlow tutorial "Distributed training with Keras" and the
keras.io multi-GPU guide line by line: ``MirroredStrategy`` over the local
devices, the global batch = per-replica batch x replicas, build and compile in
``strategy.scope()``, ``Dataset.from_tensor_slices(...).shuffle(...).batch(...)``
and ``model.fit``. Nothing is tuned (no prefetch, no ``drop_remainder``, no
``steps_per_execution``): that is the point of the comparison.

Only the parts that are not the distribution harness come from mirrorkit, so
both sides train exactly the same network on exactly the same images: the
model architecture (:func:`mirrorkit.training.models.build_model`), the data arrays
(:func:`mirrorkit.datasets.load`, materialised to NumPy like
``keras.datasets.*.load_data()`` returns them), and the stopwatch
(:func:`mirrorkit.bench.step_timer`, the same one side B uses).

Example:
    python benchmarks/baseline_keras.py --model cnn --dataset digits --replicas 2 --epochs 4
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    compile_args,
    final_scores,
    load_arrays,
    mirrored_over_cpus,
    parse_args,
    report,
)


def main() -> None:
    args = parse_args(__doc__)

    import tensorflow as tf

    # Tutorial steps 0-1 (CPU-only machine): split the CPU into N logical
    # devices -- before any other op -- and a MirroredStrategy over them.
    strategy = mirrored_over_cpus(args.replicas)

    import keras

    keras.utils.set_random_seed(args.seed)
    # Tutorial step 2: global batch = per-replica batch x replicas.
    batch_size = args.per_replica_batch * strategy.num_replicas_in_sync

    # Tutorial step 3: the input pipeline from in-memory arrays.
    (x_train, y_train), spec = load_arrays(args)
    buffer_size = 10_000
    train_dataset = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
                     .shuffle(buffer_size, seed=args.seed)
                     .batch(batch_size))

    # Tutorial step 4: build and compile inside the strategy's scope.
    from mirrorkit.training.models import build_model

    with strategy.scope():
        model = build_model(args.model, input_shape=spec["input_shape"],
                            num_classes=spec["num_classes"])
        model.compile(**compile_args(args, batch_size))

    # Tutorial step 5: fit.
    from mirrorkit.bench import step_timer

    timer = step_timer()
    # verbose left at Keras's default, as in the tutorial.
    model.fit(train_dataset, epochs=args.epochs, callbacks=[timer])
    val, _ = load_arrays(args, "val")
    report(args, timer, batch_size, strategy.num_replicas_in_sync,
           images_per_epoch=len(x_train),
           variant="baseline: tutorial MirroredStrategy + from_tensor_slices.shuffle.batch",
           extra=final_scores(model, val))


if __name__ == "__main__":
    main()
