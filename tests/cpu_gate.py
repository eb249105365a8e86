"""Start a subprocess-heavy test only when a core is free (the suite's xdist workers).

The suite is CPU-bound on 2 cores, and its TensorFlow processes need more
CPU-seconds the more of them share a core (caches, switches: measured 20.4
CPU-s for one training script alone or two at once, 24.0 each with four).
Three xdist workers whose tests each start two to four TensorFlow processes
kept about six tasks runnable on the two cores. A worker now waits before it
starts a test that is not in the fast tier until the machine has had an idle
core's worth of time over the last second, or until ``MAX_WAIT`` has passed
(so a test that keeps both cores busy for minutes cannot starve the others).
Tests that wait (a join timeout, a killed peer, Slurm, Ray) leave cores idle,
so the other workers start theirs: the cores stay busy without oversubscription.

``MIRRORKIT_TEST_CPU_GATE=0`` turns it off (to measure the difference).

Example:
    >>> gate = CpuGate(Path("/tmp/locks"))                    # doctest: +SKIP
    >>> gate.wait()            # returns once a core has been idle  # doctest: +SKIP
"""

from __future__ import annotations

import collections
import os
import threading
import time
from pathlib import Path

# A core's worth of idle time per second of wall time counts as free; the
# machine is sampled every TICK seconds over the last WINDOW; a test never
# waits longer than MAX_WAIT.
TICK = 0.25
WINDOW = 4   # ticks
FREE_CORES = 0.5
MAX_WAIT = 45.0
SETTLE = 1.5   # seconds after any worker's start before the next one may start


def _idle_and_total() -> tuple[int, int]:
    """(idle, total) jiffies of all cores since boot, from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return fields[3] + fields[4], sum(fields[:8])   # idle + iowait; guest time is in user


class CpuGate:
    """Waits for a free core before a heavy test starts (see the module's docstring).

    Example:
        >>> CpuGate(Path("/tmp/locks")).wait()                # doctest: +SKIP
    """

    def __init__(self, folder: Path) -> None:
        # Every worker touches this file as it starts a test: the others give
        # the new test's processes a moment to show up in the idle figure.
        self._started = folder / "cpu-gate.started"
        self.enabled = (os.environ.get("MIRRORKIT_TEST_CPU_GATE", "1") != "0"
                        and os.path.exists("/proc/stat"))
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
        self.waited = 0.0
        self._samples: collections.deque[tuple[int, int]] = collections.deque(
            maxlen=WINDOW + 1)
        self._lock = threading.Lock()
        if self.enabled:
            self._samples.append(_idle_and_total())
            # A daemon thread: the reading is ready when a test asks, no test waits a window.
            threading.Thread(target=self._sample, name="cpu-gate", daemon=True).start()

    def _sample(self) -> None:
        while True:
            time.sleep(TICK)
            with self._lock:
                self._samples.append(_idle_and_total())

    def free_cores(self) -> float:
        """Idle cores averaged over the last second (all cores when not yet measured)."""
        with self._lock:
            (idle0, total0), (idle1, total1) = self._samples[0], self._samples[-1]
        if total1 <= total0:
            return float(self.cores)
        return self.cores * (idle1 - idle0) / (total1 - total0)

    def _since_a_start(self) -> float:
        try:
            return time.time() - self._started.stat().st_mtime
        except FileNotFoundError:
            return SETTLE

    def wait(self) -> float:
        """Block until a core is free or ``MAX_WAIT`` has passed; the seconds waited."""
        if not self.enabled:
            return 0.0
        start = time.monotonic()
        while time.monotonic() - start < MAX_WAIT and (
                self.free_cores() < FREE_CORES or self._since_a_start() < SETTLE):
            time.sleep(TICK)
        self._started.touch()
        waited = time.monotonic() - start
        self.waited += waited
        return waited
