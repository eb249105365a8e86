"""One writer per run folder: the lock ``mirrorkit train`` holds on ``OUTPUT/.mirrorkit.lock``.

Two runs writing one folder interleave its event log, fuse rows of
history.csv and race on the backup's HDF5 files. So the process that writes
the folder (the chief; other workers write private scratch folders, see
:mod:`mirrorkit.training.chief`) holds an exclusive ``flock`` on
``OUTPUT/.mirrorkit.lock`` for the whole run, taken before it writes
anything. The file names the holder (pid, host, start time, job id) as JSON,
so a refused run can say who has the folder.

Why ``flock`` on an open file rather than a file created with
``O_CREAT|O_EXCL``: the kernel releases a ``flock`` when its process dies,
however it dies (``kill -9``, out of memory), so a killed run never leaves a
lock that only a guess about its pid could clear. The file a killed run
leaves behind is merely stale: the next run gets the lock, says whose it
was, and takes it over. A run that ends (finished or failed) deletes the file
while still holding the lock; a run that was waiting on the deleted file
sees that it locked an orphan and starts again on a fresh one.

The workers of one ``mirrorkit launch`` job are one writer: only the chief
locks, and a restarted group (same ``MIRRORKIT_RUN_ID``) waits up to
:data:`SAME_JOB_WAIT` seconds for its previous attempt's chief to exit
instead of being refused.

Limits:

* Network filesystems: Linux turns ``flock`` on NFS into an NFS byte-range
  lock, which works across machines when the server's lock manager does
  (NFSv4, or NFSv3 with lockd); a mount with ``nolock`` and some FUSE
  filesystems lock per machine only, and two hosts could then both write.
  A filesystem that refuses locks (ENOLCK, EOPNOTSUPP) is one clear error;
  ``MIRRORKIT_RUN_LOCK=off`` runs without the guard there.
* A holder on another host cannot be checked: a free lock whose file names
  another host is taken over, trusting the filesystem's lock. On this host a
  file naming a live process (same pid and process start time, read from
  ``/proc``) is refused even when the lock is free.
* A process forked (without exec) from the holder shares its lock until it
  exits too.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> folder = Path(tempfile.mkdtemp())
    >>> with acquire(folder, job="demo") as lock:
    ...     (folder / LOCK_NAME).exists()
    True
    >>> (folder / LOCK_NAME).exists()
    False
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable

from mirrorkit import _env
from mirrorkit.errors import RunError

__all__ = ["LOCK_NAME", "SAME_JOB_WAIT", "Holder", "RunLock", "acquire", "claim_output"]

LOCK_NAME = ".mirrorkit.lock"
# A restarted launch job waits this long for its previous attempt's chief
# (the launcher reaps a group within 30 s before it starts the next one).
SAME_JOB_WAIT = 60.0
# How long a refused run re-reads an empty lock file: the winner writes its
# name just after it takes the lock.
_NAME_WAIT = 2.0


@dataclasses.dataclass(frozen=True)
class Holder:
    """Who holds (or held) a run folder's lock, as its lock file says.

    Example:
        >>> Holder(pid=7, host="a", started=0.0, job=None).describe()[:15]
        'pid 7 on host a'
    """

    pid: int
    host: str
    started: float
    job: str | None = None
    proc_start: str | None = None

    @classmethod
    def me(cls, job: str | None) -> Holder:
        """This process, as it writes itself into the lock file."""
        return cls(os.getpid(), socket.gethostname(), time.time(), job, _proc_start(os.getpid()))

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """The holder in a lock file's text, or None (empty or not mirrorkit's)."""
        try:
            data = json.loads(text)
            return cls(int(data["pid"]), str(data["host"]), float(data["started"]),
                       data.get("job"), data.get("proc_start"))
        except (ValueError, KeyError, TypeError):
            return None

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        job = f", job {self.job}" if self.job else ""
        return f"pid {self.pid} on host {self.host}, started {when}{job}"

    def alive_here(self) -> bool:
        """True when this is a live process of this host (pid and its start time match)."""
        return (self.host == socket.gethostname() and self.proc_start is not None
                and _proc_start(self.pid) == self.proc_start)


class RunLock:
    """The held lock of one run folder; :meth:`release` (or leaving ``with``) ends it.

    ``RunLock(None, None)`` holds nothing (non-chief workers, or the guard
    turned off).

    Example:
        >>> with RunLock(None, None):
        ...     pass
    """

    def __init__(self, path: Path | None, fd: int | None, *, made_folder: bool = False) -> None:
        self.path, self._fd, self._made_folder = path, fd, made_folder

    def release(self) -> None:
        """Delete the lock file (still holding it), then let go. Safe to call twice.

        A folder the lock itself created and nothing else wrote into goes too:
        a run refused before its first file leaves no trace.
        """
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if _is_current(fd, self.path):
                os.unlink(self.path)
                if self._made_folder and not any(self.path.parent.iterdir()):
                    self.path.parent.rmdir()
        except OSError:
            pass   # a vanished or read-only folder: closing still frees the lock
        finally:
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def acquire(out: Path, *, job: str | None = None, say: Callable[[str], Any] | None = None,
            wait_same_job: float = SAME_JOB_WAIT) -> RunLock:
    """Lock run folder ``out`` for this process (creating it), or refuse naming the holder.

    Args:
        out: the run folder.
        job: this job's id (``MIRRORKIT_RUN_ID`` under ``mirrorkit launch``);
            a holder of the same job is waited for, up to ``wait_same_job``.
        say: told one line when a stale lock of a dead run is taken over.

    Returns:
        The held :class:`RunLock`.

    Raises:
        RunError: another live run holds ``out`` (the line names it), or the
            filesystem cannot lock.
        PermissionError: the folder or its lock file cannot be created.

    Example:
        >>> lock = acquire(Path("runs/a"), say=print)          # doctest: +SKIP
    """
    import fcntl

    path = out / LOCK_NAME
    deadline = time.monotonic() + wait_same_job
    made_folder = not out.is_dir()
    while True:
        fd = _open(out, path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = _named_holder(path)
            if job and holder is not None and holder.job == job and time.monotonic() < deadline:
                time.sleep(0.2)
                continue
            raise RunError(_held_line(out, holder)) from None
        except OSError as err:
            os.close(fd)
            raise RunError(
                f"Cannot lock {path}: {err.strerror or err} (a filesystem without file locks?). "
                f"Set MIRRORKIT_RUN_LOCK=off to run without the one-writer guard, or choose "
                f"another --output. Received: output={str(out)!r}") from err
        if not _is_current(fd, path):
            os.close(fd)   # locked a file its holder deleted on release: start again
            continue
        previous = Holder.parse(_read(fd))
        if previous is not None and previous.pid != os.getpid() and previous.alive_here():
            os.close(fd)
            raise RunError(_held_line(out, previous, " (its lock is not visible here: a "
                                      "filesystem whose flock does not reach it?)"))
        _write(fd, Holder.me(job))
        if previous is not None and say is not None:
            whose = ("this job's previous attempt, " if job and previous.job == job else "")
            say(f"lock      took over the stale lock of {out} left by {whose}"
                f"{previous.describe()}, which no longer runs")
        return RunLock(path, fd, made_folder=made_folder)


def claim_output(config: Any, say: Callable[[str], Any]) -> tuple[Path, RunLock]:
    """Check ``config.output`` (``check_output``) and hold its lock for the run.

    A folder that already exists is locked first, so a live run there is
    named rather than its files; a new folder is checked, locked, and
    checked again under the lock (a run may have finished there meanwhile).

    Example:
        >>> out, lock = claim_output(TrainConfig(output="runs/a"), print)   # doctest: +SKIP
    """
    from mirrorkit.training.output import check_output

    def lock_of(path: Path) -> RunLock:
        return acquire(path, job=_env.run_id(), say=say) if _env.run_lock() else RunLock(None, None)

    given = Path(config.output).expanduser() if config.output else None
    lock = lock_of(given) if given is not None and given.is_dir() else None
    try:
        out = check_output(config)
        if lock is None:
            lock = lock_of(out)
            check_output(dataclasses.replace(config, output=str(out)))
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return out, lock


def _held_line(out: Path, holder: Holder | None, why: str = "") -> str:
    who = holder.describe() if holder else "a process that has not named itself yet"
    return (f"{out} is in use by another run: {who}{why}. Wait for it to finish or stop it, "
            f"or choose another --output; nothing was written. Lock file: {out / LOCK_NAME}")


def _open(out: Path, path: Path) -> int:
    try:
        # 0o775 & ~umask, as make_output; the file is read by refused runs.
        out.mkdir(mode=0o775, parents=True, exist_ok=True)
        # O_CLOEXEC: a program this run starts must not inherit (and keep) its lock.
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o664)
    except OSError as err:
        raise PermissionError(f"Cannot create the run lock {path}: {err.strerror or err}. "
                              f"Received: output={str(out)!r}") from err


def _is_current(fd: int, path: Path | None) -> bool:
    """True while ``path`` is still the file open as ``fd`` (not deleted or replaced)."""
    try:
        held, now = os.fstat(fd), os.stat(path)   # type: ignore[arg-type]
    except (OSError, TypeError):
        return False
    return (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode("utf-8", "replace")


def _write(fd: int, holder: Holder) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(dataclasses.asdict(holder)) + "\n").encode(), 0)
    os.fsync(fd)


def _named_holder(path: Path) -> Holder | None:
    """The live holder named in ``path``, waiting briefly for a new holder to write itself."""
    deadline = time.monotonic() + _NAME_WAIT
    while True:
        try:
            holder = Holder.parse(path.read_text())
        except OSError:
            holder = None
        here = holder is not None and holder.host == socket.gethostname()
        # Empty, or still the dead run's name: the winner has not written yet.
        if (holder is not None and (not here or holder.alive_here())) \
                or time.monotonic() > deadline:
            return holder
        time.sleep(0.05)


def _proc_start(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (Linux ``/proc``), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may hold spaces, so split after it.
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None

