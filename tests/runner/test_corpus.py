"""The corpus: keras.io / TensorFlow-tutorial style scripts, unmodified, in three modes.

Each script in ``tests/fixtures/corpus/`` is written the way a public
keras.io example or TensorFlow tutorial is (data swapped for offline digits,
nothing mirrorkit-specific) and ends by printing ``CORPUS_RESULT {json}``.
Each runs in a fresh temporary working directory:

* ``plain``: ``python script.py`` -- the reference, run once per script;
* ``run``: ``python -m mirrorkit run --simulate-cpus 2 script.py``;
* ``launch``: ``python -m mirrorkit launch -n 2 -- mirrorkit run script.py``
  (the chief's ``[0]`` line is compared; every worker must print one).

Every mirrorkit mode must exit 0 and agree with the plain run: lists and
strings (shapes, file names) exactly, numbers within the script's tolerance
(``TOLERANCE``: what its randomness and the 2-replica batch split allow).
At most two TensorFlow processes run at once (a launch counts as two).

The training-loop scripts of ``tests/fixtures/scripts/`` (the TensorFlow
custom-training tutorial, keras.io's GAN and loop from scratch, the
mixed-precision loop) belong to the corpus too; their three modes run in
``tests/compat/test_training_loops.py``, which compares weights to 1e-5
instead of printed numbers, so they are not run twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import REPO, clean_env

pytestmark = pytest.mark.slow

CORPUS = REPO / "tests" / "fixtures" / "corpus"
TAG = "CORPUS_RESULT "
MODES = ("plain", "run", "launch")
# Absolute tolerance on every number a script reports, per script. Training
# runs 1-2 epochs from the same seed; 2 replicas change the summation order
# (and, where the script sizes its batch by num_replicas_in_sync, the batch).
TOLERANCE = {
    "pydataset_dict": 0.1,
    "transfer_learning": 0.1,
    "image_folders": 0.25,         # 10 training steps on BatchNorm statistics
    "save_callbacks": 0.1,
    "custom_metric": 0.1,
    "gradient_accumulation": 0.1,  # Dropout draws differ per replica
}
# Keys compared tightly whatever the script's tolerance (exact by design).
EXACT_NUMBERS = {"predict_on_batch_vs_call": 1e-5, "test_on_batch_vs_evaluate": 1e-5,
                 "reloaded_loss_diff": 1e-6, "score_sum": 1e-5,
                 # The script's own arrays after training: TensorFlow must not write into them.
                 "sample_weight_sum": 0.0}
# Counts that scale with the data, not the model: within 10% of the plain run.
RELATIVE = {"train_true_positives": 0.1, "test_true_positives": 0.1}
SCRIPTS = sorted(TOLERANCE)


def _command(name: str, mode: str) -> list[str]:
    script = str(CORPUS / f"{name}.py")
    if mode == "plain":
        return [sys.executable, script]
    if mode == "run":
        return [sys.executable, "-m", "mirrorkit", "run", "--simulate-cpus", "2", script]
    return [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--",
            "mirrorkit", "run", script]


class _Slots:
    """At most ``n`` TensorFlow processes at once; a job may need several slots."""

    def __init__(self, n: int) -> None:
        self._free = n
        self._cond = threading.Condition()

    def run(self, need: int, job):
        with self._cond:
            self._cond.wait_for(lambda: self._free >= need)
            self._free -= need
        try:
            return job()
        finally:
            with self._cond:
                self._free += need
                self._cond.notify_all()


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True)
    try:
        return subprocess.run(command, cwd=str(cwd), env=clean_env(), capture_output=True,
                              text=True, timeout=300)
    except subprocess.TimeoutExpired as err:
        return subprocess.CompletedProcess(command, -9, err.stdout or "", f"timeout: {err}")


def run_corpus(tmp: Path, names=SCRIPTS, modes=MODES) -> dict:
    """Run every (script, mode); return {(name, mode): CompletedProcess}."""
    slots = _Slots(2)
    jobs = [(n, m) for m in ("launch", "run", "plain") if m in modes for n in names]
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {(n, m): pool.submit(slots.run, 2 if m == "launch" else 1,
                                       lambda n=n, m=m: _run(_command(n, m), tmp / m / n))
                   for n, m in jobs}
        return {key: f.result() for key, f in futures.items()}


def corpus_result(proc: subprocess.CompletedProcess, mode: str) -> dict:
    """The CORPUS_RESULT json (under launch: the chief's, after checking every worker's)."""
    lines = [line for line in proc.stdout.splitlines() if TAG in line]
    if mode == "launch":
        by_rank = {line.split(" ", 1)[0]: line for line in lines}
        assert {"[0]", "[1]"} <= set(by_rank), f"a worker printed no result:\n{proc.stdout}"
        lines = [by_rank["[0]"]]
    assert lines, f"no {TAG.strip()} line:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1].split(TAG, 1)[1])


def differences(name: str, expected, actual, key: str = "") -> list[str]:
    """Where ``actual`` disagrees with ``expected`` beyond the script's tolerance."""
    if isinstance(expected, dict):
        if set(expected) != set(actual):
            return [f"{key}: keys {sorted(actual)} != {sorted(expected)}"]
        return [d for k in expected for d in
                differences(name, expected[k], actual[k], f"{key}.{k}" if key else k)]
    leaf = key.rsplit(".", 1)[-1]
    if isinstance(expected, float) and isinstance(actual, (int, float)) \
            and not isinstance(expected, bool):
        if leaf in EXACT_NUMBERS:
            ok = abs(actual - expected) <= EXACT_NUMBERS[leaf]
        elif leaf in RELATIVE:
            ok = abs(actual - expected) <= RELATIVE[leaf] * max(abs(expected), 1.0)
        else:
            ok = abs(actual - expected) <= TOLERANCE[name]
        return [] if ok else [f"{key}: {actual} vs plain {expected}"]
    return [] if actual == expected else [f"{key}: {actual!r} vs plain {expected!r}"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return run_corpus(tmp_path_factory.mktemp("corpus"))


def _tail(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n[stdout]\n{proc.stdout[-3000:]}\n[stderr]\n{proc.stderr[-4000:]}"


@pytest.mark.parametrize("mode", ["run", "launch"])
@pytest.mark.parametrize("name", SCRIPTS)
def test_corpus_script_agrees_with_plain_python(corpus, name, mode):
    plain = corpus[name, "plain"]
    assert plain.returncode == 0, f"the plain run fails: {_tail(plain)}"
    proc = corpus[name, mode]
    assert proc.returncode == 0, _tail(proc)
    diffs = differences(name, corpus_result(plain, "plain"), corpus_result(proc, mode))
    assert not diffs, f"{name} under {mode}: " + "; ".join(diffs)


if __name__ == "__main__":  # a table: PYTHONPATH=tests python tests/runner/test_corpus.py [names]
    import tempfile

    sys.path.insert(0, str(REPO / "tests"))
    chosen = sys.argv[1:] or SCRIPTS
    done = run_corpus(Path(tempfile.mkdtemp(prefix="corpus-")), chosen)
    for n in chosen:
        plain = corpus_result(done[n, "plain"], "plain") if done[n, "plain"].returncode == 0 \
            else None
        for m in MODES:
            p = done[n, m]
            if p.returncode != 0:
                err = [x for x in (p.stderr + p.stdout).splitlines() if x.strip()]
                print(f"{n:22s} {m:7s} FAIL exit {p.returncode}: {err[-1] if err else ''}")
                continue
            try:
                diffs = [] if m == "plain" else differences(n, plain, corpus_result(p, m))
            except AssertionError as e:
                diffs = [str(e)[:200]]
            print(f"{n:22s} {m:7s} {'ok' if not diffs else 'DIFF ' + '; '.join(diffs)}")
