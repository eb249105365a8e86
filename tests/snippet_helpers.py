"""Helpers importable by the snippets ``conftest.run_snippet`` runs in fresh processes."""

from __future__ import annotations

from typing import Any, Callable


def errors(fn: Callable[[], Any]) -> str | None:
    """Call ``fn``; return the ValueError message it raised, or None if it did not raise."""
    try:
        fn()
    except ValueError as err:
        return str(err)
    return None


def without_fix(name: str, fn: Callable[[], Any]) -> str:
    """Disable mirrorkit's compat fix ``name`` (``"a,b"``: several), call ``fn``; return upstream's error.

    ``"no error"`` when ``fn`` succeeded, i.e. upstream no longer needs the fix.
    """
    from mirrorkit import compat

    compat.apply(disable=name.split(","))
    try:
        fn()
    except Exception as err:  # whatever upstream raises is what the test records
        return str(err)
    return "no error"
