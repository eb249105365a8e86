"""What ``mirrorkit run`` runs: :class:`RunConfig`, and :class:`ScriptFailed` when it fails.

Example:
    >>> RunConfig(script="train.py", args=("--epochs", "3")).args
    ('--epochs', '3')
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from mirrorkit import _env
from mirrorkit.errors import UserInputError

# The environment twins of --compare-one-device and --sync-batch-norm.
COMPARE_ONE_DEVICE = "MIRRORKIT_COMPARE_ONE_DEVICE"
SYNC_BATCH_NORM = "MIRRORKIT_SYNC_BATCH_NORM"


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """What to run and how (the ``mirrorkit run`` flags).

    Attributes:
        script: path of the ``.py`` file to run.
        args: the script's own arguments (its ``sys.argv[1:]``).
        strategy: strategy kind; None falls back to ``MIRRORKIT_STRATEGY``, then auto.
        simulate_cpus: logical CPU devices; None falls back to
            ``MIRRORKIT_SIMULATE_CPUS``, then none.
        scale_batch: treat the script's ``batch_size`` as per replica; None
            falls back to ``MIRRORKIT_SCALE_BATCH``, then False.
        speed_up_fit: apply ``mirrorkit train``'s safe speed-ups to the
            script's ``fit`` (:mod:`mirrorkit.runner.speed`). Defaults to False.
        compare_one_device: start each model's first multi-replica ``fit``
            with the one-device check (:mod:`mirrorkit.runner.one_device_check`);
            None falls back to ``MIRRORKIT_COMPARE_ONE_DEVICE``, then False.
        sync_batch_norm: BatchNormalization layers the script constructs
            synchronise their statistics across replicas
            (:mod:`mirrorkit.runner.sync_bn`); None falls back to
            ``MIRRORKIT_SYNC_BATCH_NORM``, then False.

    Example:
        >>> RunConfig(script="train.py", args=("--epochs", "3")).args
        ('--epochs', '3')
    """

    script: str | os.PathLike[str]
    args: tuple[str, ...] = ()
    strategy: str | None = None
    simulate_cpus: int | None = None
    scale_batch: bool | None = None
    speed_up_fit: bool = False
    compare_one_device: bool | None = None
    sync_batch_norm: bool | None = None

    def compares_one_device(self) -> bool:
        """``compare_one_device``, else ``MIRRORKIT_COMPARE_ONE_DEVICE`` (1/true/yes), else False.

        Example:
            >>> RunConfig(script="train.py", compare_one_device=True).compares_one_device()
            True
        """
        return _flag(self.compare_one_device, COMPARE_ONE_DEVICE)

    def syncs_batch_norm(self) -> bool:
        """``sync_batch_norm``, else ``MIRRORKIT_SYNC_BATCH_NORM`` (1/true/yes), else False.

        Example:
            >>> RunConfig(script="train.py", sync_batch_norm=True).syncs_batch_norm()
            True
        """
        return _flag(self.sync_batch_norm, SYNC_BATCH_NORM)


def _flag(value: bool | None, variable: str) -> bool:
    if value is not None:
        return bool(value)
    raw = _env.get(variable) or ""
    return raw.strip().lower() in {"1", "true", "yes", "on"}


class ScriptFailed(Exception):
    """The script raised an uncaught exception (Python would exit with 1).

    Attributes:
        traceback_text: the traceback as ``python script.py`` would print it,
            starting at the script's own frame.
        exit_code: 1, like the interpreter.
    """

    exit_code = 1

    def __init__(self, traceback_text: str) -> None:
        super().__init__(traceback_text.rstrip().splitlines()[-1] if traceback_text else "")
        self.traceback_text = traceback_text


def check_script(script: str | os.PathLike[str]) -> Path:
    """Check that ``script`` is an existing ``.py`` file and return its path.

    Raises:
        FileNotFoundError: when it does not exist.
        UserInputError: when it is a directory or does not end in ``.py``.

    Example:
        >>> check_script("surely/missing.py")
        Traceback (most recent call last):
        ...
        FileNotFoundError: Script not found. Received: script='surely/missing.py'
    """
    path = Path(script)
    if not path.exists():
        raise FileNotFoundError(f"Script not found. Received: script={os.fspath(script)!r}")
    if path.is_dir() or path.suffix != ".py":
        raise UserInputError(
            f"The script must be a Python file ending in .py. Received: "
            f"script={os.fspath(script)!r}"
        )
    return path
