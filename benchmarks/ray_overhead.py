"""What Ray Train adds: ``mirrorkit launch --ray -n 2`` vs ``mirrorkit launch -n 2``, one machine.

How to run (starts and stops its own one-node Ray cluster on loopback; one
round = one job of each kind, alternated, ~1.5-3 min per round on a quiet
2-core machine)::

    python benchmarks/ray_overhead.py --rounds 2 --epochs 3

Both arms run the same job, ``mirrorkit train --epochs E
--per-replica-batch 32`` (the embedded digits, the small CNN) as 2 workers:
the local arm through mirrorkit's own launcher, the Ray arm through Ray
Train (``mirrorkit.launcher.ray_backend``) on a head started here with ``ray start --head
--block`` (2 CPUs, no dashboard; ``--cpus-per-worker 1``). Per job it takes,
from the chief's ``metrics.json``: the per-step time (global batch /
images per second) and the final ``val_accuracy``; and from the clock: the
whole command's wall time, of which the part outside ``mirrorkit train``'s
own ``wall_time_seconds`` is start-up and shut-down (launcher, Ray's
controller and worker actors, TensorFlow imports, cluster forming). The
cluster's own start (``ray start``) is timed once and reported apart: a Ray
user starts it once for many jobs. The last line, ``RESULT {json}``, holds
every job and the ratios of the medians (Ray / local).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIRRORKIT = [sys.executable, "-m", "mirrorkit"]
RAY = str(Path(sys.executable).parent / "ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(temp: str) -> tuple[subprocess.Popen, str, float]:
    """A one-node Ray head on loopback, in the foreground (``--block``) so it stops with us."""
    port = _free_port()
    begun = time.monotonic()
    head = subprocess.Popen(
        [RAY, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
         "--num-cpus=2", "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats",
         f"--temp-dir={temp}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    address = f"127.0.0.1:{port}"
    while subprocess.run([RAY, "status", f"--address={address}"], capture_output=True,
                         timeout=60).returncode != 0:
        if head.poll() is not None or time.monotonic() - begun > 120:
            raise RuntimeError(f"the Ray head did not come up (exit {head.poll()})")
        time.sleep(0.5)
    return head, address, time.monotonic() - begun


def stop_cluster(head: subprocess.Popen) -> None:
    """SIGTERM asks ``ray start --block`` to stop what it started; then its whole group goes."""
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(30)
    except subprocess.TimeoutExpired:
        pass  # it may take longer than that: its process group goes below regardless
    try:
        # Ray's processes, its worker actors too, are in the head's process group.
        os.killpg(head.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def one_job(arm: str, address: str, args: argparse.Namespace, out: Path) -> dict:
    """One 2-worker ``mirrorkit train`` job; its timings and accuracy."""
    launch = [*MIRRORKIT, "launch", "-n", "2"]
    if arm == "ray":
        launch += ["--ray", address, "--cpus-per-worker", "1"]
    command = [*launch, "--", "mirrorkit", "train", "--epochs", str(args.epochs),
               "--per-replica-batch", "32",
               "--output", str(out)]
    begun = time.monotonic()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2",
                               "RAY_USAGE_STATS_ENABLED": "0"})
    wall = time.monotonic() - begun
    if proc.returncode != 0:
        raise RuntimeError(f"{arm} job failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    metrics = json.loads((out / "metrics.json").read_text())
    step_ms = 1000.0 * metrics["global_batch"] / metrics["images_per_second"]
    return {"arm": arm, "wall_s": round(wall, 2),
            "train_s": round(metrics["wall_time_seconds"], 2),
            "outside_train_s": round(wall - metrics["wall_time_seconds"], 2),
            "step_ms": round(step_ms, 2), "val_accuracy": metrics["val_accuracy"],
            "in_sync": metrics["weights_in_sync"]["identical"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    temp = tempfile.mkdtemp(prefix="mkrayb", dir="/tmp")
    head, address, cluster_s = start_cluster(temp)
    jobs = []
    try:
        with tempfile.TemporaryDirectory(prefix="ray-overhead-") as work:
            for r in range(args.rounds):
                # Alternated, the first arm swapped each round: drift hits both alike.
                for arm in (("local", "ray") if r % 2 == 0 else ("ray", "local")):
                    job = one_job(arm, address, args, Path(work) / f"{arm}-{r}")
                    job["round"] = r
                    jobs.append(job)
                    print(json.dumps(job), flush=True)
    finally:
        stop_cluster(head)
        subprocess.run(["rm", "-rf", temp], check=False)

    def median(arm: str, key: str) -> float:
        return statistics.median(j[key] for j in jobs if j["arm"] == arm)

    summary = {key: {"local": median("local", key), "ray": median("ray", key),
                     "ratio": round(median("ray", key) / median("local", key), 3)}
               for key in ("wall_s", "outside_train_s", "train_s", "step_ms", "val_accuracy")}
    print(f"ray start --head: {cluster_s:.1f} s (once per cluster)")
    for key, row in summary.items():
        print(f"{key:16s} local {row['local']:8.3f}  ray {row['ray']:8.3f}  "
              f"ratio {row['ratio']:.3f}")
    print("RESULT " + json.dumps({"cluster_start_s": round(cluster_s, 2), "jobs": jobs,
                                  "summary": summary, "epochs": args.epochs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
