"""A backup save stopped between its file moves and its manifest's rename.

``backup_manifest.commit`` writes the new manifest to ``.partial-manifest.json``
before it moves the new weights and metadata into place, and renames it last.
A writer killed between the moves and that rename (seen in CI: an elastic job
whose chief was killed just after epoch 1's save) leaves complete, durable
files that only the pending manifest describes. The resume must take them and
finish the save, not refuse the run. Real files, no TensorFlow: the folder is
left exactly as such a kill leaves it.
"""

from __future__ import annotations

import json
import os

import pytest

from mirrorkit.training import backup_manifest as bm

pytestmark = pytest.mark.fast


def _written(folder, epoch: int) -> dict:
    weights = folder / f".partial-{bm.WEIGHTS}"
    weights.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes([epoch]) * 64)
    metadata = folder / f".partial-{bm.METADATA}"
    metadata.write_text(bm.metadata_text(epoch, 0))
    return {bm.WEIGHTS: weights, bm.METADATA: metadata}


def _stopped_before_the_manifest(folder, epoch: int) -> None:
    """What ``commit`` leaves when its process dies right before the last rename."""
    written = _written(folder, epoch)
    real_replace = os.replace

    class Killed(BaseException):
        pass

    def replace(src, dst):
        if str(src).endswith(bm.PENDING):
            raise Killed   # the process is gone: nothing after this line runs
        real_replace(src, dst)

    os.replace = replace
    try:
        with pytest.raises(Killed):
            bm.commit(folder, written, epoch=epoch, batch=0)
    finally:
        os.replace = real_replace


@pytest.mark.parametrize("before", [0, 1], ids=["first-save", "second-save"])
def test_a_save_stopped_before_its_manifest_rename_is_finished_by_the_resume(tmp_path, before):
    folder = tmp_path / "backup"
    folder.mkdir()
    if before:
        bm.commit(folder, _written(folder, 1), epoch=1, batch=0)
    _stopped_before_the_manifest(folder, before + 1)
    # The state a kill leaves: new files in place, the manifest old (or none) and pending.
    assert (folder / bm.PENDING).is_file()
    assert json.loads((folder / bm.METADATA).read_text())["epoch"] == before + 1

    backup = bm.choose(folder)
    assert backup is not None and backup.epoch == before + 1 and backup.checked == "manifest"
    assert not (folder / bm.PENDING).exists()
    assert json.loads((folder / bm.MANIFEST).read_text())["epoch"] == before + 1
    # A later save keeps it as the previous backup, as any finished one.
    bm.commit(folder, _written(folder, before + 2), epoch=before + 2, batch=0)
    assert bm.verify(folder / bm.PREVIOUS, legacy=False).epoch == before + 1


def test_a_pending_manifest_never_vouches_for_files_it_does_not_describe(tmp_path):
    folder = tmp_path / "backup"
    folder.mkdir()
    bm.commit(folder, _written(folder, 1), epoch=1, batch=0)
    _stopped_before_the_manifest(folder, 2)
    (folder / bm.WEIGHTS).write_bytes(b"truncated")   # damaged after the kill
    with pytest.raises(bm.BackupDamaged, match="latest.weights.h5 is 9 bytes"):
        bm.choose(folder)
    assert (folder / bm.PENDING).is_file()   # nothing was changed
