"""A backup that can be verified before anything resumes from it.

mirrorkit's :class:`~mirrorkit.training.callbacks.BackupAndRestore` keeps,
in its ``backup_dir``::

    latest.weights.h5        Keras's weights file (model and optimizer)
    training_metadata.json   Keras's {"epoch", "batch"}, plus "format"
    manifest.json            epoch, batch and each file's size and sha256, written LAST
    previous/                the backup before it (same three files), kept until
                             the new one is complete

A save writes the two files beside the old ones, hashes them as they are on
disk, moves the old, complete backup to ``previous/``, writes the new
manifest to ``.partial-manifest.json``, renames the new files into place and
only then renames the manifest. A save killed at any point leaves a backup
whose manifest (or pending manifest: the save is then finished) matches, or
a mismatch that :func:`choose` reports, with ``previous/`` intact.

Every resume calls :func:`choose` first: it refuses a missing, truncated or
changed file or an unreadable manifest with one line naming the file, what is
wrong and the choices (``--resume-previous`` / ``MIRRORKIT_BACKUP_FALLBACK=previous``
to resume from ``previous/``, or start over). It never falls back on its own.
A backup written before manifests existed (no ``manifest.json``, no
``"format"`` in its metadata) is checked by format only: an HDF5 weights
file and metadata with an integer epoch.

Example:
    >>> from pathlib import Path
    >>> choose(Path("surely/missing/backup")) is None
    True
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Mapping

from mirrorkit import _env
from mirrorkit.errors import RunError, UserInputError

logger = logging.getLogger(__name__)

__all__ = ["FALLBACK", "FORMAT", "MANIFEST", "METADATA", "PREVIOUS", "WEIGHTS", "Backup",
           "BackupDamaged", "choose", "commit", "metadata_text", "restore", "save",
           "verify"]

WEIGHTS = "latest.weights.h5"
METADATA = "training_metadata.json"
MANIFEST = "manifest.json"
PENDING = ".partial-" + MANIFEST
PREVIOUS = "previous"
FORMAT = "mirrorkit-backup/1"
# MIRRORKIT_BACKUP_FALLBACK=previous: the user's permission to resume from
# previous/ when the latest backup fails verification (`train --resume-previous`).
FALLBACK = "MIRRORKIT_BACKUP_FALLBACK"
_FALLBACKS = ("previous",)
_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_CHUNK = 1 << 20


class BackupDamaged(RunError):
    """A backup failed verification; the message names the file and what is wrong.

    Example:
        >>> isinstance(BackupDamaged("latest.weights.h5 is missing"), RuntimeError)
        True
    """


@dataclasses.dataclass(frozen=True)
class Backup:
    """A verified backup: where its files are and the epoch it ends.

    Attributes:
        folder: the folder holding ``latest.weights.h5`` and ``training_metadata.json``.
        epoch: completed epochs (the resumed ``fit`` starts at this epoch index).
        checked: ``"manifest"`` (sizes and sha256) or ``"format"`` (a backup
            from before manifests).

    Example:
        >>> Backup(Path("out/backup"), 2, "manifest").weights.name
        'latest.weights.h5'
    """

    folder: Path
    epoch: int
    checked: str

    @property
    def weights(self) -> Path:
        """The weights file."""
        return self.folder / WEIGHTS


def metadata_text(epoch: int, batch: int) -> str:
    """The metadata file's text: Keras's two keys and the format that says a manifest is due.

    Example:
        >>> metadata_text(2, 0)
        '{"epoch": 2, "batch": 0, "format": "mirrorkit-backup/1"}'
    """
    return json.dumps({"epoch": int(epoch), "batch": int(batch), "format": FORMAT})


def save(model: Any, folder: str | os.PathLike, epoch: int, batch: int) -> None:
    """Write ``model``'s weights and the metadata beside the backup in ``folder``, then commit.

    Example:
        >>> save(model, "out/backup", epoch=2, batch=0)                 # doctest: +SKIP
    """
    weights = os.path.join(folder, ".partial-" + WEIGHTS)
    metadata = os.path.join(folder, ".partial-" + METADATA)
    model.save_weights(filepath=weights, overwrite=True)
    with open(metadata, "w") as f:
        f.write(metadata_text(epoch, batch))
    commit(folder, {WEIGHTS: weights, METADATA: metadata}, epoch=epoch, batch=batch)


def restore(model: Any, folder: str | os.PathLike) -> Backup | None:
    """Verify the backup in ``folder`` (:func:`choose`) and load its weights into ``model``.

    Returns:
        The backup restored (the caller resumes at its ``epoch``), or None
        when ``folder`` holds none (a fresh start).

    Raises:
        BackupDamaged: the backup failed verification, or its weights do not
            load into ``model`` (another model's backup); the file is named.

    Example:
        >>> restore(model, "out/backup").epoch                           # doctest: +SKIP
        2
    """
    backup = choose(folder)
    if backup is None:
        return None
    if model.optimizer is not None and not model.optimizer.built:
        model.optimizer.build(model.trainable_variables)
    try:
        model.load_weights(str(backup.weights))
    except Exception as err:  # noqa: BLE001 -- h5py/Keras errors name no file
        raise BackupDamaged(
            f"Cannot resume from {backup.weights}: it does not load into this model "
            f"({type(err).__name__}: {_first_line(err)}). Start over (delete {folder}) "
            f"or resume with the model that wrote it.") from err
    if backup.folder != Path(folder) or backup.checked != "manifest":
        logger.warning("mirrorkit: resuming at epoch %d from %s (%s)", backup.epoch,
                       backup.folder, "the previous backup" if backup.checked == "manifest"
                       else "written before manifests: checked by format only")
    return backup


def commit(folder: str | os.PathLike, written: Mapping[str, str | os.PathLike],
           epoch: int, batch: int) -> None:
    """Make freshly written files the backup in ``folder``; the manifest goes last.

    ``written`` maps each final name (``latest.weights.h5``,
    ``training_metadata.json``) to the temporary file holding it. The current
    backup, when it verifies, becomes ``previous/`` first.

    Example:
        >>> commit("out/backup", {WEIGHTS: "out/backup/.partial-latest.weights.h5",
        ...                       METADATA: "out/backup/.partial-training_metadata.json"},
        ...        epoch=2, batch=0)                                  # doctest: +SKIP
    """
    folder = Path(folder)
    files = {}
    for name, path in written.items():
        _sync(Path(path))
        files[name] = {"bytes": os.path.getsize(path), "sha256": _sha256(Path(path))}
    _keep_previous(folder)
    # The manifest is durable before any file moves: a commit stopped between
    # the moves and its last rename is finished from it by verify().
    pending = folder / PENDING
    pending.write_text(json.dumps({"format": FORMAT, "epoch": int(epoch), "batch": int(batch),
                                   "files": files}, indent=1) + "\n")
    _sync(pending)
    for name, path in written.items():
        os.replace(path, folder / name)
    os.replace(pending, folder / MANIFEST)
    _sync(folder)


def choose(backup_dir: str | os.PathLike, *, fallback: str | None = None,
           start_over: str | None = None, use_previous: str | None = None) -> Backup | None:
    """Verify the backup in ``backup_dir`` and return the one to resume from.

    Args:
        backup_dir: the backup folder.
        fallback: ``"previous"`` to resume from ``previous/`` when the latest
            backup fails verification. Defaults to ``MIRRORKIT_BACKUP_FALLBACK``,
            else no fallback.
        start_over: how to start over, for the error line. Defaults to
            "delete BACKUP_DIR".
        use_previous: how to allow the fallback, for the error line.
            Defaults to "set MIRRORKIT_BACKUP_FALLBACK=previous".

    Returns:
        The verified :class:`Backup`, or None when ``backup_dir`` holds no
        backup at all (a fresh start).

    Raises:
        BackupDamaged: the latest backup failed verification (and no
            permitted fallback verified): one line with the file, what is
            wrong and the choices. Nothing is changed.
        UserInputError: an unknown ``fallback``.

    Example:
        >>> choose("surely/missing/backup") is None
        True
    """
    folder = Path(backup_dir)
    fallback = fallback if fallback is not None else _env.get(FALLBACK) or None
    if fallback is not None and fallback not in _FALLBACKS:
        raise UserInputError(f"Unknown backup fallback. Received: {FALLBACK}={fallback!r}; "
                             f"accepted: {', '.join(_FALLBACKS)}")
    previous = folder / PREVIOUS
    if not any((folder / name).exists() for name in (WEIGHTS, METADATA, MANIFEST)) \
            and not previous.is_dir():
        return None
    try:
        return verify(folder)
    except BackupDamaged as err:
        damage = str(err)
    good: Backup | None = None
    why_not = ""
    if previous.is_dir():
        try:
            good = verify(previous, legacy=False)
        except BackupDamaged as err:
            why_not = str(err)
    if good is not None and fallback == "previous":
        return good
    if good is not None:
        choice = (f"{use_previous or f'set {FALLBACK}=previous'} to resume from the "
                  f"previous good backup (epoch {good.epoch}, {previous})")
    elif why_not:
        choice = f"the previous backup cannot be used either ({why_not})"
    else:
        choice = "no previous backup is kept"
    start_over = start_over or f"delete {folder}"
    raise BackupDamaged(f"Cannot resume from the backup in {folder}: {damage}. Nothing was "
                        f"changed. Choose: {choice}; or start over: {start_over}.")


def verify(folder: Path, *, legacy: bool = True) -> Backup:
    """Check ``folder``'s backup against its manifest (or, ``legacy``, by format).

    Raises:
        BackupDamaged: naming the file and what is wrong.

    Example:
        >>> verify(Path("surely/missing"))
        Traceback (most recent call last):
        ...
        mirrorkit.training.backup_manifest.BackupDamaged: latest.weights.h5, training_metadata.json and manifest.json are missing
    """
    try:
        return _check(folder, folder / MANIFEST, legacy)
    except BackupDamaged as damaged:
        # A commit stopped after its files moved, before its manifest's rename
        # (a killed writer): when they all match the pending manifest, finish it.
        try:
            backup = _check(folder, folder / PENDING, False)
        except BackupDamaged:
            raise damaged from None
        os.replace(folder / PENDING, folder / MANIFEST)
        return backup


def _check(folder: Path, manifest_path: Path, legacy: bool) -> Backup:
    if not manifest_path.exists():
        missing = [n for n in (WEIGHTS, METADATA, MANIFEST) if not (folder / n).exists()]
        if METADATA not in missing and _metadata(folder).get("format"):
            raise BackupDamaged(f"{MANIFEST} is missing, though {METADATA} says one was written")
        if not legacy or missing == [MANIFEST]:
            if legacy:
                return _verify_by_format(folder)
            raise BackupDamaged(f"{MANIFEST} is missing")
        # Keras's own files (a backup from before manifests, or none at all).
        named = missing if len(missing) == 3 else [n for n in missing if n != MANIFEST]
        names = ", ".join(named[:-1]) + " and " + named[-1] if len(named) > 1 else named[0]
        note = "" if len(missing) == 3 else f" (a backup without {MANIFEST})"
        raise BackupDamaged(f"{names} {'is' if len(named) == 1 else 'are'} missing{note}")
    manifest = _manifest(manifest_path)
    for name in (WEIGHTS, METADATA):
        expected = manifest["files"].get(name)
        if not isinstance(expected, dict) or not isinstance(expected.get("bytes"), int) \
                or not isinstance(expected.get("sha256"), str):
            raise BackupDamaged(f"{MANIFEST} is unreadable: no size and sha256 for {name}")
        path = folder / name
        if not path.exists():
            raise BackupDamaged(f"{name} is missing (the manifest lists it, "
                                f"epoch {manifest['epoch']})")
        size = path.stat().st_size
        if size != expected["bytes"]:
            raise BackupDamaged(f"{name} is {size} bytes, the manifest says "
                                f"{expected['bytes']} (truncated or replaced)")
        if _sha256(path) != expected["sha256"]:
            raise BackupDamaged(f"{name} does not match its sha256 in the manifest "
                                f"(changed after it was written)")
    return Backup(folder, manifest["epoch"], "manifest")


def _manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BackupDamaged(f"{path.name} is unreadable ({_first_line(err)})") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT \
            or not isinstance(manifest.get("files"), dict) \
            or not isinstance(manifest.get("epoch"), int) or manifest["epoch"] < 0:
        raise BackupDamaged(f"{path.name} is unreadable (not a {FORMAT} manifest with an "
                            f"epoch and files)")
    return manifest


def _metadata(folder: Path) -> dict[str, Any]:
    path = folder / METADATA
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BackupDamaged(f"{METADATA} is unreadable ({_first_line(err)})") from err
    if not isinstance(data, dict):
        raise BackupDamaged(f"{METADATA} is unreadable (not a JSON object)")
    return data


def _verify_by_format(folder: Path) -> Backup:
    # A backup from before manifests: Keras's own two files, nothing to compare with.
    epoch = _metadata(folder).get("epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise BackupDamaged(f"{METADATA} has no epoch (a whole number). Received: epoch={epoch!r}")
    weights = folder / WEIGHTS
    with open(weights, "rb") as f:
        head = f.read(len(_HDF5_SIGNATURE))
    if head != _HDF5_SIGNATURE:
        size = weights.stat().st_size
        raise BackupDamaged(f"{WEIGHTS} is not an HDF5 file ({size} bytes)")
    return Backup(folder, epoch, "format")


def _keep_previous(folder: Path) -> None:
    # Only a complete backup becomes previous/: a damaged one never replaces
    # the last good one.
    try:
        verify(folder, legacy=False)
    except BackupDamaged:
        return
    staging, old = folder / ".partial-previous", folder / ".old-previous"
    for leftover in (staging, old):
        shutil.rmtree(leftover, ignore_errors=True)
    staging.mkdir()
    for name in (WEIGHTS, METADATA, MANIFEST):
        try:
            # A link costs no copy: the current files are replaced (new
            # inodes) by os.replace, never rewritten in place.
            os.link(folder / name, staging / name)
        except OSError:
            shutil.copyfile(folder / name, staging / name)
    previous = folder / PREVIOUS
    if previous.exists():
        os.rename(previous, old)
    os.rename(staging, previous)
    shutil.rmtree(old, ignore_errors=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _sync(path: Path) -> None:
    # Renames are atomic, but without fsync a power loss can leave the new
    # name pointing at blocks never written.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__
