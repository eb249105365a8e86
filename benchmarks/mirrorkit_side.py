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


def main() -> None:
    args = parse_args(__doc__)

    from mirrorkit.bench import step_timer
    from mirrorkit.training import TrainConfig, train

    if args.limit and args.dataset != "synthetic":
        raise SystemExit("--limit is supported for synthetic data only on this side")
    timer = step_timer()
    with tempfile.TemporaryDirectory(prefix="mirrorkit-bench-") as tmp:
        config = TrainConfig(
            model=args.model, dataset=args.dataset, data=data_options(args),
            epochs=args.epochs, per_replica_batch=args.per_replica_batch, seed=args.seed,
            strategy="mirrored", simulate_cpus=args.replicas, output=os.path.join(tmp, "run"))
        result = train(config, callbacks=[timer])
    metrics = result.metrics
    report(args, timer, metrics["global_batch"], metrics["replicas"],
           images_per_epoch=metrics["steps_per_epoch"] * metrics["global_batch"],
           variant="mirrorkit.training.train",
           extra={"meter_images_per_sec": metrics["images_per_second"],
                  "val_accuracy": round(metrics["val_accuracy"], 4)})


if __name__ == "__main__":
    main()
