"""Under ``mirrorkit launch``, a directory one worker made counts as made by every worker.

Each launched worker runs the whole script in the same working directory, so
the directory-making lines of a one-process script run N times at once:

* keras.io's "Multi-GPU and distributed training with TensorFlow" guide:
  ``if not os.path.exists(checkpoint_dir): os.makedirs(checkpoint_dir)`` --
  two workers both find it missing, the second ``makedirs`` raises
  ``FileExistsError: [Errno 17] File exists: './ckpt'``;
* TensorFlow's "Save and load models" style ``os.mkdir("training_2")`` --
  the second worker always raises ``FileExistsError``.

As one process the script makes each directory once. While it runs under
``mirrorkit run`` as a launched worker, ``os.mkdir`` (and so ``os.makedirs``
and ``pathlib.Path.mkdir``, which call it) does not raise ``FileExistsError``
for a directory made during this job: one whose inode changed (``st_ctime``)
at or after ``MIRRORKIT_JOB_START``, which ``mirrorkit launch`` takes before
any worker starts and keeps across restarts. The call then returns as if it
had made the directory. Relative and absolute paths behave alike (the test is
on the directory itself, not on how it is named). A directory that existed
before the launch still raises, as it does under ``python``; so does a file
in the way.

Designs left out, and why: giving each non-chief worker a private working
directory breaks relative *reads* (data files, configs, a dataset the chief
downloaded) and every later read of what the chief wrote; locking around
each check-then-create is impossible, since the check is the script's own
``os.path.exists``.

Limits:

* ``st_ctime`` changes with every entry added, removed or renamed and with
  ``chmod``: a directory from before the launch that a worker changed during
  the job counts as the job's too, so a script's unguarded ``os.mkdir`` of it
  stops raising on the workers that come second. (Linux's ``os.stat`` has no
  birth time.)
* The same worker making one directory twice does not raise either (as one
  process it would): the job cannot tell its workers' directories apart.
* Only ``os.mkdir``; ``tf.io.gfile.mkdir`` is left as it is
  (``tf.io.gfile.makedirs`` already accepts an existing directory).
* Several machines on a shared filesystem: each node's launcher takes its own
  start time, so their clocks must agree to within the time from launch to the
  first directory a script makes (seconds).
* Other races of one-process code are not covered: two workers writing one
  file with ``open`` (last writer wins) or removing one tree
  (``if os.path.exists(d): shutil.rmtree(d)``, where the second worker's
  ``rmtree`` can raise or delete what the first already recreated). Saving
  through Keras and ``tf.train`` is chief-only (:mod:`mirrorkit.runner.chief_saving`).

Outside a launched multi-worker run (no ``MIRRORKIT_JOB_START``) nothing is
replaced. ``MIRRORKIT_COMPAT_DISABLE=job-mkdir`` turns it off.

Example:
    >>> with installed(runtime):                             # doctest: +SKIP
    ...     runpy.run_path("train.py", run_name="__main__")
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import stat
from typing import Any, Callable, Iterator

from mirrorkit import _env
from mirrorkit.patching import engine

logger = logging.getLogger(__name__)

# Its record: mirrorkit.patching.catalogue.
NAME = "job-mkdir"


def made_during_job(path: Any, job_start: float) -> bool:
    """True when ``path`` is a directory whose inode last changed at or after ``job_start``.

    Args:
        path: a path, as ``os.mkdir`` takes it (str, bytes or path-like).
        job_start: the job's start, in Unix seconds.

    Example:
        >>> import tempfile, time
        >>> before = time.time() - 1
        >>> with tempfile.TemporaryDirectory() as new:
        ...     made_during_job(new, before), made_during_job("/", before)
        (True, False)
    """
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_ctime >= job_start


def _job_mkdir(original: Callable[..., Any], job_start: float) -> Callable[..., Any]:
    @functools.wraps(original)
    def mkdir(path: Any, mode: int = 0o777, *, dir_fd: int | None = None) -> None:
        try:
            return original(path, mode, dir_fd=dir_fd)
        except FileExistsError:
            # dir_fd: a path relative to a descriptor the check cannot follow.
            if dir_fd is not None or not made_during_job(path, job_start):
                raise
            logger.debug("mirrorkit: %s was made by this job (another worker); "
                         "mkdir counts it as made", path)
            return None

    return mkdir


@contextlib.contextmanager
def installed(runtime: Any, job_start: float | None = None) -> Iterator[None]:
    """Let ``os.mkdir`` accept directories this job made, while the block runs.

    Args:
        runtime: the :class:`mirrorkit.Runtime` of this process; nothing
            changes unless ``runtime.is_multi_worker``.
        job_start: the job's start in Unix seconds. Defaults to
            ``MIRRORKIT_JOB_START`` (set by ``mirrorkit launch``); nothing
            changes without either.

    Example:
        >>> with installed(runtime):                         # doctest: +SKIP
        ...     runpy.run_path("train.py", run_name="__main__")
    """
    start = _env.job_start() if job_start is None else job_start
    if not getattr(runtime, "is_multi_worker", False) or start is None:
        yield
        return
    with engine.applied(NAME, [(os, "mkdir", lambda original: _job_mkdir(original, start))]):
        yield
