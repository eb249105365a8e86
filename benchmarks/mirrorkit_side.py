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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import data_options, parse_args, report  # noqa: E402


def _previous_defaults(replicas: int) -> None:
    """Undo P1-P4 (benchmarks/RESULTS.md) for an ablation run; before train().

    P1: TensorFlow's own intra-op pool (all cores) instead of cores // replicas;
    P2: steps_per_execution=1 (passed to TrainConfig by main); P3: synthetic
    images generated every epoch; P4: Keras's per-batch TensorBoard calls.
    """
    import keras
    import tensorflow as tf

    import mirrorkit.callbacks as mcb
    from mirrorkit.datasets import builtin

    if replicas > 1:
        tf.config.threading.set_intra_op_parallelism_threads(os.cpu_count() or 1)
    builtin.SYNTHETIC_CACHE_BYTES = 0
    mcb.TensorBoard.on_train_batch_end = keras.callbacks.TensorBoard.on_train_batch_end


def main() -> None:
    args = parse_args(__doc__)

    if args.previous_defaults:
        _previous_defaults(args.replicas)

    from mirrorkit.bench import step_timer
    from mirrorkit.training import TrainConfig, train

    if args.limit and args.dataset != "synthetic":
        raise SystemExit("--limit is supported for synthetic data only on this side")
    timer = step_timer()
    with tempfile.TemporaryDirectory(prefix="mirrorkit-bench-") as tmp:
        config = TrainConfig(
            model=args.model, dataset=args.dataset, data=data_options(args),
            epochs=args.epochs, per_replica_batch=args.per_replica_batch, seed=args.seed,
            steps_per_execution=1 if args.previous_defaults else None,
            simulate_cpus=args.replicas, output=os.path.join(tmp, "run"))
        result = train(config, callbacks=[timer])
    metrics = result.metrics
    report(args, timer, metrics["global_batch"], metrics["replicas"],
           images_per_epoch=metrics["steps_per_epoch"] * metrics["global_batch"],
           variant="mirrorkit.training.train" + (
               " with its previous defaults (ablation)" if args.previous_defaults else ""),
           extra={"meter_images_per_sec": metrics["images_per_second"],
                  "steps_per_execution": metrics["steps_per_execution"],
                  # Scored as _common.final_scores scores the other arms.
                  "val_accuracy": round(metrics["val_accuracy"], 4),
                  "val_loss": round(metrics["val_loss"], 4)})


if __name__ == "__main__":
    main()
