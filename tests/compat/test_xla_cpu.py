"""``xla-cpu-replicas``: ``jit_compile=True`` trains when the replicas are CPU devices.

Plain Python on one CPU keeps XLA; under ``mirrorkit run --simulate-cpus 2``
the model trains without it and one line says why; with the fix off by name
TensorFlow fails to compile the step (a replica's variable read from another
CPU device). Across launched CPU workers the same compile fails with
"Collectives are not yet implemented for CPU devices" and a crash (measured on
keras.io's image classification from scratch; not repeated here).
"""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import REPO, clean_env, result_line

SCRIPT = REPO / "tests" / "fixtures" / "scripts" / "jit_compile.py"
RUN = [sys.executable, "-m", "mirrorkit", "run", "--simulate-cpus", "2", str(SCRIPT)]


def _run(job: tuple[list[str], dict[str, str]]) -> subprocess.CompletedProcess:
    command, env = job
    return subprocess.run(command, env=clean_env(**env), capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_jit_compile_on_cpu_replicas_trains_without_xla_and_fails_with_the_fix_off():
    jobs = [([sys.executable, str(SCRIPT)], {}), (RUN, {}),
            (RUN, {"MIRRORKIT_COMPAT_DISABLE": "xla-cpu-replicas"})]
    with ThreadPoolExecutor(max_workers=2) as pool:
        plain, fixed, broken = pool.map(_run, jobs)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert result_line(plain.stdout)["jit_compile"] is True          # one CPU: XLA
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    result = result_line(fixed.stdout)
    assert result["jit_compile"] is False
    assert result["loss"][0] == pytest.approx(result_line(plain.stdout)["loss"][0], rel=1e-3)
    assert ("jit_compile=True is off for model 'sequential': TensorFlow's XLA cannot compile "
            "a step whose 2 replicas are CPU devices") in fixed.stderr
    assert broken.returncode == 1
    assert "Trying to access resource" in broken.stderr, broken.stderr[-3000:]


@pytest.mark.fast
def test_one_replica_is_not_cpu_replicas():
    tf = pytest.importorskip("tensorflow")
    from mirrorkit.compat.xla_cpu import cpu_replicas

    assert cpu_replicas(tf.distribute.get_strategy()) == 0
    assert cpu_replicas(None) == 0
