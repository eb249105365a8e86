"""Side E: the tutorial code plus the tuning an expert writes by hand with stock Keras.

How to run (one process; ``run.py --sections compare`` alternates it with the
other arms, ~30 s a run for cnn, ~2-4 min for resnet20 on 2 cores)::

    python benchmarks/expert_keras.py --model cnn --dataset digits --replicas 1 --epochs 8
    python benchmarks/expert_keras.py --model resnet20 --dataset synthetic --replicas 2 --epochs 4
    # shows the upstream failure at 2+ replicas (keras#19246):
    python benchmarks/expert_keras.py --replicas 2 --epochs 2 --force-multi-step

The same model, data arrays, optimizer, loss, global batch, epochs, seed and
stopwatch as ``baseline_keras.py`` (side A); on top of it, only what an expert
would add with stock TensorFlow/Keras (no mirrorkit harness, no Keras patch):

* ``steps_per_execution``: the largest divisor of the epoch's steps up to 16
  (the rule mirrorkit uses), at one replica. With 2+ replicas stock Keras
  fails with ``steps_per_execution > 1`` under ``MirroredStrategy``
  (keras#19246: "You must feed a value for placeholder tensor"), so the expert
  keeps 1 there; the record says so (``steps_per_execution_note``).
  ``--force-multi-step`` tries it anyway and records the error.
* A tuned ``tf.data`` pipeline: ``cache()``, ``shuffle`` over the whole
  training set, ``batch(drop_remainder=True)``, ``prefetch(AUTOTUNE)``.
* ``verbose=2`` (one line per epoch), as when running headless.

TensorFlow's thread pools are left as they are: splitting the cores between
simulated devices needs to know the devices share them, which is mirrorkit's
P1 (RESULTS.md), not something stock Keras offers.
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

MULTI_STEP_NOTE = ("1 at 2+ replicas: stock Keras fails with steps_per_execution > 1 under "
                   "MirroredStrategy with 2+ replicas (keras#19246)")


def divisor_up_to(steps: int, cap: int = 16) -> int:
    """The largest divisor of ``steps`` up to ``cap`` (Keras runs whole executions)."""
    return max(d for d in range(1, min(cap, steps) + 1) if steps % d == 0)


def _patches_applied() -> list[str]:
    """mirrorkit's Keras fixes active in this process: must be none (stock Keras)."""
    if "mirrorkit.compat" not in sys.modules:
        return []
    from mirrorkit import compat

    return sorted(name for name, state in compat.status().items() if state == "applied")


def main() -> None:
    args = parse_args(__doc__)

    import tensorflow as tf

    strategy = mirrored_over_cpus(args.replicas)

    import keras

    keras.utils.set_random_seed(args.seed)
    replicas = strategy.num_replicas_in_sync
    batch_size = args.per_replica_batch * replicas

    (x_train, y_train), spec = load_arrays(args)
    steps = len(x_train) // batch_size
    train_dataset = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
                     .cache()
                     .shuffle(len(x_train), seed=args.seed, reshuffle_each_iteration=True)
                     .batch(batch_size, drop_remainder=True)
                     .prefetch(tf.data.AUTOTUNE))

    spe, note = divisor_up_to(steps), "largest divisor of the epoch's steps up to 16"
    if replicas > 1 and not args.force_multi_step:
        spe, note = 1, MULTI_STEP_NOTE

    from mirrorkit.bench import step_timer
    from mirrorkit.training.models import build_model

    with strategy.scope():
        model = build_model(args.model, input_shape=spec["input_shape"],
                            num_classes=spec["num_classes"])
        model.compile(**compile_args(args, batch_size), steps_per_execution=spe)

    timer = step_timer()
    try:
        model.fit(train_dataset, epochs=args.epochs, callbacks=[timer], verbose=2)
    except Exception as err:  # recorded: the point of --force-multi-step
        if not args.force_multi_step:
            raise
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        first = next((ln for ln in lines if "must feed" in ln or "placeholder" in ln),
                     lines[0] if lines else type(err).__name__)[:300]
        print(f"FAILED steps_per_execution={spe} at {replicas} replicas: "
              f"{type(err).__name__}: {first}", flush=True)
        sys.exit(3)
    val, _ = load_arrays(args, "val")
    report(args, timer, batch_size, replicas, images_per_epoch=steps * batch_size,
           variant="expert: tutorial + steps_per_execution + cache/shuffle/batch(drop)/prefetch"
                   " + verbose=2",
           extra={"steps_per_execution": spe, "steps_per_execution_note": note,
                  "keras_patches_applied": _patches_applied(),
                  **final_scores(model, val)})


if __name__ == "__main__":
    main()
