"""Per-worker monitoring: a real straggler is named, each worker gets its scalar, the event log tells the run.

The straggler is real: under ``mirrorkit launch -n 2`` each worker keeps to
its own core and worker 1 shares its core with two CPU-bound processes
(``tests/fixtures/straggler_train.py``), so it needs longer for its share of
every step while worker 0 waits for it.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
from conftest import REPO, clean_env

from mirrorkit.training.events import EventLog, read_events

SCRIPT = REPO / "tests" / "fixtures" / "straggler_train.py"


@pytest.fixture(scope="module")
def straggling(tmp_path_factory):
    import os

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("the straggler test needs 2 cores: one per worker")
    out = tmp_path_factory.mktemp("straggler") / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--max-restarts", "0", "--",
         "python", str(SCRIPT), "--epochs", "2", "--output", str(out)],
        env=clean_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc


@pytest.mark.exclusive
def test_the_slow_worker_is_named_every_epoch_and_the_other_never(straggling):
    out, proc = straggling
    named = [line for line in proc.stdout.splitlines() if "straggler: " in line]
    assert len(named) == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    for epoch, line in enumerate(named, start=1):
        assert line.startswith("[0] straggler: worker 1 is ")  # the chief says it
        assert line.endswith(f"epoch {epoch}") and "x slower than the median of the others" in line
    events = [e for e in read_events(out / "events.jsonl") if e["event"] == "straggler"]
    assert [(e["epoch"], e["worker"]) for e in events] == [(1, 1), (2, 1)]
    assert all(e["ratio"] >= 1.5 and e["step_ms"] > e["others_median_ms"] for e in events)


@pytest.mark.exclusive
def test_each_worker_has_its_step_time_in_history_metrics_and_tensorboard(straggling):
    out, _ = straggling
    with open(out / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2
    assert all(float(r["worker1_step_ms"]) > float(r["worker0_step_ms"]) > 0 for r in rows)
    per_worker = json.loads((out / "metrics.json").read_text())["per_worker"]
    assert [p["epoch"] for p in per_worker] == [1, 2]
    assert all(len(p["worker_step_ms"]) == 2 and p["stragglers"][0][0] == 1 for p in per_worker)
    import tensorflow as tf

    tags = set()
    for path in (out / "logs" / "train").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags.update(v.tag for v in event.summary.value)
    assert {"epoch_worker0_step_ms", "epoch_worker1_step_ms"} <= tags, tags


@pytest.mark.exclusive
def test_the_event_log_tells_the_run_from_start_to_end(straggling):
    out, _ = straggling
    events = read_events(out / "events.jsonl")
    kinds = [e["event"] for e in events]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    assert kinds.count("epoch_end") == 2
    start = events[0]
    assert start["config"]["epochs"] == 2 and start["strategy"]["workers"] == 2
    assert set(start["versions"]) == {"mirrorkit", "tensorflow", "keras", "python"}
    assert start["plan"]["global_batch"] == 64
    epoch = next(e for e in events if e["event"] == "epoch_end")
    assert epoch["metrics"]["images_per_second"] > 0 and "val_accuracy" in epoch["metrics"]
    assert events[-1]["status"] == "finished" and events[-1]["val_accuracy"] > 0.8


@pytest.mark.fast
def test_a_cut_last_line_is_skipped_and_the_rest_read(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    log.write("run_start", config={"epochs": 1})
    log.write("epoch_end", epoch=1, metrics={"loss": float("nan")})
    with open(log.path, "a") as f:
        f.write('{"time": "2026-12-03T00:00:00", "event": "ep')  # killed mid-write
    events = read_events(log.path)
    assert [e["event"] for e in events] == ["run_start", "epoch_end"]
    assert events[1]["metrics"]["loss"] == "nan"  # valid JSON, not a bare NaN


@pytest.mark.fast
def test_stragglers_are_judged_against_the_others():
    from mirrorkit.training.monitoring import find_stragglers

    assert find_stragglers([10.0, 11.0, 10.5]) == []
    assert find_stragglers([10.0, 30.0, 10.0]) == [(1, 3.0)]
    assert find_stragglers([10.0, 14.0], factor=1.3) == [(1, 1.4)]
    assert find_stragglers([5.0]) == []


@pytest.mark.exclusive
def test_the_launcher_summary_shows_each_workers_throughput(straggling):
    _, proc = straggling
    err = proc.stderr.splitlines()
    at = next(i for i, line in enumerate(err) if "[launch] all 2 worker(s) succeeded" in line)
    worker0, worker1 = err[at + 1], err[at + 2]
    assert worker0.startswith("  worker 0: ") and "images/s (epoch 2), local step" in worker0
    assert worker1.startswith("  worker 1: ") and worker1.endswith("x worker 0: the straggler)")
    assert "straggler" not in worker0
