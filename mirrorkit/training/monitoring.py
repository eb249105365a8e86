"""Per-worker step times, stragglers named, and what each worker did, every epoch.

In synchronous data-parallel training every worker waits for the slowest at
each all-reduce, so every worker's *wall* step time is the same and a slow
worker is invisible in it. What differs is the time a worker needs for its
own share of the work. :class:`WorkerMonitor` measures exactly that at the
end of every epoch: each worker times a few forward+backward passes of a
local copy of the model on one per-replica batch, with no communication (the
"local step"; NVIDIA's straggler detection for PyTorch scores ranks the same
way, by timing sections of each rank's own work). One all-gather then gives
every worker all the times; the chief compares each with the median of the
others and names a worker ``factor`` or more times slower:

    straggler: worker 1 is 1.8x slower than the median of the others (local step 41.0 ms vs 22.8 ms)

It also adds ``worker<i>_step_ms`` to the epoch logs (so TensorBoard draws
one scalar per worker, and ``history.csv`` has a column each), appends
``epoch_end``/``straggler`` events to the run's event log, and, under
``mirrorkit launch``, leaves ``worker-<rank>.json`` in the launcher's status
folder for its final summary. With one worker there is nothing to compare:
only the wall step time is recorded.

Example:
    >>> find_stragglers([20.0, 41.0, 21.0], factor=1.5)
    [(1, 2.0)]
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import keras

from mirrorkit import protocol

STRAGGLER_FACTOR = 1.5
_REPEATS = 5
_WARM_SECONDS = 0.05


def find_stragglers(times: list[float], factor: float = STRAGGLER_FACTOR) -> list[tuple[int, float]]:
    """Workers whose time is ``factor`` or more times the median of the others'.

    Returns:
        ``(worker, ratio)`` pairs, slowest first.

    Example:
        >>> find_stragglers([10.0, 10.5])
        []
        >>> find_stragglers([10.0, 30.0])
        [(1, 3.0)]
    """
    found = []
    for i, t in enumerate(times):
        others = [o for j, o in enumerate(times) if j != i]
        if not others:
            continue
        median = statistics.median(others)
        if median > 0 and t / median >= factor:
            found.append((i, t / median))
    return sorted(found, key=lambda pair: -pair[1])


class WorkerMonitor(keras.callbacks.Callback):
    """Time each worker's local step every epoch and name stragglers (see the module docstring).

    Args:
        strategy: the model's strategy (its workers are compared).
        workers: how many workers it has.
        global_batch: examples per step over all replicas.
        per_replica_batch: examples per replica (the probe's batch).
        report: called with each line for the user (the chief's), or None.
        events: an :class:`~mirrorkit.training.events.EventLog`, or None.
        status_path: where this worker writes its JSON status each epoch
            (``mirrorkit launch``'s status folder), or None.
        factor: how much slower than the others' median is a straggler.
            Defaults to 1.5.

    Attributes:
        epochs: one dict per epoch: ``epoch``, ``step_ms`` (wall, the same
            on all workers), ``worker_step_ms`` (each worker's local step),
            ``stragglers`` (``[worker, ratio]`` pairs).

    Example:
        >>> monitor = WorkerMonitor(strategy, workers=2, global_batch=64,
        ...                         per_replica_batch=32)      # doctest: +SKIP
        >>> model.fit(ds, epochs=3, callbacks=[monitor])      # doctest: +SKIP
    """

    def __init__(self, strategy: Any, *, workers: int, global_batch: int, per_replica_batch: int,
                 report: Callable[[str], Any] | None = None, events: Any = None,
                 status_path: str | os.PathLike | None = None,
                 factor: float = STRAGGLER_FACTOR) -> None:
        super().__init__()
        self.strategy, self.workers = strategy, workers
        self.global_batch, self.per_replica_batch = global_batch, per_replica_batch
        self.report, self.events, self.factor = report, events, factor
        self.status_path = Path(status_path) if status_path else None
        self.epochs: list[dict[str, Any]] = []
        self._probe: Callable[[], float] | None = None
        self._start = self._last = 0.0
        self._steps = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._start = self._last = time.perf_counter()
        self._steps = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._steps, self._last = batch + 1, time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        from mirrorkit.distribute.sync import gather_per_worker

        step_ms = 1000 * (self._last - self._start) / max(self._steps, 1)
        local = self._local_step_ms() if self.workers > 1 else step_ms
        times = [row[0] for row in gather_per_worker([local], self.strategy)]
        stragglers = find_stragglers(times, self.factor) if len(times) > 1 else []
        record = {"epoch": epoch + 1, "step_ms": step_ms, "worker_step_ms": times,
                  "stragglers": [[i, ratio] for i, ratio in stragglers]}
        self.epochs.append(record)
        if logs is not None and len(times) > 1:
            for i, t in enumerate(times):
                logs[f"worker{i}_step_ms"] = t
        for i, ratio in stragglers:
            others = statistics.median(t for j, t in enumerate(times) if j != i)
            line = (f"straggler: worker {i} is {ratio:.1f}x slower than the median of the "
                    f"others (local step {times[i]:.1f} ms vs {others:.1f} ms), epoch {epoch + 1}")
            if self.report is not None:
                self.report(line)
            if self.events is not None:
                self.events.write("straggler", epoch=epoch + 1, worker=i, ratio=ratio,
                                  step_ms=times[i], others_median_ms=others)
        self._write_status(epoch, step_ms, times)

    def _write_status(self, epoch: int, step_ms: float, times: list[float]) -> None:
        if self.status_path is None:
            return
        from mirrorkit.distribute.strategy import describe

        rank = describe(self.strategy).task_index
        share = self.global_batch / self.workers
        # The launcher reads it back with protocol.read_status: one schema, one version.
        protocol.write_status(
            self.status_path, rank=rank, epoch=epoch + 1, step_ms=step_ms,
            images_per_second=share / (step_ms / 1000) if step_ms else None,
            local_step_ms=times[min(rank, len(times) - 1)])

    def _local_step_ms(self) -> float:
        if self._probe is None:
            if not getattr(self.model, "inputs", None):
                # A subclassed model has no known input shape to probe with.
                return 1000 * (self._last - self._start) / max(self._steps, 1)
            self._probe = _make_probe(self.model, self.per_replica_batch)
            self._probe()  # traced once, not timed
        # Back-to-back passes first: a process that just waited at an all-reduce
        # runs its next few milliseconds ahead of busy neighbours on its core
        # (the scheduler's credit for sleepers), which hid a 3x straggler in
        # the first epoch (3.3 vs 2.4 ms); the timed passes then see its
        # sustained share, as training does.
        warm = time.perf_counter()
        while time.perf_counter() - warm < _WARM_SECONDS:
            self._probe()
        runs = []
        for _ in range(_REPEATS):
            start = time.perf_counter()
            self._probe()
            runs.append(1000 * (time.perf_counter() - start))
        return statistics.median(runs)


def _make_probe(model: Any, batch: int) -> Callable[[], float]:
    """One forward+backward pass of a local copy of ``model`` on a fixed batch: no communication."""
    import tensorflow as tf

    # Keras runs callbacks outside the strategy's scope, so the copy's
    # variables are plain: the pass involves no other worker. Its weights do
    # not matter for the time.
    copy = keras.models.clone_model(model)
    shape = [batch] + [d or 1 for d in model.inputs[0].shape[1:]]
    images = tf.random.uniform(shape, dtype=model.inputs[0].dtype or "float32")

    @tf.function
    def step() -> Any:
        with tf.GradientTape() as tape:
            out = copy(images, training=True)
            loss = tf.reduce_sum(tf.cast(tf.nest.flatten(out)[0], "float32"))
        grads = tape.gradient(loss, copy.trainable_variables)
        return tf.add_n([tf.reduce_sum(g) for g in grads if g is not None])

    return lambda: float(step())


class EpochEvents(keras.callbacks.Callback):
    """Append an ``epoch_end`` event with the epoch's logs; place it after the meter and monitor.

    Args:
        events: an :class:`~mirrorkit.training.events.EventLog`.

    Example:
        >>> model.fit(ds, epochs=2, callbacks=[meter, EpochEvents(log)])   # doctest: +SKIP
    """

    def __init__(self, events: Any) -> None:
        super().__init__()
        self.events = events

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.events.write("epoch_end", epoch=epoch + 1, metrics=dict(logs or {}))
