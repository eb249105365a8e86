"""One benchmark configuration, inside its own process: train a few steps and time them.

Run as ``python -m mirrorkit.bench --child SPEC_JSON`` by
:mod:`mirrorkit.bench.runs`; prints one ``MIRRORKIT_BENCH_RESULT {...}`` line.

Example:
    >>> summarise_steps([0.1, 0.1], [1, 1], 32)["images_per_sec"]   # doctest: +SKIP
    320.0
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from mirrorkit import _env
from mirrorkit.bench.config import RESULT_TAG
from mirrorkit.errors import UserInputError


def step_timer(stop_after: int | None = None, warmup_steps: int = 0) -> Any:
    """A Keras callback that times every training step, from batch begin to batch end.

    That span covers fetching the batch from the input pipeline and the
    distributed step (forward, backward, all-reduce, update), and excludes
    epoch boundaries and validation. Keras runs the TensorFlow step
    synchronously, so the end of the batch is the end of the work. With
    ``steps_per_execution=k`` one call covers ``k`` steps; ``steps`` says so.

    Args:
        stop_after: stop training (``model.stop_training``) once this many
            steps have run after the warm-up. Defaults to None (never).
        warmup_steps: steps of whole calls not counted by ``stop_after``:
            calls are warm-up until they cover this many steps (so with
            ``k`` steps per call, ``ceil(warmup_steps / k)`` calls).

    Returns:
        A ``keras.callbacks.Callback`` with, per call, ``durations``
        (seconds), ``steps`` (training steps covered) and ``epochs``.

    Example:
        >>> timer = step_timer()                              # doctest: +SKIP
        >>> model.fit(ds, epochs=3, callbacks=[timer])         # doctest: +SKIP
        >>> timed = [d for d, e in zip(timer.durations, timer.epochs) if e > 0]  # doctest: +SKIP
    """
    import keras

    class StepTimer(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.durations: list[float] = []
            self.steps: list[int] = []
            self.epochs: list[int] = []
            self._epoch = 0
            self._begin = (0, 0.0)

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self._epoch = epoch

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self._begin = (batch, time.perf_counter())

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            first, start = self._begin
            self.durations.append(time.perf_counter() - start)
            self.steps.append(max(batch - first + 1, 1))
            self.epochs.append(self._epoch)
            if stop_after is not None and _after_warmup(self.steps, warmup_steps) >= stop_after:
                self.model.stop_training = True

    return StepTimer()


def _after_warmup(steps: Sequence[int], warmup_steps: int) -> int:
    # Steps of the calls after those that cover the warm-up.
    done = 0
    for i, count in enumerate(steps):
        if done >= warmup_steps:
            return sum(steps[i:])
        done += count
    return 0


def summarise_steps(durations: Sequence[float], steps: Sequence[int],
                    global_batch: int) -> dict[str, float]:
    """Throughput of timed calls: images/s and the median time of one step.

    Args:
        durations: seconds of each timed call (see :func:`step_timer`).
        steps: training steps each call covered.
        global_batch: images per step over all replicas.

    Returns:
        ``{"steps", "step_time_ms", "images_per_sec"}``.

    Example:
        >>> summarise_steps([0.1, 0.1, 0.2], [1, 1, 1], 32)["images_per_sec"]
        240.0
    """
    total, count = float(sum(durations)), int(sum(steps))
    per_step = sorted(d / s for d, s in zip(durations, steps))
    return {
        "steps": count,
        "step_time_ms": statistics.median(per_step) * 1000.0 if per_step else 0.0,
        "images_per_sec": round(count * global_batch / total, 6) if total > 0 else 0.0,
    }


def _timed(timer: Any, warmup_steps: int, global_batch: int) -> dict[str, float]:
    # Drop whole calls until warmup_steps steps are behind us.
    done, first = 0, 0
    while first < len(timer.steps) and done < warmup_steps:
        done += timer.steps[first]
        first += 1
    return summarise_steps(timer.durations[first:], timer.steps[first:], global_batch)


def _task_index() -> int:
    from mirrorkit.distribute.cluster import parse_tf_config

    text = _env.tf_config_text()
    return parse_tf_config(text).task_index if text else 0


def _watchdog(seconds: float) -> None:
    # A configuration must never hang the whole bench (e.g. a peer stuck in a
    # collective): exit hard, so the parent (or the launcher) sees a failure.
    def expire() -> None:
        print(f"RuntimeError: configuration timed out after {seconds:.0f} s",
              file=sys.stderr, flush=True)
        os._exit(124)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def _apply_threads(tf: Any, threads: int | None) -> None:
    # Must be set before TensorFlow's runtime starts, i.e. before the strategy.
    # Only the intra-op pool: collectives and the input pipeline keep their
    # own threads. (Pinning each worker to a core helped a tiny model on a
    # quiet machine but not resnet20, and hurt on a busy one: not done.)
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)


def _child(spec: dict[str, Any]) -> dict[str, Any]:
    """Measure one configuration in this (fresh) process; return the result dict."""
    _watchdog(float(spec.get("timeout") or 600))
    _env.quiet_tensorflow()
    import tensorflow as tf

    index = _task_index()
    _apply_threads(tf, spec.get("threads"))
    gpus = tf.config.list_physical_devices("GPU")
    if spec["workers"] > 1:
        if gpus:
            tf.config.set_visible_devices([gpus[index % len(gpus)]], "GPU")
        spec["kind"], spec["replicas_in_sync"] = "multi_worker", spec["workers"]
    elif gpus:
        if spec["replicas"] > len(gpus):
            raise UserInputError(f"{spec['replicas']} replicas asked but only {len(gpus)} GPUs "
                                 "are visible")
        tf.config.set_visible_devices(gpus[:spec["replicas"]], "GPU")
        spec["kind"], spec["replicas_in_sync"] = "mirrored", spec["replicas"]
    else:
        spec["kind"], spec["replicas_in_sync"] = "mirrored", spec["replicas"]
        spec["simulate_cpus"] = spec["replicas"]
    timer, metrics = _train_steps(spec)
    global_batch = int(metrics["global_batch"])
    result = _timed(timer, spec["warmup_steps"], global_batch)
    result.update({
        "strategy": metrics["strategy"], "replicas_in_sync": metrics["replicas"],
        "global_batch": global_batch, "gpus": len(gpus),
        "devices_kind": "gpu" if gpus else "simulated-cpu",
    })
    return result


def _train_steps(spec: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Train the way ``mirrorkit train`` does until warm-up + timed steps have run.

    Returns the timer and ``train``'s metrics.
    """
    from mirrorkit.datasets import DataOptions
    from mirrorkit.training import TrainConfig, train

    total = spec["warmup_steps"] + spec["steps"]
    options = DataOptions()
    if spec["dataset"] == "synthetic":
        # Enough generated images for every step in one epoch, with room for
        # whole calls of up to 16 steps on both sides of the timed span, and
        # a multiple of 16 steps so train picks 16 per call.
        per_epoch = 16 * math.ceil((total + 32) / 16)
        options = DataOptions(
            examples=per_epoch * spec["per_replica_batch"] * spec["replicas_in_sync"])
    # Timed and warm-up steps come in whole tf.function calls (train picks
    # several steps per call), so at least `steps` are timed.
    timer = step_timer(stop_after=spec["steps"], warmup_steps=spec["warmup_steps"])
    with tempfile.TemporaryDirectory(prefix="mirrorkit-bench-") as tmp:
        config = TrainConfig(
            model=spec["model"], dataset=spec["dataset"], data=options,
            # Enough epochs to reach `total` steps however small the dataset;
            # the timer stops training as soon as they have run.
            epochs=10_000, per_replica_batch=spec["per_replica_batch"], seed=spec["seed"],
            strategy=spec["kind"], simulate_cpus=spec.get("simulate_cpus"),
            output=str(Path(tmp) / "run"))
        result = train(config, callbacks=[timer], echo=lambda line: None)
    return timer, result.metrics


def child_main(argv: Sequence[str]) -> int:
    if len(argv) != 2 or argv[0] != "--child":
        print("usage: python -m mirrorkit.bench --child SPEC_JSON (internal; use `mirrorkit bench`)",
              file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    try:
        result = _child(spec)
    except (ValueError, RuntimeError, ImportError) as err:
        print(f"{type(err).__name__}: {' '.join(str(err).split())}", file=sys.stderr)
        return 1
    print(RESULT_TAG + json.dumps(result), flush=True)
    return 0
