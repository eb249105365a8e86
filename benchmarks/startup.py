"""What a worker pays to start TensorFlow and Keras: plain, and as mirrorkit starts it.

How to run (each round starts one fresh process per arm, arms alternated;
about 4 s of CPU per process)::

    python benchmarks/startup.py --rounds 10

Arms, each a new interpreter that runs ``import tensorflow, keras`` and then
a small job (a two-layer model, ``fit`` for 2 epochs of 8 steps, then
``evaluate``: tracing, the collector's work after start-up):

* ``plain``: as ``python script.py`` does.
* ``mirrorkit``: after :func:`mirrorkit.launcher.startup.install`, what
  every ``mirrorkit`` command and every Python worker of ``mirrorkit
  launch`` does first (Keras's imports of pandas and matplotlib wait for
  their first use; the garbage collector stays out of TensorFlow's import).

Per process it takes the CPU seconds (user + system, from ``getrusage``) at
the end of the import and at the end of the job, and which of
pandas/matplotlib Keras imported (the deferred imports only matter where
they are installed; the report says which are). The last line, ``RESULT
{json}``, holds every process and the ratios of the medians (mirrorkit /
plain).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys

_MEASURE = """
import resource, sys
{setup}
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
import tensorflow, keras
imported = cpu()
seen = [name in sys.modules for name in ("pandas", "matplotlib")]
import numpy as np
x, y = np.random.rand(256, 8).astype("float32"), np.random.rand(256, 1).astype("float32")
model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                          keras.layers.Dense(1)])
model.compile("adam", "mse")
model.fit(x, y, batch_size=32, epochs=2, verbose=0)
model.evaluate(x, y, verbose=0)
print("CPU", imported, cpu(), *seen)
"""
ARMS = {
    "plain": "",
    "mirrorkit": "from mirrorkit.launcher import startup; startup.install()",
}


def one(arm: str) -> dict[str, object]:
    """One fresh interpreter of ``arm``: its CPU seconds and what it imported."""
    proc = subprocess.run([sys.executable, "-c", _MEASURE.format(setup=ARMS[arm])],
                          capture_output=True, text=True, check=True, timeout=300)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("CPU "))
    _, imported, total, pandas, matplotlib = line.split()
    return {"arm": arm, "import_cpu": round(float(imported), 3), "cpu": round(float(total), 3),
            "pandas": pandas == "True", "matplotlib": matplotlib == "True"}


def main() -> None:
    """Alternate the arms for ``--rounds`` rounds and print medians and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    installed = {name: importlib.util.find_spec(name) is not None
                 for name in ("pandas", "matplotlib")}
    print("installed:", ", ".join(f"{k}={v}" for k, v in installed.items()))
    runs = []
    for round_ in range(args.rounds):
        # Alternate which arm goes first, so a drift in the machine's load hits both.
        order = list(ARMS) if round_ % 2 == 0 else list(reversed(ARMS))
        for arm in order:
            runs.append(one(arm))
            print(json.dumps(runs[-1]), flush=True)
    medians = {key: {arm: statistics.median(r[key] for r in runs if r["arm"] == arm)
                     for arm in ARMS} for key in ("import_cpu", "cpu")}
    ratios = {key: round(m["mirrorkit"] / m["plain"], 3) for key, m in medians.items()}
    for key, label in (("import_cpu", "import"), ("cpu", "import + job")):
        print(f"{label:>13}: plain {medians[key]['plain']:.3f} CPU-s, mirrorkit "
              f"{medians[key]['mirrorkit']:.3f} CPU-s (medians of {args.rounds}), "
              f"ratio {ratios[key]:.3f}")
    print("RESULT " + json.dumps({"installed": installed, "medians": medians,
                                  "ratios": ratios, "runs": runs}))


if __name__ == "__main__":
    main()
