"""The errors mirrorkit raises for problems a user can fix.

A mistake in what the user gave (a flag, a config field, an environment
variable, a file or folder they name, a dataset spec, a hosts list) is a
:class:`UserInputError`, a missing or existing path the matching
``OSError``; everything else a user can fix is a :class:`RunError` or a
:class:`MissingDependency`. They subclass the builtins that callers already
catch (``except ValueError`` still catches a :class:`UserInputError`,
``except RuntimeError`` a :class:`RunError`), and they are what lets the
command line tell a user's mistake (one line, no traceback) from a defect in
mirrorkit itself: a bare ``ValueError`` (an unpacking bug's ``too many values
to unpack``), ``RuntimeError`` or ``ImportError`` reaching the command line is
a bug, shown with its traceback and a request to report it.

This module imports nothing from mirrorkit, so any layer can raise these.

Example:
    >>> from mirrorkit.errors import MissingDependency, RunError, UserInputError
    >>> isinstance(RunError("the cluster did not form"), RuntimeError)
    True
    >>> isinstance(UserInputError("`epochs` must be a positive integer"), ValueError)
    True
    >>> str(MissingDependency("bench.png needs matplotlib: pip install matplotlib"))
    'bench.png needs matplotlib: pip install matplotlib'
"""

from __future__ import annotations

__all__ = ["MissingDependency", "RunError", "UserInputError"]


class UserInputError(ValueError):
    """A value the user gave is wrong: the message names it, the value received and what fits.

    For a flag or config field, an environment variable (``MIRRORKIT_*``,
    ``TF_CONFIG``, Slurm's), a file or folder the user names, a dataset spec
    or a hosts list; also a public function's option out of range or an
    unknown name, Keras-style. Not for a wrong value only mirrorkit's own
    code can pass (a helper's precondition, an object of the wrong kind,
    the launcher-worker protocol): those stay plain ``ValueError`` so they
    are reported as bugs. A ``ValueError`` subclass, so ``except ValueError``
    still catches it.

    Example:
        >>> raise UserInputError("`epochs` must be a positive integer. Received: epochs=0")
        Traceback (most recent call last):
        ...
        mirrorkit.errors.UserInputError: `epochs` must be a positive integer. Received: epochs=0
    """


class RunError(RuntimeError):
    """A runtime failure the user can act on: the message says what happened and what to do.

    For example a multi-worker cluster that cannot form, a strategy
    created too late, a rendezvous that does not answer. Not for broken
    invariants inside mirrorkit: those stay plain ``RuntimeError`` so they
    are reported as bugs.

    Example:
        >>> raise RunError("Cannot form the multi-worker cluster: worker 1 did not join.")
        Traceback (most recent call last):
        ...
        mirrorkit.errors.RunError: Cannot form the multi-worker cluster: worker 1 did not join.
    """


class MissingDependency(ImportError):
    """An optional package a feature needs is not installed; the message names the pip command.

    Example:
        >>> err = MissingDependency("The report's PNG needs matplotlib, which is not "
        ...                         'installed: pip install "mirrorkit[bench]"')
        >>> isinstance(err, ImportError), "pip install" in str(err)
        (True, True)
    """
