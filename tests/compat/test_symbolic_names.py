"""``symbolic-build-names``: every name a script sees after training is plain Python's.

``tests/fixtures/scripts/auto_names.py`` trains a lazily built ``Sequential``,
a functional model and TensorFlow's image-classification tutorial model,
converts the last with ``TFLiteConverter``, calls its signature runner by the
input name, and prints layer, model, tensor, variable, optimizer-variable,
metric and checkpoint names. Under ``mirrorkit run`` (2 replicas) and
``mirrorkit launch`` (2 workers) every name equals the plain run's; with the
fix off by name, upstream renames the tensors made after the first ``fit``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO, clean_env

pytestmark = pytest.mark.slow

SCRIPT = str(REPO / "tests" / "fixtures" / "scripts" / "auto_names.py")
TENSORS = ("seq_inputs", "seq_outputs", "func_inputs", "tutorial_inputs", "tflite_input",
           "next_input")


def _names(cwd, command: list[str], **env: str) -> list[dict]:
    proc = subprocess.run(command, cwd=str(cwd), env=clean_env(**env), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    found = [json.loads(line.split("NAMES ", 1)[1]) for line in proc.stdout.splitlines()
             if "NAMES " in line]
    assert found, proc.stdout[-2000:]
    return found


def test_names_after_distributed_training_are_plain_pythons(tmp_path):
    run = [sys.executable, "-m", "mirrorkit", "run", "--simulate-cpus", "2", SCRIPT]
    jobs = {
        "plain": ([sys.executable, SCRIPT], {}),
        "run": (run, {}),
        "off": (run, {"MIRRORKIT_COMPAT_DISABLE": "symbolic-build-names"}),
        "launch": ([sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--",
                    "mirrorkit", "run", SCRIPT], {}),
    }
    for name in jobs:
        (tmp_path / name).mkdir()
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(_names, tmp_path / name, command, **env)
                   for name, (command, env) in jobs.items()}
        found = {name: future.result() for name, future in futures.items()}
    plain = found["plain"][0]
    assert plain["tflite_matches_keras"]
    assert found["run"] == [plain]
    assert len(found["launch"]) == 2 and all(names == plain for names in found["launch"])
    # The control: upstream's symbolic build renames every tensor named after it,
    # the lazily built model's own input included.
    off = found["off"][0]
    assert all(off[key] != plain[key] for key in TENSORS), (off, plain)
    assert {k: v for k, v in off.items() if k not in TENSORS} == \
        {k: v for k, v in plain.items() if k not in TENSORS}
