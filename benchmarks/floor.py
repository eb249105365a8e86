"""The floor: the model's own cost, one bare ``tf.function`` train step on a fixed batch.

How to run (one process: ~15 s for cnn, ~30-60 s for resnet20 on 2 cores;
``run.py --sections floor`` alternates it with the mirrorkit arm: ~25 min for
the 4 default configurations at 5 runs)::

    python benchmarks/floor.py --model cnn --dataset digits --replicas 1 --steps 400
    python benchmarks/floor.py --model resnet20 --dataset synthetic --replicas 2 --steps 60
    python benchmarks/run.py --sections floor --runs 5

What is timed: forward, loss, gradients and the optimizer's apply (the
gradient all-reduce included) -- ``strategy.run`` of the per-replica step
inside a ``tf.function`` -- on one global batch of real images held on the
devices (``experimental_distribute_values_from_function``): no input
pipeline, no callbacks, no metrics, no Keras ``fit``. The strategy is the one
the mirrorkit arm trains under (``mirrorkit.get_strategy("mirrored",
simulate_cpus=N)``: same devices, same thread split), the model, optimizer
(Adam, scaled lr) and loss are those of ``_common``. Each call runs ``k``
steps in a ``tf.range`` loop (``--steps-per-call``, default 1 and 16: one
call per step, and the in-graph loop that removes Python dispatch); after
``--warmup`` untimed calls, every call is timed to the returned loss being
on the host. The floor is the smaller of the per-step medians.

``run.py`` reports mirrorkit's median step time (the same ``step_timer`` as
every other arm: batch begin to batch end) divided by this floor. Goal:
<= 1.05 for resnet20, <= 1.15 for the cnn (issue 18).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--per-replica-batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=200, help="timed steps per k")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls per k")
    parser.add_argument("--steps-per-call", default="1,16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="accepted, unused (run.py)")
    return parser.parse_args()


def main() -> None:
    args = parse()

    import mirrorkit

    strategy = mirrorkit.get_strategy("mirrored", simulate_cpus=args.replicas)

    import keras
    import tensorflow as tf
    from _common import compile_args, load_arrays

    from mirrorkit.training.models import build_model

    keras.utils.set_random_seed(args.seed)
    replicas = strategy.num_replicas_in_sync
    per, batch = args.per_replica_batch, args.per_replica_batch * replicas
    args.limit = None
    (x, y), spec = load_arrays(args)
    x, y = x[:batch], y[:batch]

    with strategy.scope():
        model = build_model(args.model, input_shape=spec["input_shape"],
                            num_classes=spec["num_classes"])
        optimizer = compile_args(args, batch)["optimizer"]
        optimizer.build(model.trainable_variables)
    per_example = keras.losses.SparseCategoricalCrossentropy(reduction=None)

    def on_device(ctx: tf.distribute.InputContext) -> tuple[tf.Tensor, tf.Tensor]:
        i = ctx.replica_id_in_sync_group
        return tf.constant(x[i * per:(i + 1) * per]), tf.constant(y[i * per:(i + 1) * per])

    inputs = strategy.experimental_distribute_values_from_function(on_device)

    def step(xb: tf.Tensor, yb: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(per_example(yb, model(xb, training=True)),
                                              global_batch_size=batch)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def make(k: int):
        @tf.function
        def run() -> tf.Tensor:
            loss = tf.constant(0.0)
            for _ in tf.range(k):
                loss = strategy.reduce("SUM", strategy.run(step, args=inputs), axis=None)
            return loss
        return run

    rows = {}
    for k in (int(v) for v in args.steps_per_call.split(",")):
        run = make(k)
        for _ in range(args.warmup):
            run().numpy()
        per_step = []
        for _ in range(max(1, -(-args.steps // k))):
            start = time.perf_counter()
            run().numpy()
            per_step.append((time.perf_counter() - start) / k)
        rows[k] = {"median_step_ms": round(statistics.median(per_step) * 1000, 3),
                   "min_step_ms": round(min(per_step) * 1000, 3), "calls": len(per_step)}
    best = min(rows, key=lambda k: rows[k]["median_step_ms"])
    print("RESULT " + json.dumps({
        "variant": "floor: bare tf.function step (strategy.run), fixed batch on device",
        "model": args.model, "dataset": args.dataset, "replicas": replicas,
        "global_batch": batch, "per_steps_per_call": {str(k): v for k, v in rows.items()},
        "floor_steps_per_call": best, "median_step_ms": rows[best]["median_step_ms"],
        "images_per_sec": round(batch / rows[best]["median_step_ms"] * 1000, 1),
        "intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads(),
    }), flush=True)


if __name__ == "__main__":
    main()
