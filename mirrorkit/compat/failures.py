"""How a fix fails: loudly, naming itself and how to turn it off, never by falling back.

A fix that quietly hands a step back to Keras's own code when its own code
breaks trains that step with N times (or 1/N of) one device's gradient and
says nothing. So a fix's code that raises inside a user's step raises
:class:`FixFailed` (a ``RuntimeError``: a defect in mirrorkit, shown with its
traceback by the command line), and a fix that is needed but cannot be
installed stops the strategy with :class:`FixMissing` (a
:class:`~mirrorkit.errors.RunError`: the user can act on it). Both messages
name the fix and ``MIRRORKIT_COMPAT_DISABLE=NAME``, the way to run on
without it knowingly.

Example:
    >>> try:
    ...     with failing_loudly("paired-step-losses"):
    ...         raise KeyError("op")
    ... except FixFailed as err:
    ...     print(err.fix, "MIRRORKIT_COMPAT_DISABLE=paired-step-losses" in str(err))
    paired-step-losses True
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from mirrorkit.errors import RunError

__all__ = ["FixFailed", "FixMissing", "failing_loudly"]


def _how_to_turn_off(name: str) -> str:
    return (f"MIRRORKIT_COMPAT_DISABLE={name} runs without it (Keras's own behaviour, with the "
            "bug it works around)")


class FixFailed(RuntimeError):
    """A fix's own code raised while it ran inside a step: a bug in mirrorkit.

    Example:
        >>> str(FixFailed("hand-mean-gradients", ValueError("x"))).split(":")[0]
        "mirrorkit's fix 'hand-mean-gradients' failed"
    """

    def __init__(self, name: str, error: BaseException) -> None:
        super().__init__(f"mirrorkit's fix {name!r} failed: {type(error).__name__}: {error}. "
                         f"This is a bug in mirrorkit; please report it. "
                         f"{_how_to_turn_off(name)}.")
        self.fix = name


class FixMissing(RunError):
    """A fix is needed here but its target cannot be found or patched in this Keras/TensorFlow.

    Example:
        >>> err = FixMissing("multi-step", "keras#19246", "it is gone", "keras 9.0")
        >>> "MIRRORKIT_COMPAT_DISABLE=multi-step" in str(err)
        True
    """

    def __init__(self, name: str, ref: str, why: str, versions: str) -> None:
        super().__init__(
            f"mirrorkit's fix {name!r} ({ref}) is needed with {versions} but cannot be "
            f"applied: {why}. Training on would hit the bug it works around. Install the "
            f"versions `mirrorkit info` lists as tested, or {_how_to_turn_off(name)}.")
        self.fix = name


@contextlib.contextmanager
def failing_loudly(name: str) -> Iterator[None]:
    """Turn any exception from a fix's own code into :class:`FixFailed` naming fix ``name``.

    Wrap only mirrorkit's code (reading a loss, checking an update), never
    the Keras or TensorFlow call the fix wraps: their errors are the user's
    and pass unchanged.

    Example:
        >>> with failing_loudly("replica-variable-copies"):
        ...     pass
    """
    try:
        yield
    except FixFailed:
        raise
    except Exception as err:
        raise FixFailed(name, err) from err
