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
