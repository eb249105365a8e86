"""A loss divided by the batch's own count trains as on one device.

``tests/fixtures/masked_losses.py`` trains three models whose loss Keras
divides by a count of the batch (``masked-loss-means``): valid steps of padded
sequences behind ``Embedding(mask_zero=True)``, pixels not ignored by
``ignore_class``, and the sum of sample weights
(``reduction="mean_with_sample_weight"``); and a fourth whose custom
``train_step`` divides by the mask's sum by hand (``hand-mean-gradients`` and
``logged-step-losses`` read it as a ratio of two sums over the rows). Each
batch's halves hold very different counts, and the last batch of the
sequences splits unevenly. Under ``mirrorkit run`` (2 replicas) and
``mirrorkit launch`` (2 workers) the losses, logs, ``evaluate`` and every
weight equal plain Python's (a replica dividing by its own count, as upstream
and as a mean over the rows, left the weights 4-34 % off); with the fixes off
by name each replica divides by its own count again. On Keras 3.16's
nightlies an RNN layer consumes its input's mask without passing it on
(``supports_masking=False``), so the tagger's loss is a plain mean there: no
count of the replica's own, so with the fixes off it trains as plain Python
(the ``ignore_class`` model still brings a mask to the same reduction).
"""

from __future__ import annotations

import pytest
from conftest import REPO, compare_jobs, run_jobs

from mirrorkit.patching import targets

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "fixtures" / "masked_losses.py"
JOBS = compare_jobs(SCRIPT, off={
    "MIRRORKIT_COMPAT_DISABLE": "masked-loss-means,hand-mean-gradients"})
MODELS = ("tagger", "ignored", "weighted", "by_hand")
# Keras whose RNN layers no longer pass the Embedding's mask on to the output (measured:
# keras 3.15.1 passes it, keras-nightly 3.16.0.dev2026102704 does not).
RNN_MASK_DROPPED = "keras>=3.16.0.dev0"


def _off_by(result: dict, plain: dict) -> dict[str, float]:
    """The largest difference of each kind, relative to plain Python's largest value."""
    def rel(a: list[float], b: list[float]) -> float:
        return max(abs(x - y) for x, y in zip(a, b)) / max(map(abs, b))
    off = {"loss": rel(result["loss"], plain["loss"]),
           "weights": rel(result["weights"], plain["weights"])}
    if plain["evaluate"]:
        off["evaluate"] = rel(list(result["evaluate"].values()),
                              list(plain["evaluate"].values()))
    return off


def test_masked_weight_mean_and_hand_masked_losses_match_plain_python_under_run_and_launch(
        tmp_path):
    found = run_jobs(JOBS, tmp_path)
    plain = found["plain"][0]
    assert len(found["launch"]) == 2
    # Measured: at most 2.1e-7 (float32 sums in another order).
    for result in (found["run"][0], *found["launch"]):
        for model in MODELS:
            off = _off_by(result[model], plain[model])
            assert max(off.values()) < 2e-6, (model, off)
    # The tagger's loss is masked exactly where Keras's RNN layers pass the mask on.
    tagger_masked = not targets.applies(RNN_MASK_DROPPED)
    masked = [result["tagger"]["masked"] for results in found.values() for result in results]
    assert masked == [tagger_masked] * len(masked), masked
    # The control: each replica divides by its own count (measured 10 %, 4.5 %, 34 %, 11 %).
    for model in MODELS:
        off = _off_by(found["off"][0][model], plain[model])
        if model == "tagger" and not tagger_masked:
            # A plain mean: nothing to divide by a count, with the fixes off too.
            assert max(off.values()) < 2e-6, (model, off)
        else:
            assert off["weights"] > 0.01, (model, off)
