"""What both sides of the A/B benchmark share: arguments, data arrays, compile settings, the report.

Sharing these (and only these) guarantees the two sides differ in the
distribution harness alone: strategy set-up, input pipeline and training loop.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

RESULT = "RESULT "


def parse_args(doc: str) -> argparse.Namespace:
    """The command line both sides take (same flags, same meaning)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument("--per-replica-batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=4,
                        help="epoch 1 is warm-up (tracing) and is not timed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int, default=None,
                        help="train on the first N examples only (smoke tests)")
    parser.add_argument("--previous-defaults", action="store_true",
                        help="side B only, an ablation: mirrorkit with the defaults it had "
                        "before it adopted P1-P4 (TensorFlow's own intra-op threads, one step "
                        "per tf.function call, synthetic images generated every epoch), to "
                        "measure where its gain over the baseline comes from")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be >= 2: the first epoch is warm-up and not timed")
    return args


def data_options(args: argparse.Namespace) -> Any:
    """The :class:`mirrorkit.datasets.DataOptions` both sides load with."""
    from mirrorkit.datasets import DataOptions

    return DataOptions(examples=args.limit) if args.limit and args.dataset == "synthetic" \
        else DataOptions()


def load_arrays(args: argparse.Namespace) -> tuple[tuple[Any, Any], dict[str, Any]]:
    """The training split as NumPy arrays (what ``keras.datasets.*.load_data()`` gives).

    Synthetic images are generated once, exactly as mirrorkit generates them.
    """
    import numpy as np

    from mirrorkit.datasets import load

    data = load(args.dataset, data_options(args))
    if data.map_fn is None and isinstance(data.train, tuple):
        x, y = data.train
    else:
        batches = list(data.examples("train").batch(4096).as_numpy_iterator())
        x = np.concatenate([b[0] for b in batches])
        y = np.concatenate([b[1] for b in batches])
    if args.limit:
        x, y = x[:args.limit], y[:args.limit]
    return (x, y), {"input_shape": data.image_shape, "num_classes": data.num_classes}


def compile_args(args: argparse.Namespace, global_batch: int) -> dict[str, Any]:
    """Optimizer, loss and metrics of ``mirrorkit train``'s defaults (Adam, linearly scaled lr)."""
    import keras

    from mirrorkit.training import BASE_BATCH, DEFAULT_LR

    lr = DEFAULT_LR["adam"] * global_batch / BASE_BATCH
    return {"optimizer": keras.optimizers.Adam(lr), "loss": "sparse_categorical_crossentropy",
            "metrics": ["accuracy"]}


def report(args: argparse.Namespace, timer: Any, global_batch: int, replicas: int, *,
           images_per_epoch: int, variant: str, extra: dict[str, Any] | None = None) -> None:
    """Print one ``RESULT {json}`` line: training images/s over epochs 2..N.

    Only training steps are timed (batch begin to batch end, see
    :func:`mirrorkit.bench.step_timer`); epoch 1 (tracing, graph optimisation)
    is left out. ``images_per_epoch`` is exact for each side (the tutorial
    pipeline keeps its short last batch, mirrorkit's drops it).
    """
    timed = [(d, n) for d, n, e in zip(timer.durations, timer.steps, timer.epochs) if e >= 1]
    epochs = len({e for e in timer.epochs if e >= 1})
    seconds = float(sum(d for d, _ in timed))
    per_step = [d / n for d, n in timed]
    result = {
        "variant": variant, "model": args.model, "dataset": args.dataset,
        "replicas": replicas, "global_batch": global_batch, "epochs_timed": epochs,
        "steps_timed": sum(n for _, n in timed), "seconds_timed": round(seconds, 4),
        "images_per_sec": round(epochs * images_per_epoch / seconds, 2) if seconds else 0.0,
        "median_step_ms": round(statistics.median(per_step) * 1000, 3) if timed else None,
    }
    result.update(extra or {})
    print(RESULT + json.dumps(result), flush=True)
