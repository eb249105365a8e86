"""Side B: the same training through mirrorkit's library (what ``mirrorkit train`` runs).

Same model, data, global batch, epochs, seed and optimizer as
``baseline_keras.py``; the distribution harness is mirrorkit's:
:func:`mirrorkit.training.train` (strategy, batch math, input pipeline, fit,
its own callbacks). The stopwatch is the same callback side A uses, passed
through ``train(..., callbacks=[...])``.

Example:
    python benchmarks/mirrorkit_side.py --model cnn --dataset digits --replicas 2 --epochs 4
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import auto_steps_per_execution, data_options, parse_args, report  # noqa: E402


def _cache_synthetic() -> None:
    """Emulate proposal P3 (RESULTS.md) until mirrorkit.datasets adopts it.

    ``synthetic`` generates every image on the fly, every epoch, on the same
    cores that train. The proposal: generate once and cache (the data is
    deterministic by design). Emulated by wrapping the loader ``train`` calls,
    changing nothing else.
    """
    import dataclasses

    import mirrorkit.datasets as mds

    load = mds.load

    def cached_load(spec: str = "digits", options: Any = None) -> Any:
        data = load(spec, options)
        if spec != "synthetic" or data.map_fn is None:
            return data
        import tensorflow as tf

        def generate(ds: Any) -> Any:
            return ds.map(data.map_fn, num_parallel_calls=tf.data.AUTOTUNE).cache()

        return dataclasses.replace(data, train=generate(data.train), val=generate(data.val),
                                   map_fn=None)

    mds.load = cached_load


def main() -> None:
    args = parse_args(__doc__)

    if args.intra_threads:
        # Not a mirrorkit default (yet): measures a proposed one. Must run
        # before TensorFlow's runtime starts, i.e. before train() creates the strategy.
        import tensorflow as tf

        threads = (max(1, (os.cpu_count() or 1) // args.replicas)
                   if args.intra_threads == "auto" else int(args.intra_threads))
        tf.config.threading.set_intra_op_parallelism_threads(threads)

    if args.cache_synthetic:
        _cache_synthetic()

    from mirrorkit.bench import step_timer
    from mirrorkit.training import TrainConfig, train

    if args.limit and args.dataset != "synthetic":
        raise SystemExit("--limit is supported for synthetic data only on this side")
    spe = args.steps_per_execution
    if spe == "auto":
        from mirrorkit.datasets import load

        examples = load(args.dataset, data_options(args)).train_examples
        spe = auto_steps_per_execution(examples // (args.per_replica_batch * args.replicas))
    spe = int(spe)
    timer = step_timer()
    with tempfile.TemporaryDirectory(prefix="mirrorkit-bench-") as tmp:
        config = TrainConfig(
            model=args.model, dataset=args.dataset, data=data_options(args),
            epochs=args.epochs, per_replica_batch=args.per_replica_batch, seed=args.seed,
            steps_per_execution=spe,
            simulate_cpus=args.replicas, output=os.path.join(tmp, "run"))
        result = train(config, callbacks=[timer])
    metrics = result.metrics
    report(args, timer, metrics["global_batch"], metrics["replicas"],
           images_per_epoch=metrics["steps_per_epoch"] * metrics["global_batch"],
           variant="mirrorkit.training.train" + (
               " + cached synthetic" if args.cache_synthetic else "") + (
               f" + intra_threads={args.intra_threads}" if args.intra_threads else "") + (
               f" + steps_per_execution={spe}" if spe > 1 else ""),
           extra={"meter_images_per_sec": metrics["images_per_second"],
                  "val_accuracy": round(metrics["val_accuracy"], 4)})


if __name__ == "__main__":
    main()
