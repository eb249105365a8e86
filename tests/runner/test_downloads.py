"""Under ``mirrorkit launch``, ``keras.utils.get_file`` downloads one worker at a time.

Two workers of a script that downloads and extracts an archive
(``file://`` origin: a real ``urlretrieve``) into one cache folder: while
the test holds the destination's lock, neither worker may write there;
released, both finish with the same intact extracted file.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tarfile
import time
from types import SimpleNamespace

import numpy as np
from conftest import clean_env

from mirrorkit.patching import engine
from mirrorkit.runner import downloads

SCRIPT = """
import os
import keras
path = keras.utils.get_file("data.tar.gz", origin=os.environ["ORIGIN"], extract=True,
                            cache_dir=os.environ["CACHE"])
print("PATH", path, flush=True)
"""


def _waiting_for(lock) -> int:
    """How many processes wait for the ``flock`` held on ``lock`` (``/proc/locks``' "->" lines)."""
    inode = f":{os.fstat(lock.fileno()).st_ino} "
    with open("/proc/locks") as locks:
        return sum(1 for line in locks if " -> FLOCK " in line and inode in line)


def test_workers_download_one_at_a_time_into_one_cache(tmp_path):
    data = tmp_path / "data.npz"
    np.savez(data, x=np.arange(200_000, dtype="float32"))
    archive = tmp_path / "data.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(data, arcname="data/data.npz")
    cache = tmp_path / "cache"
    cache.mkdir()
    script = tmp_path / "fetch.py"
    script.write_text(SCRIPT)
    origin = f"file://{archive}"
    log = tmp_path / "launch.log"

    with open(downloads.lock_path("data.tar.gz", origin=origin, cache_dir=str(cache)),
              "a+") as lock, open(log, "w") as out:
        fcntl.flock(lock, fcntl.LOCK_EX)
        proc = subprocess.Popen(
            [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", "--", "mirrorkit", "run",
             str(script)], cwd=str(tmp_path), stdout=out, stderr=subprocess.STDOUT,
            env=clean_env(ORIGIN=origin, CACHE=str(cache)))
        try:
            # Until both workers wait for the lock (the kernel lists them as its waiters),
            # not for a fixed time after they start the script: a worker of a loaded
            # machine can take longer than that to import Keras and reach get_file, and
            # would not have written yet without the lock either.
            deadline = time.monotonic() + 240
            while _waiting_for(lock) < 2:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert "PATH" not in log.read_text()
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
            # Both workers are in get_file and wait for the lock: nothing written.
            assert "PATH" not in log.read_text()
            assert not (cache / "datasets").exists() or not any((cache / "datasets").iterdir())
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        assert proc.wait(timeout=240) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert text.count("PATH") == 2, text[-3000:]
    extracted = cache / "datasets" / "data_extracted" / "data" / "data.npz"
    with np.load(extracted) as loaded:
        np.testing.assert_array_equal(loaded["x"], np.arange(200_000, dtype="float32"))


def test_one_process_keeps_kerass_get_file():
    from keras.src.utils import file_utils

    original = file_utils.get_file
    with downloads.installed(SimpleNamespace(is_multi_worker=False)):
        assert file_utils.get_file is original
    with downloads.installed(SimpleNamespace(is_multi_worker=True)):
        assert file_utils.get_file is not original
        assert engine.original(file_utils.get_file) is original
        assert engine.patched_by(file_utils.get_file) == "get-file-lock"
    assert file_utils.get_file is original
