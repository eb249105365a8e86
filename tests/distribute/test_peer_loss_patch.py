"""Control of the ``lost-peer-report`` patch: with it off, a lost peer is TensorFlow's traceback.

With the patch on, tests/distribute/test_peer_loss.py shows the one line that
replaces the traceback; here the same dying worker is run with the patch
turned off by name and gets Python's own hook back.
"""

from __future__ import annotations

import subprocess
import sys

from conftest import clean_env

FROZEN = ("Collective ops is aborted by: The following tasks are unhealthy (stopped sending "
          "heartbeats):\n/job:worker/replica:0/task:1\nThe error could be from a previous "
          "operation.")
TF_CONFIG = ('{"cluster": {"worker": ["hosta:23400", "hostb:23400"]}, '
             '"task": {"type": "worker", "index": 0}}')
CODE = (
    "import sys, tensorflow as tf\n"
    "from mirrorkit.distribute import peer_loss\n"
    "from mirrorkit.patching import engine\n"
    "peer_loss.install(heartbeat_timeout=10)\n"
    "import keras\n"
    "peer_loss.track_progress()\n"
    "from keras.src.callbacks.callback_list import CallbackList\n"
    "print(engine.patched_by(sys.excepthook), engine.patched_by(CallbackList.on_epoch_end))\n"
    f"raise tf.errors.UnavailableError(None, None, {FROZEN!r})\n")


def _dying_worker(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                          env=clean_env(TF_CONFIG=TF_CONFIG, **env), timeout=120)


def test_lost_peer_report_off_by_name_leaves_the_traceback():
    on = _dying_worker()
    assert on.stdout.split() == ["lost-peer-report", "lost-peer-report"], on.stdout
    assert "Traceback" not in on.stderr
    assert on.stderr.strip().splitlines()[-1].startswith("mirrorkit: lost peer worker 1")

    off = _dying_worker(MIRRORKIT_COMPAT_DISABLE="lost-peer-report")
    assert off.stdout.split() == ["None", "None"], off.stdout
    assert "Traceback" in off.stderr and "mirrorkit: lost peer" not in off.stderr
    assert off.returncode == on.returncode == 1
