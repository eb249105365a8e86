"""Images/s mirrorkit's default training input pipeline produces on its own (no model).

Builds the pipeline exactly as :func:`mirrorkit.training.train` does
(:func:`mirrorkit.data.train_pipeline` with the dataset's ``map_fn``, repeated),
under the same strategy, and pulls batches from it as fast as it yields them.
If this is well above the images/s training consumes, the input pipeline is
not what limits training.

Example:
    python benchmarks/pipeline.py --dataset synthetic --replicas 1 --per-replica-batch 32
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--per-replica-batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=300, help="timed batches")
    parser.add_argument("--warmup", type=int, default=20, help="untimed batches first")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import mirrorkit

    mirrorkit.get_strategy("mirrored", simulate_cpus=args.replicas)
    from mirrorkit import data as pipelines
    from mirrorkit.datasets import load

    data = load(args.dataset)
    batch = pipelines.resolve_batch(per_replica_batch=args.per_replica_batch)
    ds = pipelines.train_pipeline(data.train, batch=batch, seed=args.seed, map_fn=data.map_fn,
                                  num_files=data.train_files).repeat()
    it = iter(ds)
    for _ in range(args.warmup):
        next(it)
    start = time.perf_counter()
    for _ in range(args.batches):
        x, _y = next(it)
    # Make sure the last batch really exists (values, not just a handle).
    _ = x.numpy().sum()
    seconds = time.perf_counter() - start
    print("RESULT " + json.dumps({
        "dataset": args.dataset, "replicas": args.replicas, "global_batch": batch.global_batch,
        "batches": args.batches, "seconds": round(seconds, 4),
        "images_per_sec": round(args.batches * batch.global_batch / seconds, 1),
    }), flush=True)


if __name__ == "__main__":
    main()
