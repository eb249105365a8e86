"""The pure cost of communication: 2 loopback workers vs 2 independent processes, same work.

How to run (one arm = 2 processes started together; ~25 s for cnn, ~30-40 s
for resnet20 on a quiet 2-core machine; ``run.py --sections communication
--runs 3`` runs 7 arms x 2 models x 3 rounds: ~25 min)::

    python benchmarks/communication.py --model cnn --dataset digits --arm independent
    python benchmarks/communication.py --model cnn --dataset digits --arm workers --variant auto
    python benchmarks/communication.py --model resnet20 --dataset synthetic --epochs 4 \\
        --arm workers --variant ring+pack-262144
    python benchmarks/run.py --sections communication --runs 3

``--arm workers``: 2 processes with a hand-built ``TF_CONFIG`` on loopback,
``MultiWorkerMirroredStrategy`` (one CPU replica each) created here with the
variant's ``CommunicationOptions``, and mirrorkit's Keras fixes applied
(stock Keras 3.15 cannot ``fit`` under MWMS at all, keras#20585, nor run
several steps per call at 2+ replicas, keras#19246). ``--arm independent``:
the same 2 processes at the same time without ``TF_CONFIG``, each under a
``MirroredStrategy`` over its one CPU (the same Keras code path and fixes, no
collective). Everything else is equal: every process trains its half of the
training set (``x[index::2]``) at the same per-worker batch, the same
intra-op threads (``--threads``, default 1: equal compute per process on 2
cores), the same steps per call (largest divisor of the epoch's steps up to
16). So ``step time(2 workers) / step time(2 independent)`` is the cost of the
all-reduce and of the synchronisation alone. Goal: <= 1.05 for resnet20.

Variants (``--variant``, joined with ``+``): ``auto`` (TensorFlow's defaults),
``ring`` (``CommunicationImplementation.RING``), ``pack-BYTES``
(``CommunicationOptions(bytes_per_pack=BYTES)``), ``fp16`` / ``bf16``
(Horovod-style compression: the optimizer's gradient all-reduce,
``_all_reduce_sum_gradients`` of Keras 3's TensorFlow optimizer, casts the
gradients to the narrow type before the collective and back after). Each
worker times its steps with ``mirrorkit.bench.step_timer`` (epoch 1 is
warm-up) and scores the final model on the whole validation split
(``_common.final_scores``), so a variant that costs accuracy shows.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import types
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _harness import env, parse_result  # noqa: E402


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--per-worker-batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=8, help="epoch 1 is warm-up")
    parser.add_argument("--arm", choices=("workers", "independent"), default="workers")
    parser.add_argument("--variant", default="auto")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None, help="training examples (smoke)")
    parser.add_argument("--index", type=int, default=None, help=argparse.SUPPRESS)
    return parser.parse_args()


def _options(tf: Any, variant: str) -> tuple[Any, Any]:
    """``(CommunicationOptions, gradient dtype or None)`` of a variant spec."""
    impl, pack, dtype = tf.distribute.experimental.CommunicationImplementation.AUTO, 0, None
    for part in variant.split("+"):
        if part == "ring":
            impl = tf.distribute.experimental.CommunicationImplementation.RING
        elif part.startswith("pack-"):
            pack = int(part[len("pack-"):])
        elif part in ("fp16", "bf16"):
            dtype = tf.float16 if part == "fp16" else tf.bfloat16
        elif part != "auto":
            raise ValueError(f"Unknown variant part {part!r}; accepted: auto, ring, "
                             f"pack-BYTES, fp16, bf16. Received: variant={variant!r}")
    return tf.distribute.experimental.CommunicationOptions(bytes_per_pack=pack,
                                                           implementation=impl), dtype


def _compress(optimizer: Any, dtype: Any) -> None:
    """All-reduce ``optimizer``'s gradients in ``dtype`` (cast down before, up after)."""
    import tensorflow as tf

    def all_reduce(self: Any, grads_and_vars: Any) -> list[tuple[Any, Any]]:
        pairs = list(grads_and_vars)
        ctx = tf.distribute.get_replica_context()
        live = [i for i, (g, _) in enumerate(pairs) if isinstance(g, tf.Tensor)]
        if ctx is None or not live:
            return pairs
        reduced = ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                                 [tf.cast(pairs[i][0], dtype) for i in live])
        for i, g in zip(live, reduced):
            pairs[i] = (tf.cast(g, pairs[i][0].dtype), pairs[i][1])
        return pairs

    optimizer._all_reduce_sum_gradients = types.MethodType(all_reduce, optimizer)


def child(args: argparse.Namespace) -> None:
    """One process: train, time, score; print ``RESULT {json}``."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    from mirrorkit import compat

    options, dtype = _options(tf, args.variant)
    if args.arm == "workers":
        from mirrorkit.distribute.failure_detection import configure_failure_detection

        configure_failure_detection()
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    else:
        strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    compat.apply(strategy=strategy)

    import keras
    from _common import compile_args, final_scores, load_arrays, report

    from mirrorkit.bench import step_timer
    from mirrorkit.training.models import build_model
    from mirrorkit.training.plan import auto_steps_per_execution

    keras.utils.set_random_seed(args.seed)
    (x, y), spec = load_arrays(args)
    x, y = x[args.index::2], y[args.index::2]
    batch = args.per_worker_batch
    steps = len(x) // batch

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        return (tf.data.Dataset.from_tensor_slices((x, y)).cache()
                .shuffle(len(x), seed=args.seed).batch(batch, drop_remainder=True)
                .repeat().prefetch(tf.data.AUTOTUNE))

    dist = strategy.distribute_datasets_from_function(dataset_fn)
    spe = auto_steps_per_execution(steps) if compat.works(
        "multi-step", strategy.num_replicas_in_sync) else 1
    with strategy.scope():
        model = build_model(args.model, input_shape=spec["input_shape"],
                            num_classes=spec["num_classes"])
        kwargs = compile_args(args, batch * 2)  # the lr of the 2-worker global batch, both arms
        if dtype is not None:
            _compress(kwargs["optimizer"], dtype)
        model.compile(**kwargs, steps_per_execution=spe)
    timer = step_timer()
    model.fit(dist, epochs=args.epochs, steps_per_epoch=steps, callbacks=[timer], verbose=0)
    val, _ = load_arrays(args, "val")
    report(args, timer, batch * strategy.num_replicas_in_sync, strategy.num_replicas_in_sync,
           images_per_epoch=steps * batch,
           variant=f"{args.arm} {args.variant}",
           extra={"index": args.index, "steps_per_execution": spe, "threads": args.threads,
                  **final_scores(model, val)})


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    for s in socks:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def parent(args: argparse.Namespace, argv: list[str]) -> None:
    """Start the 2 processes together; print one ``RESULT`` for the pair."""
    ports = _free_ports(2)
    procs = []
    for index in range(2):
        child_env = env()
        if args.arm == "workers":
            child_env["TF_CONFIG"] = json.dumps({
                "cluster": {"worker": [f"localhost:{p}" for p in ports]},
                "task": {"type": "worker", "index": index}})
        procs.append(subprocess.Popen([sys.executable, __file__, *argv, "--index", str(index)],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=child_env))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=1800)
        result = parse_result(out)
        if proc.returncode != 0 or result is None:
            for other in procs:
                if other.poll() is None:
                    other.kill()
            raise SystemExit(f"{args.arm} {args.variant}: a process failed "
                             f"({proc.returncode}):\n{out[-1500:]}\n{err[-3000:]}")
        results.append(result)
    chief = results[0]
    print("RESULT " + json.dumps({
        "arm": args.arm, "variant": args.variant, "model": args.model, "dataset": args.dataset,
        "per_worker_batch": args.per_worker_batch, "threads": args.threads,
        "median_step_ms": round(statistics.mean(r["median_step_ms"] for r in results), 3),
        "images_per_sec": round(sum(r["images_per_sec"] for r in results), 2),
        "steps_per_execution": chief["steps_per_execution"],
        "val_accuracy": chief["val_accuracy"], "val_loss": chief["val_loss"],
        "processes": results,
    }), flush=True)


def main() -> None:
    args = parse()
    if args.index is None:
        parent(args, sys.argv[1:])
    else:
        child(args)


if __name__ == "__main__":
    main()
