"""Controls of ``backup-paths`` and ``saving-skipset-cache``, in one process.

``backup-paths``: mirrorkit's BackupAndRestore points a non-chief worker's
backup at a private folder; turned off by name it keeps Keras's own paths (two
workers then write one backup: BlockingIOError, shown for the stock callback in
tests/runner/test_chief_saving.py).

``saving-skipset-cache``: Keras's ``get_attr_skipset`` never hits its cache
(it reads one key and stores another), so every call builds a new set and a
throw-away Optimizer (a collective under MultiWorkerMirroredStrategy).
"""

from __future__ import annotations

import pytest

from mirrorkit import _env
from mirrorkit.callbacks import BackupAndRestore
from mirrorkit.compat.saving_cache import share_saving_references
from mirrorkit.patching import engine


def test_backup_paths_points_elsewhere_and_off_by_name_keeps_kerass(tmp_path):
    real, private = tmp_path / "real", tmp_path / "private"
    cb = BackupAndRestore(str(real))
    cb._point_at(str(private))
    assert cb._weights_path.startswith(str(private)) and cb.backup_dir == str(private)

    cb = BackupAndRestore(str(real))
    with _env.patch({_env.COMPAT_DISABLE: "backup-paths"}):
        cb._point_at(str(private))
    assert cb._weights_path.startswith(str(real)) and cb.backup_dir == str(real)


@pytest.fixture
def keras_saving():
    from keras.src.saving import saving_lib

    engine.undo("saving-skipset-cache")
    yield saving_lib
    engine.undo("saving-skipset-cache")


def test_saving_skipset_cache_and_the_upstream_bug_with_it_off(keras_saving):
    import tensorflow as tf

    with _env.patch({_env.COMPAT_DISABLE: "saving-skipset-cache"}):
        share_saving_references(tf.distribute.get_strategy())
    # Off: Keras's own function, whose cache never hits (a new set per call).
    assert engine.patched_by(keras_saving.get_attr_skipset) is None
    assert keras_saving.get_attr_skipset("Optimizer") is not \
        keras_saving.get_attr_skipset("Optimizer")

    share_saving_references(tf.distribute.get_strategy())
    assert engine.patched_by(keras_saving.get_attr_skipset) == "saving-skipset-cache"
    first = keras_saving.get_attr_skipset("Optimizer")
    assert keras_saving.get_attr_skipset("Optimizer") is first
    assert "variables" in first or len(first) > 0
