"""Gradient accumulation: the seed recipe on fewer devices, and what accumulation costs in memory.

Two measurements, each in fresh processes running ``mirrorkit train``:

1. ``curves``: the seed scenario (ResNet-20, 32 images per replica, global batch
   256) on 8 replicas, against 2 replicas x 4 accumulated micro-batches (the
   same effective batch of 256). Same data order, same seed; the per-epoch
   training loss and accuracy of both are printed side by side with their
   largest difference.
2. ``memory``: peak resident memory of one replica training ResNet-20 at
   b=32 K=1, b=32 K=4 and b=128 K=1, as the peak over the process and as the
   growth from the start of training (the model, data and TensorFlow
   runtime excluded). Accumulation must cost what b=32 costs, not b=128.

    python benchmarks/accumulation.py                 # both, ~10 min on 2 cores
    python benchmarks/accumulation.py memory --repeats 3

Prints a table and one ``RESULT {json}`` line; ``--save FILE`` writes the JSON.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

RESULT = "RESULT "
SEED = ["--model", "resnet20", "--dataset", "synthetic", "--image-size", "32",
        "--optimizer", "momentum", "--warmup-epochs", "1", "--seed", "0",
        "--steps-per-execution", "1"]

# The child of one memory run: trains, then reports its peak and its resident
# memory when training began (a Keras callback), both from /proc (kB).
_MEMORY_CHILD = """
import json, sys
import keras
from mirrorkit.datasets import DataOptions
from mirrorkit.training import TrainConfig, train

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

class Start(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.rss = status("VmRSS")

b, k, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
start = Start()
train(TrainConfig(model="resnet20", dataset="synthetic",
                  data=DataOptions(image_size=32, channels=3, classes=10, examples=2048),
                  per_replica_batch=b, accumulate=k, epochs=1, strategy="mirrored", simulate_cpus=1,
                  steps_per_execution=1, output=out), callbacks=[start])
print("RESULT " + json.dumps({"peak_mb": status("VmHWM") / 1024,
                              "start_mb": start.rss / 1024}), flush=True)
"""


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=str(cwd), capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(args)}\n{proc.stderr[-3000:]}")
    return proc


def curves(epochs: int, examples: int) -> dict:
    """Train the seed recipe on 8 replicas and on 2 replicas x K=4; return both curves."""
    runs = {}
    for name, extra in (("8 replicas x 32", ["--simulate-cpus", "8", "--per-replica-batch", "32"]),
                        ("2 replicas x 32 x K=4", ["--simulate-cpus", "2",
                                                   "--per-replica-batch", "32",
                                                   "--global-batch", "256"])):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "run"
            _run([sys.executable, "-m", "mirrorkit", "train", *SEED, *extra,
                  "--examples", str(examples), "--epochs", str(epochs), "--output", str(out)],
                 Path(tmp))
            with open(out / "history.csv") as f:
                rows = list(csv.DictReader(f))
            metrics = json.loads((out / "metrics.json").read_text())
        runs[name] = {"loss": [float(r["loss"]) for r in rows],
                      "accuracy": [float(r["accuracy"]) for r in rows],
                      "val_loss": [float(r["val_loss"]) for r in rows],
                      "effective_batch": metrics["effective_batch"],
                      "learning_rate": metrics["learning_rate"],
                      "images_per_second": metrics["images_per_second"]}
    a, b = runs.values()
    return {"runs": runs,
            "max_loss_diff": max(abs(x - y) for x, y in zip(a["loss"], b["loss"])),
            "max_accuracy_diff": max(abs(x - y) for x, y in zip(a["accuracy"], b["accuracy"]))}


def memory(repeats: int) -> dict:
    """Peak memory of one replica at (b, K) = (32, 1), (32, 4), (128, 1), arms alternating."""
    arms = [(32, 1), (32, 4), (128, 1)]
    found: dict[str, list[dict]] = {f"b={b} K={k}": [] for b, k in arms}
    for r in range(repeats):
        for b, k in arms if r % 2 == 0 else arms[::-1]:
            with tempfile.TemporaryDirectory() as tmp:
                proc = _run([sys.executable, "-c", _MEMORY_CHILD, str(b), str(k),
                             str(Path(tmp) / "run")], Path(tmp))
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)][-1]
            found[f"b={b} K={k}"].append(json.loads(line[len(RESULT):]))
    summary = {}
    for name, rows in found.items():
        summary[name] = {"peak_mb": statistics.median(r["peak_mb"] for r in rows),
                         "growth_mb": statistics.median(r["peak_mb"] - r["start_mb"]
                                                        for r in rows),
                         "samples": rows}
    base, acc, big = (summary[f"b={b} K={k}"] for b, k in arms)
    summary["ratios"] = {
        "peak K=4 / K=1": acc["peak_mb"] / base["peak_mb"],
        "peak K=4 / b=128": acc["peak_mb"] / big["peak_mb"],
        "growth K=4 / K=1": acc["growth_mb"] / base["growth_mb"],
        "growth K=4 / b=128": acc["growth_mb"] / big["growth_mb"]}
    return summary


def main() -> None:
    """Run what the command line asks and print the tables.

    Example:
        $ python benchmarks/accumulation.py memory --repeats 3
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", nargs="?", choices=["all", "curves", "memory"], default="all")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--examples", type=int, default=1536,
                        help="synthetic training examples (6 optimizer steps of 256 an epoch)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--save", metavar="FILE")
    args = parser.parse_args()
    result: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    if args.what in ("all", "curves"):
        result["curves"] = c = curves(args.epochs, args.examples)
        print("epoch  " + "  ".join(f"{name:>24}" for name in c["runs"]))
        for e in range(args.epochs):
            print(f"{e + 1:>5}  " + "  ".join(
                f"loss {r['loss'][e]:.4f} acc {r['accuracy'][e]:.3f}" .rjust(24)
                for r in c["runs"].values()))
        print(f"max |loss diff| {c['max_loss_diff']:.2e}, max |accuracy diff| "
              f"{c['max_accuracy_diff']:.2e}")
    if args.what in ("all", "memory"):
        result["memory"] = m = memory(args.repeats)
        for name in ("b=32 K=1", "b=32 K=4", "b=128 K=1"):
            print(f"{name:>10}: peak {m[name]['peak_mb']:7.0f} MB, growth during training "
                  f"{m[name]['growth_mb']:6.0f} MB (median of {args.repeats})")
        print("  ".join(f"{k} {v:.2f}" for k, v in m["ratios"].items()))
    print(RESULT + json.dumps(result))
    if args.save:
        Path(args.save).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
