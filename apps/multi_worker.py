"""Train a small CNN on the digits set on every worker named in TF_CONFIG.

A plain Keras script with four mirrorkit touches: ``mirrorkit.get_strategy()``
first thing (MultiWorkerMirroredStrategy when TF_CONFIG names 2+ workers,
with the Keras 3 compat fixes and bounded failure detection), the model built
in ``strategy.scope()``, mirrorkit's chief-aware callbacks, and
``save_model`` for the final model. Without TF_CONFIG it trains in one
process. Data: the 8x8 UCI digits bundled with mirrorkit, a fixed split.

Two terminals on one machine (both may use the same --output; only the
chief, worker 0, writes there):

    # terminal 1
    export TF_CONFIG="$(mirrorkit tf-config --workers localhost:12345,localhost:12346 --index 0)"
    python apps/multi_worker.py --epochs 5 --output out
    # terminal 2
    export TF_CONFIG="$(mirrorkit tf-config --workers localhost:12345,localhost:12346 --index 1)"
    python apps/multi_worker.py --epochs 5 --output out

Two machines (host-a, host-b; the port open between them), the same
command on each, only ``--index`` differs:

    host-a$ eval "$(mirrorkit tf-config --workers host-a:12345,host-b:12345 --index 0 --export)"
    host-a$ python apps/multi_worker.py --epochs 5 --output out
    host-b$ eval "$(mirrorkit tf-config --workers host-a:12345,host-b:12345 --index 1 --export)"
    host-b$ python apps/multi_worker.py --epochs 5 --output out

``--output`` receives (chief only) ``backup/`` (deleted when training
completes), ``checkpoints/best.keras``, ``logs/`` (TensorBoard, when the
``tensorboard`` package is installed) and ``model.keras``. If a worker dies,
the others stop within MIRRORKIT_COLLECTIVE_TIMEOUT + 10 seconds (default
10 + 10); start all workers again with the same command and training resumes
after the last completed epoch.

Example:
    $ python apps/multi_worker.py --epochs 2 --per-replica-batch 16 --output /tmp/out
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys

# Errors TensorFlow raises when a peer worker is lost mid-collective.
_PEER_ERRORS = ("UnavailableError", "DeadlineExceededError", "AbortedError", "CancelledError")
_TRAIN_SIZE = 1440  # a multiple of 32 and 48: no partial global batch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see ``--help``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--per-replica-batch", type=int, default=16,
                        help="batch per replica; the global batch is this times "
                        "the number of replicas in the cluster")
    parser.add_argument("--output", required=True, help="backup, checkpoints, logs, model")
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-shuffle", dest="shuffle", action="store_false",
                        help="keep the data order (to compare runs exactly)")
    parser.add_argument("--results", default=None,
                        help="also write this worker's weights, predictions and "
                        "metrics to RESULTS/<task>.npz (to compare workers)")
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.per_replica_batch < 1:
        parser.error("--epochs and --per-replica-batch must be positive integers")
    return args


def load_digits_split():
    """The bundled 8x8 digits, scaled to [0, 1], split by a fixed permutation."""
    import numpy as np

    from mirrorkit.datasets import digits_arrays

    x, y = digits_arrays()
    order = np.random.RandomState(0).permutation(len(x))
    train, test = order[:_TRAIN_SIZE], order[_TRAIN_SIZE:]
    return (x[train], y[train]), (x[test], y[test])


def build_model(learning_rate: float):
    """A small CNN; no BatchNorm/Dropout, so N replicas on batch B match 1 on B."""
    import keras

    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(32, 3, padding="same", activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(10),
    ])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def _peer_error_summary(err: BaseException) -> str:
    # TF's message is pages long; keep the line that names the lost peer.
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    for key in ("unhealthy", "Socket closed", "Connection refused", "failed to connect",
                "Deadline", "aborted"):
        for line in lines:
            if key.lower() in line.lower():
                return line[:300]
    return lines[0][:300] if lines else type(err).__name__


def main(argv: list[str] | None = None) -> int:
    """Train, evaluate, predict and save; return the process exit code."""
    args = parse_args(argv)
    import mirrorkit

    strategy = mirrorkit.get_strategy()  # before any other TensorFlow op
    runtime = mirrorkit.describe(strategy)
    task = runtime.task.replace(":", "")

    import keras
    import numpy as np

    from mirrorkit.callbacks import BackupAndRestore, ModelCheckpoint, TensorBoard, save_model

    keras.utils.set_random_seed(args.seed)
    (x_train, y_train), (x_test, y_test) = load_digits_split()
    global_batch = args.per_replica_batch * strategy.num_replicas_in_sync
    print(f"[{runtime.task}] {runtime.summary()}; global batch {global_batch}", flush=True)
    with strategy.scope():
        model = build_model(args.learning_rate)
    initial = [w.numpy().copy() for w in model.weights]

    epochs_run: list[int] = []

    class _EpochLog(keras.callbacks.Callback):
        # Last in the list: it prints after the backup for this epoch exists.
        def on_epoch_begin(self, epoch, logs=None):
            epochs_run.append(epoch)

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            print(f"[{runtime.task}] epoch {epoch + 1}/{args.epochs} "
                  f"loss={logs.get('loss', float('nan')):.4f} "
                  f"val_loss={logs.get('val_loss', float('nan')):.4f} "
                  f"val_accuracy={logs.get('val_accuracy', float('nan')):.4f}", flush=True)

    out = args.output
    callbacks = [
        BackupAndRestore(os.path.join(out, "backup")),
        ModelCheckpoint(os.path.join(out, "checkpoints", "best.keras"),
                        monitor="val_loss", save_best_only=True),
    ]
    if importlib.util.find_spec("tensorboard") is not None:
        callbacks.append(TensorBoard(os.path.join(out, "logs")))
    elif runtime.is_chief:
        print(f"[{runtime.task}] tensorboard not installed: no logs/ "
              "(pip install tensorboard)", flush=True)
    callbacks.append(_EpochLog())
    import tensorflow as tf

    try:
        history = model.fit(x_train, y_train, batch_size=global_batch, epochs=args.epochs,
                            validation_data=(x_test, y_test), shuffle=args.shuffle,
                            callbacks=callbacks, verbose=0)
        scores = model.evaluate(x_test, y_test, batch_size=global_batch,
                                verbose=0, return_dict=True)
        predictions = model.predict(x_test, batch_size=global_batch, verbose=0)
        save_model(model, os.path.join(out, "model.keras"))
    except tf.errors.OpError as err:
        if type(err).__name__ not in _PEER_ERRORS or not runtime.is_multi_worker:
            raise
        print(f"[{runtime.task}] error: lost a peer worker ({type(err).__name__}: "
              f"{_peer_error_summary(err)}). Start all workers again with the same "
              "--output to resume after the last completed epoch.",
              file=sys.stderr, flush=True)
        return 1
    print(f"[{runtime.task}] done: " + json.dumps(
        {k: round(float(v), 6) for k, v in scores.items()}), flush=True)

    if args.results:
        os.makedirs(args.results, exist_ok=True)
        np.savez(os.path.join(args.results, f"{task}.npz"),
                 initial=np.concatenate([w.ravel() for w in initial]),
                 weights=np.concatenate([w.numpy().ravel() for w in model.weights]),
                 predictions=predictions, x_test=x_test,
                 # This process alone, same weights, no distribution: what
                 # predict must equal (every example once, in order).
                 local_predictions=model(x_test, training=False).numpy(),
                 loss=scores["loss"], accuracy=scores["accuracy"],
                 epochs_run=np.array(epochs_run, dtype="int64"),
                 val_loss=np.array(history.history.get("val_loss", []), dtype="float64"),
                 is_chief=runtime.is_chief)
    return 0


if __name__ == "__main__":
    sys.exit(main())
