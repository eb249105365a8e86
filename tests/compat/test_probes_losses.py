"""The loss fixes' behaviour probes (mirrorkit/compat/probes_losses.py) on 2 replicas.

One process runs every probe on Keras's own code (``compat.revert()``),
where each must see its bug, then with every fix applied, where each must
see one device's numbers (the two checks aside), and with every fix but its
own applied, where each must see its bug again; it prints how long the first
two rounds of probes took.
"""

from __future__ import annotations

from conftest import run_snippet

from mirrorkit.compat import FIXES

# This family's probes, as the fix records name them (the one table).
PROBES = {name: fix.probe for name, fix in FIXES.items()
          if fix.probe and fix.probe.__module__.startswith("mirrorkit.compat.probes_losses")}

# The two checks name a problem and change no number: their probes show the
# behaviour they name (a (batch, batch) product's pairs, a variable's
# replica copies), which is the same with the check applied.
CHECKS = {"paired-step-losses", "replica-variable-copies"}

SNIPPET = """
import json, time
import mirrorkit
from mirrorkit import compat
PROBES = {name: fix.probe for name, fix in compat.FIXES.items()
          if fix.probe and fix.probe.__module__.startswith("mirrorkit.compat.probes_losses")}

strategy = mirrorkit.get_strategy(simulate_cpus=2)
found, seconds = {}, {}
for label, setup in (("keras", compat.revert), ("fixed", lambda: compat.apply(disable=[]))):
    setup()
    start, cpu = time.perf_counter(), time.process_time()
    found[label] = {name: probe(strategy) for name, probe in PROBES.items()}
    seconds[label] = {"wall": round(time.perf_counter() - start, 2),
                      "cpu": round(time.process_time() - cpu, 2)}
print("probes took (s)", seconds)
# As mirrorkit decides a fix: its own fix off, every other one applied.
found["alone"] = {}
for name, probe in PROBES.items():
    compat.apply(disable=[name])
    found["alone"][name] = probe(strategy)
found["none"] = {name: probe(None) for name, probe in PROBES.items()}
print("RESULT " + json.dumps({"found": found, "seconds": seconds}))
"""


def test_each_probe_sees_its_bug_on_keras_code_and_one_device_with_the_fixes(tmp_path):
    result, proc = run_snippet(SNIPPET, tmp_path, timeout=600)
    found = result["found"]
    print("probe rounds took (s):", result["seconds"])   # shown with -s
    assert set(found["keras"]) == set(PROBES) == {
        "uneven-batch-losses", "layer-losses", "scalar-losses", "masked-loss-means",
        "overridden-loss-call", "batch-wide-metrics", "batch-sum-losses", "paired-step-losses",
        "no-gradient-losses", "logged-step-losses", "hand-mean-gradients",
        "replica-variable-copies"}
    assert found["keras"] == dict.fromkeys(PROBES, True), proc.stderr[-3000:]
    assert found["fixed"] == {name: name in CHECKS for name in PROBES}, proc.stderr[-3000:]
    # Another fix never hides a probe's bug (logged-step-losses would a metric's sum).
    assert found["alone"] == dict.fromkeys(PROBES, True), proc.stderr[-3000:]
    assert found["none"] == dict.fromkeys(PROBES, None)
