"""Chief-aware Keras callbacks, at the path the README documents.

The code lives in :mod:`mirrorkit.training.callbacks`; this module keeps
``mirrorkit.callbacks.BackupAndRestore`` (and the rest) importable where
users were told to find them.

Example:
    >>> from mirrorkit.callbacks import BackupAndRestore, save_model   # doctest: +SKIP
"""

from mirrorkit.training.callbacks import (  # noqa: F401 -- re-exported
    BackupAndRestore,
    ModelCheckpoint,
    TensorBoard,
    is_chief,
    save_model,
)

__all__ = ["BackupAndRestore", "ModelCheckpoint", "TensorBoard", "is_chief", "save_model"]
