"""mirrorkit.callbacks in one process: the chief behaves exactly like Keras.

The non-chief side (temporary directories, the chief's state sent to the
others on resume) needs real workers: tests/compat/test_multi_worker.py.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest

keras = pytest.importorskip("keras")
np = pytest.importorskip("numpy")

from mirrorkit.training import callbacks as mk
from mirrorkit.training.chief import Scratch  # noqa: E402


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    """Point tempfile at an empty directory so leftovers can be seen."""
    path = tmp_path / "systmp"
    path.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(path))
    return path


def _data():
    x = np.random.RandomState(0).rand(64, 6).astype("float32")
    y = np.random.RandomState(1).randint(0, 3, 64)
    return x, y


def _model():
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    model.compile(keras.optimizers.SGD(0.1, momentum=0.9),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class _StopAt(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise RuntimeError("interrupted")


def test_single_process_is_the_chief():
    import tensorflow as tf

    assert mk.is_chief() and mk.is_chief(tf.distribute.get_strategy())
    assert mk.is_chief(_model())


def test_chief_writes_the_real_paths_and_no_temporary_dirs(tmp_path, private_tmp):
    x, y = _data()
    model = _model()
    cbs = [mk.BackupAndRestore(str(tmp_path / "backup"), delete_checkpoint=False),
           mk.ModelCheckpoint(str(tmp_path / "ckpt" / "e{epoch}.weights.h5"),
                              save_weights_only=True),
           mk.TensorBoard(str(tmp_path / "logs"))]
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, callbacks=cbs, shuffle=False)
    # The backup of epoch 2, its manifest, and epoch 1's kept until it was complete.
    assert sorted(os.listdir(tmp_path / "backup")) == ["latest.weights.h5", "manifest.json",
                                                       "previous", "training_metadata.json"]
    assert json.loads((tmp_path / "backup" / "training_metadata.json").read_text())["epoch"] == 2
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["e1.weights.h5", "e2.weights.h5"]
    assert os.listdir(tmp_path / "logs") == ["train"]
    assert not [p for p in os.listdir(private_tmp) if p.startswith("mirrorkit-")]


def test_resume_continues_after_the_last_completed_epoch(tmp_path):
    x, y = _data()
    backup = str(tmp_path / "backup")
    reference = _model()
    reference.fit(x, y, batch_size=16, epochs=4, verbose=0, shuffle=False)

    model = _model()
    with pytest.raises(RuntimeError, match="interrupted"):
        model.fit(x, y, batch_size=16, epochs=4, verbose=0, shuffle=False,
                  callbacks=[mk.BackupAndRestore(backup), _StopAt(2)])
    restarted = _model()  # a new process would build a fresh model
    history = restarted.fit(x, y, batch_size=16, epochs=4, verbose=0, shuffle=False,
                            callbacks=[mk.BackupAndRestore(backup)])
    assert len(history.history["loss"]) == 2  # epochs 3 and 4 only
    assert not os.path.exists(backup)  # deleted after a completed fit, as in Keras
    for got, want in zip(restarted.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, atol=1e-6)


def test_a_worker_killed_while_saving_leaves_the_previous_backup_readable(tmp_path):
    x, y = _data()
    backup = tmp_path / "backup"

    class DiesWhileSaving(keras.callbacks.Callback):
        """At the 2nd backup, the weights file is half written when the process dies."""

        def on_epoch_end(self, epoch, logs=None):
            if epoch == 1:
                real = self.model.save_weights

                def half_written(filepath, overwrite=True):
                    with open(filepath, "wb") as f:
                        f.write(b"\x89HDF\r\n\x1a\n" + b"\0" * 100)
                    raise KeyboardInterrupt("killed mid-write")

                self.model.save_weights = half_written
                self._real = real

    model = _model()
    with pytest.raises(KeyboardInterrupt):
        model.fit(x, y, batch_size=16, epochs=4, verbose=0, shuffle=False,
                  callbacks=[DiesWhileSaving(), mk.BackupAndRestore(str(backup))])
    restarted = _model()
    history = restarted.fit(x, y, batch_size=16, epochs=4, verbose=0, shuffle=False,
                            callbacks=[mk.BackupAndRestore(str(backup))])
    assert len(history.history["loss"]) == 3  # the epoch-1 backup was intact: epochs 2-4


@pytest.mark.parametrize("name", ["final.keras", "final.weights.h5"])
def test_save_model_on_the_chief(tmp_path, private_tmp, name):
    x, y = _data()
    model = _model()
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    path = tmp_path / "out" / name
    assert mk.save_model(model, path) is True
    assert path.is_file()
    if name.endswith(".keras"):
        loaded = keras.models.load_model(path)
        np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
    assert not os.listdir(private_tmp)


def test_scratch_dirs_are_private_and_stale_ones_are_removed(tmp_path, private_tmp):
    real = str(tmp_path / "backup")
    first = Scratch("backup", real, "worker1")
    killed = first.get()
    # Kept referenced: a scratch dir also goes when its owner is collected.
    others = [Scratch("backup", real, "worker10"), Scratch("backup", real, "worker2"),
              Scratch("backup", str(tmp_path / "elsewhere"), "worker1")]
    other_dirs = [o.get() for o in others]
    # The same task's next start (a new process) removes what a killed run left.
    restarted = Scratch("backup", real, "worker1")
    fresh = restarted.get()
    assert not os.path.exists(killed) and os.path.isdir(fresh)
    assert all(os.path.isdir(d) for d in other_dirs)
    open(os.path.join(fresh, "f"), "w").close()
    restarted.clear()
    assert os.listdir(fresh) == []
    restarted.remove()
    assert not os.path.exists(fresh)
    del others
    assert not [d for d in other_dirs if os.path.exists(d)]


def test_constructor_arguments_match_keras():
    import inspect

    for ours, theirs in [(mk.BackupAndRestore, keras.callbacks.BackupAndRestore),
                         (mk.ModelCheckpoint, keras.callbacks.ModelCheckpoint)]:
        assert (list(inspect.signature(ours).parameters)
                == list(inspect.signature(theirs).parameters))
    with pytest.raises(ValueError, match="Empty `backup_dir`"):
        mk.BackupAndRestore("")
    with pytest.raises(ValueError, match=".keras"):
        mk.ModelCheckpoint("model.txt")


def _scalar_tags(log_dir):
    import tensorflow as tf

    tags = set()
    for path in sorted(log_dir.rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags.update(value.tag for value in event.summary.value)
    return tags


@pytest.mark.parametrize("update_freq", ["epoch", 1])
def test_tensorboard_records_what_update_freq_asks(tmp_path, update_freq):
    # At "epoch" mirrorkit skips Keras's per-batch summary calls (nothing is
    # recorded there anyway); per-batch logging must still work when asked.
    x, y = _data()
    model = _model()
    board = mk.TensorBoard(str(tmp_path / "logs"), update_freq=update_freq)
    calls = []

    class Counting:  # the tf.summary module Keras calls, counting batch scalars
        def __getattr__(self, name):
            return getattr(board_summary, name)

        def scalar(self, name, *args, **kwargs):
            calls.append(name)
            return board_summary.scalar(name, *args, **kwargs)

    board_summary, board._summary_module = board.summary, Counting()
    model.fit(x, y, batch_size=16, epochs=2, verbose=0, shuffle=False, callbacks=[board])
    tags = _scalar_tags(tmp_path / "logs")
    assert {"epoch_loss", "epoch_learning_rate"} <= tags, tags
    per_batch = [name for name in calls if name.startswith("batch_")]
    if update_freq == "epoch":
        assert "batch_loss" not in tags and per_batch == []
    else:
        assert "batch_loss" in tags and len(per_batch) >= 8   # 4 steps x 2 epochs


def test_checkpoint_waits_at_every_save_point_whatever_save_best_only_decides(tmp_path):
    # Multi-worker, the wait after a save is an all-reduce every worker must
    # enter: it may follow the save points (epoch ends, or every save_freq
    # batches: the same everywhere), never save_best_only's decision. Here
    # mode="max" on a falling loss writes at the first epoch only; the
    # stand-in wait (a counter) must still run at every save point.
    # (Keras 3.15 itself fails save_best_only with an integer save_freq
    # before the first epoch ends: monitor_op is still None.)
    x, y = _data()
    model = _model()
    writes, waits = [], {"best": [], "batches": []}
    real_save = model.save

    def save(filepath, **kwargs):
        writes.append((os.path.basename(filepath), mk.checkpoint_waits_after()))
        return real_save(filepath, **kwargs)

    model.save = save
    best = mk.ModelCheckpoint(str(tmp_path / "best.keras"), monitor="loss", mode="max",
                              save_best_only=True)
    batches = mk.ModelCheckpoint(str(tmp_path / "b.keras"), save_freq=2)
    for name, cb in (("best", best), ("batches", batches)):
        cb._after_save = lambda w=waits[name]: w.append(mk.checkpoint_waits_after())
    model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[best, batches],
              shuffle=False)
    # 3 epoch ends; 4 batches a epoch, every 2nd: 6; each wait after its save.
    assert waits == {"best": [False] * 3, "batches": [False] * 6}
    assert writes.count(("best.keras", True)) == 1      # decided once to write, 3 waits
    assert writes.count(("b.keras", True)) == 6         # Model.save leaves its wait to us
    assert len(writes) == 7 and not mk.checkpoint_waits_after()
    one_process = mk.ModelCheckpoint(str(tmp_path / "e{epoch}.keras"))
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, callbacks=[one_process])
    assert one_process._after_save is None        # no cluster: nothing to wait for
