"""What every ``mirrorkit`` command and every Python worker of ``mirrorkit launch`` does first.

Two patches that make a TensorFlow process start faster, each turned off by
name: :mod:`~mirrorkit.launcher.deferred_imports` (Keras's imports of pandas
and matplotlib wait for their first use) and :mod:`~mirrorkit.launcher.import_gc`
(the garbage collector stays out of TensorFlow's import). Both must be in
place before anything imports Keras; neither imports it.

Example:
    >>> from mirrorkit.launcher import startup
    >>> startup.install()       # doctest: +SKIP
    {'deferred-optional-imports': True, 'import-gc-freeze': True}
"""

from __future__ import annotations

from mirrorkit.launcher import deferred_imports, import_gc


def install() -> dict[str, bool]:
    """Install both start-up patches; returns which were installed now.

    Example:
        >>> from mirrorkit.launcher import startup
        >>> startup.install()       # doctest: +SKIP
        {'deferred-optional-imports': True, 'import-gc-freeze': True}
    """
    return {deferred_imports.NAME: deferred_imports.install(), import_gc.NAME: import_gc.install()}
