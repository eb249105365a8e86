"""predict/evaluate with an empty replica batch are exactly those of one device.

The fixture script (``tests/fixtures/scripts/predict_evaluate_small.py``) runs
a BatchNormalization CNN with fixed weights on 1 image, 3 images, 33 images
at ``batch_size=32`` ... as arrays, tensors, dicts and ``tf.data.Dataset``.
Its plain ``python`` run is the reference (the same process then asks the
fix's probe whether this CPU's kernels have the bug); ``mirrorkit run --simulate-cpus 2``
and ``mirrorkit launch -n 2 -- mirrorkit run`` must give the same outputs
(same shapes, values within 1e-6). With the two fixes disabled, the upstream
failures are asserted, so the day upstream fixes them the fixes can go.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, clean_env

SCRIPT = REPO / "tests" / "fixtures" / "scripts" / "predict_evaluate_small.py"
RUN = [sys.executable, "-m", "mirrorkit", "run", "--simulate-cpus", "2", str(SCRIPT)]
LAUNCH = [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--", "mirrorkit", "run",
          str(SCRIPT)]
OFF = "empty-conv,predict-on-batch"
# The plain run: the script as `python SCRIPT` runs it (its folder first on the
# path), then, after it, the fix's own probe of this CPU's convolution kernels
# (what conftest.conv_mis_shapes_empty_batches asks a process of its own).
PLAIN = [sys.executable, "-c", textwrap.dedent(f"""
    import runpy, sys
    sys.path[0] = {str(SCRIPT.parent)!r}
    runpy.run_path({str(SCRIPT)!r}, run_name="__main__")
    from mirrorkit.compat import empty_conv
    print("KERNEL_IS_BROKEN", empty_conv._kernel_is_broken())
""")]


def _results(command: list[str], cwd: Path, **env: str) -> dict[str, dict]:
    return _run(command, cwd, **env)[0]


def _run(command: list[str], cwd: Path, **env: str) -> tuple[dict[str, dict], str]:
    cwd.mkdir()
    proc = subprocess.run(command, cwd=str(cwd), env=clean_env(**env), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(cwd.glob("predict_evaluate*.json"))
    return {p.name: json.loads(p.read_text()) for p in files}, proc.stdout


def _assert_same(reference: dict, got: dict) -> None:
    assert set(got) == set(reference)
    for key, want in reference.items():
        if key == "replicas":
            continue
        have = got[key]
        assert not isinstance(have, str), f"{key}: {have}"
        if isinstance(want, dict):
            assert have.keys() == want.keys(), key
            for metric in want:
                assert have[metric] == pytest.approx(want[metric], rel=1e-6, abs=1e-6), key
        else:
            assert np.shape(have) == np.shape(want), key   # no padding rows, no copies
            np.testing.assert_allclose(have, want, rtol=1e-6, atol=1e-6, err_msg=key)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The plain run's results, and whether this CPU mis-shapes empty batches.

    The second: does this CPU show TensorFlow's oneDNN empty-batch convolution
    bug? (the fix's own probe, asked by the plain run's process)
    """
    results, stdout = _run(PLAIN, tmp_path_factory.mktemp("ref") / "plain")
    (out,) = results.values()
    assert out["replicas"] == 1 and not any(isinstance(v, str) for v in out.values())
    (probe,) = [line.split()[1] for line in stdout.splitlines()
                if line.startswith("KERNEL_IS_BROKEN ")]
    return out, probe == "True"


def test_two_local_replicas_match_one_device_and_fail_without_the_fixes(plain, tmp_path):
    reference, kernel_is_broken = plain
    (fixed,) = _results(RUN, tmp_path / "fixed").values()
    assert fixed["replicas"] == 2
    _assert_same(reference, fixed)

    (broken,) = _results(RUN, tmp_path / "broken", MIRRORKIT_COMPAT_DISABLE=OFF).values()
    empty_replica = ("predict/one_image", "predict/33_by_32_dataset", "evaluate/one_image",
                     "evaluate/33_by_32", "evaluate/one_dataset")
    if kernel_is_broken:
        # TF's oneDNN convolution returns its input for the empty replica's batch.
        for key in empty_replica:
            assert "Incompatible shapes" in broken[key], (key, broken[key])
    else:
        # This CPU's kernels (oneDNN picks them by instruction set: none of the
        # AVX2/AVX-512 ones here) shape empty batches right, so the upstream
        # failure cannot show; the fix's probe then guards nothing.
        _assert_same({k: reference[k] for k in empty_replica},
                     {k: broken[k] for k in empty_replica})
    # keras: predict_on_batch returns one copy of the batch per replica.
    assert np.shape(broken["predict/on_batch_three"]) == (6, 10)
    # Batches that leave no replica empty work without the fix.
    assert not isinstance(broken["evaluate/35_by_4"], str)


@pytest.mark.slow
def test_two_launched_workers_match_one_device(plain, tmp_path):
    reference, _ = plain
    outs = _results(LAUNCH, tmp_path / "launch")
    assert sorted(outs) == ["predict_evaluate-worker0.json", "predict_evaluate-worker1.json"]
    for out in outs.values():
        assert out["replicas"] == 2
        _assert_same(reference, out)


def test_single_device_graphs_are_upstream_s(run_python):
    # One replica: no guard is traced, predict_on_batch is untouched.
    proc = run_python("""
        import numpy as np, keras
        from mirrorkit import compat
        EMPTY_CONV = compat.FIXES["empty-conv"]
        print(compat.apply()["empty-conv"], EMPTY_CONV.is_applied())
        model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3),
                                  keras.layers.BatchNormalization()])
        model.predict(np.zeros((2, 8, 8, 3)), verbose=0)
        from mirrorkit.patching import engine
        print(engine.patched_by(model.predict_function) == "empty-conv")
        print(model.predict_on_batch(np.zeros((3, 8, 8, 3))).shape)
        compat.revert()
        print(EMPTY_CONV.is_applied())
    """)
    assert proc.stdout.split() == ["applied", "True", "False", "(3,", "6,", "6,", "4)", "False"]


def _keras_fetches_one_step_outside_a_function() -> bool:
    from mirrorkit.compat.multistep import _one_step_outside_a_function

    return _one_step_outside_a_function()


@pytest.mark.skipif(not _keras_fetches_one_step_outside_a_function(),
                    reason="Keras before 3.16 fetches each step's batch inside its function")
def test_keras_316s_one_step_path_logs_a_nan_loss_for_an_empty_replica_without_multi_step(
        plain, tmp_path):
    # The multi-step fix's control on Keras 3.16: steps_per_execution=1 there fetches the
    # batch in Python, and an empty replica's share makes evaluate's loss NaN.
    reference, _ = plain
    (broken,) = _results(RUN, tmp_path / "no-multi-step",
                         MIRRORKIT_COMPAT_DISABLE="multi-step").values()
    assert np.isnan(broken["evaluate/one_image"]["loss"]), broken["evaluate/one_image"]
    assert not np.isnan(reference["evaluate/one_image"]["loss"])
