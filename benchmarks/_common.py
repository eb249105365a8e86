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
    parser.add_argument("--force-multi-step", action="store_true",
                        help="expert side only: use steps_per_execution > 1 at 2+ replicas "
                        "too, which stock Keras fails at (keras#19246); shows the failure")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be >= 2: the first epoch is warm-up and not timed")
    return args


def data_options(args: argparse.Namespace) -> Any:
    """The :class:`mirrorkit.datasets.DataOptions` both sides load with."""
    from mirrorkit.datasets import DataOptions

    return DataOptions(examples=args.limit) if args.limit and args.dataset == "synthetic" \
        else DataOptions()


def load_arrays(args: argparse.Namespace,
                split: str = "train") -> tuple[tuple[Any, Any], dict[str, Any]]:
    """A split (``"train"`` or ``"val"``) as NumPy arrays, like ``keras.datasets.*.load_data()``.

    Synthetic images are generated once, exactly as mirrorkit generates them.
    ``--limit`` cuts the training split only: every arm is scored on the same
    validation examples.
    """
    import numpy as np

    from mirrorkit.datasets import load

    data = load(args.dataset, data_options(args))
    source = data.train if split == "train" else data.val
    if data.map_fn is None and isinstance(source, tuple):
        x, y = source
    else:
        batches = list(data.examples(split).batch(4096).as_numpy_iterator())
        x = np.concatenate([b[0] for b in batches])
        y = np.concatenate([b[1] for b in batches])
    if args.limit and split == "train":
        x, y = x[:args.limit], y[:args.limit]
    return (x, y), {"input_shape": data.image_shape, "num_classes": data.num_classes}


def mirrored_over_cpus(replicas: int) -> Any:
    """The tutorial's ``MirroredStrategy`` over ``replicas`` logical CPUs (before any other op).

    A CPU-only machine has one device, so it is split into N logical devices
    first; TensorFlow's own thread pools are kept (stock set-up).
    """
    import tensorflow as tf

    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(replicas)])
    return tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")])


def compile_args(args: argparse.Namespace, global_batch: int) -> dict[str, Any]:
    """Optimizer, loss and metrics of ``mirrorkit train``'s defaults (Adam, linearly scaled lr)."""
    import keras

    from mirrorkit.training import BASE_BATCH, DEFAULT_LR

    lr = DEFAULT_LR["adam"] * global_batch / BASE_BATCH
    return {"optimizer": keras.optimizers.Adam(lr), "loss": "sparse_categorical_crossentropy",
            "metrics": ["accuracy"]}


def final_scores(model: Any, val: tuple[Any, Any], batch_size: int = 256) -> dict[str, float]:
    """Validation loss and accuracy on every example of ``val``, as mirrorkit scores its runs.

    The same method as ``mirrorkit.training``'s final score: a copy of the
    model outside the strategy evaluates every example in plain batches, so
    no replica gets an empty slice, nothing is dropped, and every arm of a
    comparison is scored identically.
    """
    import keras

    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    copy.compile(loss="sparse_categorical_crossentropy", metrics=["accuracy"], jit_compile=False)
    scores = copy.evaluate(val[0], val[1], batch_size=batch_size, return_dict=True, verbose=0)
    return {"val_accuracy": round(float(scores["accuracy"]), 4),
            "val_loss": round(float(scores["loss"]), 4)}


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
