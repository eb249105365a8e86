"""The run directory: where it is, whether it may be written, and what it holds.

A run directory is never overwritten: an existing run is refused unless it is
resumed, and a group restarted by ``mirrorkit launch`` continues its backup.

Example:
    >>> RUN_FILES[:2]
    ('model.keras', 'metrics.json')
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from mirrorkit import _env
from mirrorkit.datasets import parse_spec
from mirrorkit.errors import UserInputError
from mirrorkit.training.config import TrainConfig

# What a finished or interrupted run leaves in its output directory.
RUN_FILES = ("model.keras", "metrics.json", "history.csv", "events.jsonl", "logs", "backup",
             "saved_model")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text.split("/")[-1]).strip("_.")


def default_output(config: TrainConfig) -> Path:
    """A new ``runs/<time>-<model>-<dataset>`` folder (one fixed name per launched job).

    Example:
        >>> default_output(TrainConfig()).parent.name
        'runs'
    """
    kind, arg = parse_spec(config.dataset)
    name = kind if not arg else f"{kind}-{_slug(arg) or 'data'}"
    run_id = _env.run_id()
    base = Path("runs") / f"{run_id or time.strftime('%Y%m%d-%H%M%S')}-{config.model}-{name}"
    if run_id:
        # A launched job: every worker and every restart must pick the same folder.
        return base
    path, n = base, 2
    while path.exists():
        path, n = base.with_name(f"{base.name}-{n}"), n + 1
    return path


def has_backup(backup: Path) -> bool:
    """True when ``backup`` is a folder with something in it.

    Example:
        >>> has_backup(Path("surely/missing/backup"))
        False
    """
    return backup.is_dir() and any(backup.iterdir())


def relaunched_with_backup(config: TrainConfig, path: Path) -> bool:
    """True when ``mirrorkit launch`` restarted this job and a backup exists.

    A restarted group runs the same command line as the first attempt, which
    had no ``--resume``; it must continue from the backup, not be refused.
    """
    return bool(_env.restart_count()) and has_backup(path / "backup")


def check_output(config: TrainConfig) -> Path:
    """Refuse anything that could lose a previous run; create nothing yet."""
    path = Path(config.output).expanduser() if config.output else default_output(config)
    shown = f"output={str(config.output)!r}" if config.output else f"output={str(path)!r}"
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"The output path is a file, not a directory. Received: {shown}")
    if relaunched_with_backup(config, path):
        # A restart resumes under the same rule as --resume: verified first.
        # (None: the first attempt died before its first complete backup.)
        _verified_backup(path)
        return path
    if config.resume:
        if not has_backup(path / "backup") or _verified_backup(path) is None:
            done = (" (that run finished: see metrics.json)"
                    if (path / "metrics.json").exists() else "")
            raise FileNotFoundError(f"Nothing to resume: no backup in {path / 'backup'}{done}. "
                                    f"Received: {shown}, resume=True")
    elif path.is_dir() and not _env.restart_count():
        # (A relaunched group whose first attempt died before its first backup
        # starts over in the same folder; nothing of value is there yet.)
        found = [name for name in RUN_FILES if (path / name).exists()]
        if found:
            raise UserInputError(
                f"{path} already holds a run ({', '.join(found)}); pass --resume (resume=True) "
                f"to continue it, or choose another --output. Nothing was changed. "
                f"Received: {shown}")
    # The nearest existing ancestor must be a writable directory.
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(
            f"Cannot create the output directory: {parent} is a file. Received: {shown}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"The output directory is not writable ({parent}). Received: {shown}")
    return path


def _verified_backup(path: Path) -> Any:
    # Before TensorFlow builds anything: a backup that fails verification
    # stops the run here, with nothing written (backup_manifest.choose).
    from mirrorkit.training.backup_manifest import choose

    return choose(path / "backup", use_previous="add --resume-previous",
                  start_over=f"choose another --output, or delete {path} to reuse its name")


def make_output(path: Path) -> None:
    """Create the run directory and prove it is writable (``PermissionError`` if not).

    Example:
        >>> make_output(Path("runs/example"))      # doctest: +SKIP
    """
    try:
        # 0o775 & ~umask: the user's umask, but never world-writable.
        path.mkdir(mode=0o775, parents=True, exist_ok=True)
        probe = path / ".mirrorkit-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise PermissionError(f"Cannot write to the output directory {path}: "
                              f"{err.strerror or err}. Received: output={str(path)!r}") from err
