"""Fine-tuning a pretrained backbone (``--weights``): real TensorFlow, offline, tiny models.

One fresh process trains MobileNet(alpha=0.25) at 32x32 from a backbone
file on 2 simulated devices: phase 1 must leave every backbone array as
the file had it (BatchNormalization statistics included), phase 2 must
change the trainable ones and still leave the statistics alone; an
interrupt in phase 2 and ``resume`` continue in phase 2. A second process
(``mirrorkit train`` through click) checks that a weights file that does
not fit, and a failed ImageNet download, are one line each. A third runs
under ``mirrorkit launch -n 2``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import clean_env, result_line

from mirrorkit.training.events import read_events

pytestmark = pytest.mark.slow

_TRAIN = """
import json, numpy as np, keras
import mirrorkit
from mirrorkit.training import TrainConfig, train

mirrorkit.get_strategy(simulate_cpus=2)  # before any TensorFlow op
from mirrorkit.training.backbones import APPLICATIONS, make_backbone

backbone = make_backbone(APPLICATIONS["mobilenet_025"], (32, 32))
# "Pretrained" statistics: one training-mode pass with momentum 0 sets every
# BatchNormalization's moving mean and variance to its inputs' (random
# weights with the initial 0/1 statistics saturate ReLU6: no gradient at all).
norms = [l for l in backbone.layers if isinstance(l, keras.layers.BatchNormalization)]
for layer in norms:
    layer.momentum = 0.0
backbone(np.random.default_rng(0).uniform(-1, 1, (64, 32, 32, 3)).astype("float32"),
         training=True)
for layer in norms:
    layer.momentum = 0.99
backbone.save_weights("backbone.weights.h5")
start = [w.numpy().copy() for w in backbone.weights]
in_bn = {id(w) for l in norms for w in l.weights}
stats = [id(w) in in_bn for w in backbone.weights]   # gamma, beta, moving mean/variance
snaps = {}

class Probe(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        snaps[epoch] = [w.numpy().copy() for w in self.model.get_layer("backbone").weights]
        if epoch == 1:
            raise KeyboardInterrupt  # after the epoch-2 backup: mid phase 2

def compare(epoch):
    same = [bool(np.array_equal(a, b)) for a, b in zip(start, snaps[epoch])]
    return {"bn_same": all(s for s, st in zip(same, stats) if st),
            "trainable_changed": sum(not s for s, st in zip(same, stats) if not st),
            "trainable": sum(not st for st in stats), "all_same": all(same)}

config = dict(dataset="synthetic", model="mobilenet_025", weights="backbone.weights.h5",
              epochs=3, head_epochs=1, simulate_cpus=2, per_replica_batch=16, output="run")
from mirrorkit.datasets import DataOptions
config["data"] = DataOptions(classes=3, examples=96)
lines = []
try:
    train(TrainConfig(**config), callbacks=[Probe()], echo=lines.append)
except KeyboardInterrupt:
    pass
result = train(TrainConfig(**config, resume=True), echo=lines.append)
model = result.model
spread = 0.0
for w in model.weights:
    copies = [v.numpy() for v in getattr(w.value, "values", [w.value])]
    spread = max([spread] + [float(np.abs(c - copies[0]).max()) for c in copies])
bn = [l for l in model.get_layer("backbone").layers
      if isinstance(l, keras.layers.BatchNormalization)]
import warnings
with warnings.catch_warnings():
    warnings.simplefilter("error")  # e.g. "Skipping variable loading for optimizer"
    reloaded = keras.models.load_model("run/model.keras")
same_optimizer = len(reloaded.optimizer.variables) == len(model.optimizer.variables)
print("RESULT " + json.dumps({
    "after_phase1": compare(0), "after_phase2": compare(1), "lines": lines,
    "replicas": result.runtime.replicas, "replica_spread": spread,
    "fine_tune": result.metrics["fine_tune"], "initial_epoch": result.metrics["initial_epoch"],
    "bn_frozen": not any(l.trainable for l in bn), "bn_layers": len(bn),
    "reloads_with_its_optimizer": same_optimizer}))
"""


@pytest.fixture(scope="module")
def two_phases(tmp_path_factory):
    folder = tmp_path_factory.mktemp("finetune")
    script = folder / "finetune.py"
    script.write_text(_TRAIN)
    proc = subprocess.run([sys.executable, str(script)], cwd=folder, env=clean_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return result_line(proc.stdout), folder / "run"


def test_phase1_freezes_the_backbone_and_its_batchnorm_statistics(two_phases):
    result, _ = two_phases
    assert result["after_phase1"]["all_same"], result["after_phase1"]


def test_phase2_trains_the_backbone_with_batchnorm_in_inference_mode(two_phases):
    result, _ = two_phases
    after = result["after_phase2"]
    assert after["bn_same"], after   # frozen: inference mode, gamma and beta kept
    assert result["bn_frozen"] and result["bn_layers"] == 27
    assert after["trainable_changed"] == after["trainable"] == 27, after  # every conv kernel


def test_each_phase_start_is_one_line_one_event_and_recorded_per_epoch(two_phases):
    result, out = two_phases
    starts = [line for line in result["lines"] if line.startswith("phase ")]
    assert len(starts) == 3, result["lines"]  # phase 1, phase 2, and phase 2 again on resume
    assert starts[0].startswith("phase 1/2  head only: backbone frozen") and "epochs 1-1" in starts[0]
    assert starts[1].startswith("phase 2/2  fine-tune: whole model unfrozen") and \
        "epochs 2-3" in starts[1]
    assert starts[2] == starts[1]
    events = [e for e in read_events(out / "events.jsonl") if e["event"] == "phase_start"]
    assert [e["phase"] for e in events] == [1, 2, 2]
    assert events[0]["trainable_params"] < events[1]["trainable_params"]
    assert events[1]["learning_rate"] == pytest.approx(events[0]["learning_rate"] / 10)


def test_a_resumed_run_in_phase2_stays_in_phase2(two_phases):
    result, out = two_phases
    fine_tune = result["fine_tune"]
    assert result["initial_epoch"] == 2
    assert [p["phase"] for p in fine_tune["phases"]] == [2]
    assert [(r["epoch"], r["phase"]) for r in fine_tune["epochs"]] == [(3, 2)]
    assert result["reloads_with_its_optimizer"]  # model.keras: no optimizer state skipped
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["fine_tune"]["head_epochs"] == 1
    assert metrics["fine_tune"]["weights"] == "backbone.weights.h5"


def test_two_replicas_hold_identical_weights(two_phases):
    result, _ = two_phases
    assert result["replicas"] == 2
    assert result["replica_spread"] == 0.0


_ERRORS = """
import json, keras
from click.testing import CliRunner
from mirrorkit.cli import cli

tiny = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)], name="tiny")
tiny.save_weights("tiny.weights.h5")
tiny.save("tiny.keras")
common = ["train", "--dataset", "synthetic", "--examples", "64", "--classes", "2",
          "--model", "mobilenet_025", "--epochs", "1"]
out = {}
for case, weights in [("h5", "tiny.weights.h5"), ("keras", "tiny.keras"),
                      ("imagenet", "imagenet"), ("missing", "nope.weights.h5")]:
    r = CliRunner().invoke(cli, common + ["--weights", weights, "--output", "run-" + case])
    out[case] = {"code": r.exit_code, "output": r.output, "stderr": r.stderr}
r = CliRunner().invoke(cli, ["train", "--model", "cnn", "--weights", "imagenet"])
out["cnn"] = {"code": r.exit_code, "output": r.output, "stderr": r.stderr}
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def errors(tmp_path_factory):
    folder = tmp_path_factory.mktemp("finetune-errors")
    (folder / "keras-home").mkdir()
    script = folder / "errors.py"
    script.write_text(_ERRORS)
    # An empty Keras cache: the ImageNet weights must be downloaded, and the
    # machine is offline (as CI may be: the test only needs the failure).
    env = clean_env(KERAS_HOME=str(folder / "keras-home"), HTTPS_PROXY="http://127.0.0.1:9",
                    https_proxy="http://127.0.0.1:9")
    proc = subprocess.run([sys.executable, str(script)], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return result_line(proc.stdout)


def _one_line(case: dict) -> str:
    # stdout may hold Keras's own "Downloading data from URL" before the error.
    assert case["code"] == 1, case
    lines = [line for line in case["stderr"].splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in case["output"], case["output"]
    return lines[0]


def test_a_weights_file_that_does_not_fit_is_one_line(errors):
    line = _one_line(errors["h5"])
    assert line.startswith("Error: --weights tiny.weights.h5 does not fit mobilenet_025: "
                           "expected the 135 arrays (218,544 values) of "
                           "keras.applications.MobileNet(alpha=0.25) without its top for "
                           "32x32x3 images; found 2 arrays (10 values)"), line
    line = _one_line(errors["keras"])
    assert "does not fit mobilenet_025: expected a model or sub-model with the 135 arrays" in line
    assert "found 'tiny': 2 arrays, 10 values" in line
    line = _one_line(errors["missing"])
    assert "does not exist. Received: weights='nope.weights.h5'" in line


def test_a_failed_imagenet_download_is_one_line(errors):
    line = _one_line(errors["imagenet"])
    assert line.startswith("Error: could not download the imagenet weights of mobilenet_025 "
                           "from https://storage.googleapis.com/"), line
    assert line.endswith("; pass --weights PATH of a local file"), line


def test_weights_need_a_keras_applications_model(errors):
    line = _one_line(errors["cnn"])
    assert "'cnn' has no pretrained backbone. Received: model='cnn'" in line


_LAUNCHED = """
import os, sys, keras
from mirrorkit.datasets import DataOptions
from mirrorkit.training import TrainConfig, train

class DieInPhase2(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        # After the epoch-2 backup, first attempt only: the launcher restarts the group.
        if epoch == 1 and os.environ.get("MIRRORKIT_RESTART_COUNT", "0") == "0":
            os._exit(17)

train(TrainConfig(dataset="synthetic", data=DataOptions(classes=3, examples=96),
                  model="mobilenet_025", weights=sys.argv[1], epochs=3, head_epochs=1,
                  per_replica_batch=16, output=sys.argv[2]),
      callbacks=[DieInPhase2()], echo=print)
"""


def test_two_workers_restarted_in_phase2_resume_in_phase2_in_sync(two_phases, tmp_path):
    """mirrorkit launch -n 2: both workers agree on the chief's backup epoch and its phase."""
    _, first = two_phases
    script = tmp_path / "launched.py"
    script.write_text(_LAUNCHED)
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--max-restarts", "1", "--",
         sys.executable, str(script), str(first.parent / "backbone.weights.h5"), str(out)],
        cwd=str(tmp_path), env=clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["workers"], metrics["replicas"], metrics["initial_epoch"]) == (2, 2, 2)
    assert [p["phase"] for p in metrics["fine_tune"]["phases"]] == [2]
    assert [(r["epoch"], r["phase"]) for r in metrics["fine_tune"]["epochs"]] == [(3, 2)]
    assert metrics["weights_in_sync"]["identical"], metrics["weights_in_sync"]
    events = read_events(out / "events.jsonl")
    assert [e["phase"] for e in events if e["event"] == "phase_start"] == [1, 2, 2]
    assert [e["event"] for e in events].count("restart") == 1
