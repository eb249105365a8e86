"""``symbolic-build-names`` and ``-order``: names and data order after training are plain Python's.

``tests/fixtures/scripts/auto_names.py`` trains a lazily built ``Sequential``,
a functional model and TensorFlow's image-classification tutorial model,
converts the last with ``TFLiteConverter``, calls its signature runner by the
input name, and prints layer, model, tensor, variable, optimizer-variable,
metric and checkpoint names. Under ``mirrorkit run`` (2 replicas) and
``mirrorkit launch`` (2 workers) every name equals the plain run's; with the
fix off by name, upstream renames the tensors made after the first ``fit``.

The same script then fits on a reshuffled ``tf.data`` pipeline, arrays and a
``PyDataset`` shuffling with Python's ``random``: under ``mirrorkit run`` every
per-batch loss (the data order) and Python's and NumPy's next random numbers
equal the plain run's (``symbolic-build-order``); with it off, the peek before
``fit`` moves the pipeline and the PyDataset to their second order (on Keras
3.16, whose PyDataset shuffles with a generator of its own seeded by the epoch,
the pipeline alone: the PyDataset's order and Python's random state stay
plain's, ``symbolic_order.PYDATASET_OWN_SHUFFLE``). A model
built in the script's own strategy's scope peeks under plain Python too (a
strategy over its one CPU), so under ``mirrorkit run`` it keeps the peek and
sees plain's order (without that, its first epoch trained on another order).
So does a model in a strategy the script pins to its own devices, which
mirrorkit leaves to the script.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO, clean_env

from mirrorkit.compat import symbolic_order
from mirrorkit.patching import targets

pytestmark = pytest.mark.slow

SCRIPT = str(REPO / "tests" / "fixtures" / "scripts" / "auto_names.py")
TENSORS = ("seq_inputs", "seq_outputs", "func_inputs", "tutorial_inputs", "tflite_input",
           "next_input")


def _results(cwd, command: list[str], **env: str) -> dict[str, list[dict]]:
    proc = subprocess.run(command, cwd=str(cwd), env=clean_env(**env), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    found = {tag: [json.loads(line.split(f"{tag} ", 1)[1]) for line in proc.stdout.splitlines()
                   if f"{tag} " in line] for tag in ("NAMES", "ORDER")}
    assert found["NAMES"] and found["ORDER"], proc.stdout[-2000:]
    return found


def test_names_and_data_order_after_distributed_training_are_plain_pythons(tmp_path):
    run = [sys.executable, "-m", "mirrorkit", "run", "--simulate-cpus", "2", SCRIPT]
    jobs = {
        "plain": ([sys.executable, SCRIPT], {}),
        "run": (run, {}),
        "off": (run, {"MIRRORKIT_COMPAT_DISABLE": "symbolic-build-names,symbolic-build-order"}),
        "launch": ([sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--",
                    "mirrorkit", "run", SCRIPT], {}),
    }
    for name in jobs:
        (tmp_path / name).mkdir()
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(_results, tmp_path / name, command, **env)
                   for name, (command, env) in jobs.items()}
        found = {name: future.result() for name, future in futures.items()}
    plain = found["plain"]["NAMES"][0]
    assert plain["tflite_matches_keras"]
    assert found["run"]["NAMES"] == [plain]
    assert len(found["launch"]["NAMES"]) == 2
    assert all(names == plain for names in found["launch"]["NAMES"])
    # The control: upstream's symbolic build renames every tensor named after it,
    # the lazily built model's own input included.
    off = found["off"]["NAMES"][0]
    assert all(off[key] != plain[key] for key in TENSORS), (off, plain)
    assert {k: v for k, v in off.items() if k not in TENSORS} == \
        {k: v for k, v in plain.items() if k not in TENSORS}

    # The data order (one process: launched workers each see their shard).
    plain, run, off = (found[mode]["ORDER"][0] for mode in ("plain", "run", "off"))
    assert run["python_random"] == plain["python_random"]
    assert run["numpy_random"] == plain["numpy_random"]
    for source, losses in plain["losses"].items():
        assert run["losses"][source] == pytest.approx(losses, rel=1e-5), source
    # Upstream: the peek draws the pipeline's first order.
    assert off["losses"]["tf_data"][0] != pytest.approx(plain["losses"]["tf_data"][0], rel=1e-3)
    if targets.applies(symbolic_order.PYDATASET_OWN_SHUFFLE):
        # A PyDataset shuffling by its epoch's own generator: the peek sees epoch 1's
        # order and draws nothing from Python's random.
        assert off["losses"]["py_dataset"] == pytest.approx(plain["losses"]["py_dataset"],
                                                            rel=1e-5)
        assert off["python_random"] == plain["python_random"]
    else:
        # And the PyDataset's, drawn from Python's random.
        assert off["losses"]["py_dataset"][0] != pytest.approx(
            plain["losses"]["py_dataset"][0], rel=1e-3)
        assert off["python_random"] != plain["python_random"]
