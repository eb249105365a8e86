"""mirrorkit's Keras fixes for a strategy, with the lost-peer clock started.

:func:`mirrorkit.compat.apply` patches Keras; a multi-worker process also
wants the clock that a lost-peer report quotes ("no training step for 12 s"),
which :mod:`mirrorkit.distribute.peer_loss` starts on Keras's callback list
once Keras is imported. This is the one call that does both, for
:func:`mirrorkit.get_strategy`, the launcher's worker bootstrap and
``mirrorkit.fix_multi_worker()``.

Example:
    >>> import tensorflow as tf                                  # doctest: +SKIP
    >>> strategy = tf.distribute.MultiWorkerMirroredStrategy()   # doctest: +SKIP
    >>> apply_fixes(strategy=strategy)                           # doctest: +SKIP
    {'symbolic-build': 'applied', 'scalar-logs': 'applied', ...}
"""

from __future__ import annotations

from typing import Any, Iterable

from mirrorkit import compat
from mirrorkit.distribute import peer_loss


def apply_fixes(*, disable: Iterable[str] | None = None, strategy: Any = None) -> dict[str, str]:
    """Apply every needed Keras fix (:func:`mirrorkit.compat.apply`), then start the clock.

    Args:
        disable: fix names to leave out. Defaults to ``MIRRORKIT_COMPAT_DISABLE``.
        strategy: the strategy about to train (lets a fix probe). Defaults to None.

    Returns:
        Fix name -> status, as :func:`mirrorkit.compat.apply` returns it.

    Raises:
        ValueError: an unknown fix name.

    Example:
        >>> apply_fixes(disable=["multi-step"])["multi-step"]    # doctest: +SKIP
        'disabled'
    """
    result = compat.apply(disable=disable, strategy=strategy)
    if peer_loss.installed():
        # Keras is imported by now: start the clock a lost-peer report quotes.
        peer_loss.track_progress()
    return result
