"""The errors mirrorkit raises for problems a user can fix, apart from ``ValueError``.

A bad argument is a ``ValueError``, a missing or existing path the matching
``OSError``; everything else a user can fix is one of the types below. They
subclass the builtins that callers already catch (``except RuntimeError``
still catches a :class:`RunError`), and they are what lets the command line
tell a user's mistake (one line, no traceback) from a defect in mirrorkit
itself: a bare ``RuntimeError`` or ``ImportError`` reaching the command line
is a bug, shown with its traceback and a request to report it.

This module imports nothing from mirrorkit, so any layer can raise these.

Example:
    >>> from mirrorkit.errors import MissingDependency, RunError
    >>> isinstance(RunError("the cluster did not form"), RuntimeError)
    True
    >>> str(MissingDependency("bench.png needs matplotlib: pip install matplotlib"))
    'bench.png needs matplotlib: pip install matplotlib'
"""

from __future__ import annotations

__all__ = ["MissingDependency", "RunError"]


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

