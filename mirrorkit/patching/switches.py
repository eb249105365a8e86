"""Which patches are turned off, by name: ``MIRRORKIT_COMPAT`` and ``MIRRORKIT_COMPAT_DISABLE``.

``MIRRORKIT_COMPAT=off`` turns off every ``fix`` (upstream-bug workaround) of
:data:`~mirrorkit.patching.catalogue.PATCHES`; ``MIRRORKIT_COMPAT_DISABLE`` is
a comma-separated list of any patch names, ``all`` meaning every fix. A name
that is not in the catalogue is one clear error, never ignored.

Example:
    >>> from mirrorkit._env import patch
    >>> with patch({"MIRRORKIT_COMPAT_DISABLE": "chief-only-model-save"}):
    ...     sorted(disabled())
    ['chief-only-model-save']
"""

from __future__ import annotations

from typing import Iterable

from mirrorkit import _env
from mirrorkit.errors import UserInputError
from mirrorkit.patching.catalogue import PATCHES


def fix_names() -> list[str]:
    """The names of every ``fix`` patch, in catalogue order (what ``all`` means).

    Example:
        >>> fix_names()[:2]
        ['symbolic-build', 'scalar-logs']
    """
    return [name for name, p in PATCHES.items() if p.kind == "fix"]


def check_names(names: Iterable[str], where: str) -> set[str]:
    """The patch names in ``names``, checked; ``all`` stands for every fix.

    Args:
        names: names as a user wrote them (blanks ignored).
        where: where they came from, for the error (``"disable"``, a variable name).

    Raises:
        UserInputError: a name that is not a patch (the accepted ones listed).

    Example:
        >>> sorted(check_names(["multi-step", " "], "disable"))
        ['multi-step']
    """
    chosen = {n.strip() for n in names if n and n.strip()}
    unknown = sorted(chosen - set(PATCHES) - {"all"})
    if unknown:
        raise UserInputError(
            f"Unknown compat fix in {where}. Received: {', '.join(unknown)}; "
            f"accepted: all, {', '.join(PATCHES)}")
    if "all" in chosen:
        chosen = (chosen - {"all"}) | set(fix_names())
    return chosen


def disabled() -> set[str]:
    """The patch names the environment turns off, checked.

    ``MIRRORKIT_COMPAT=off`` (or ``0``/``false``/``no``) turns off every fix;
    ``MIRRORKIT_COMPAT_DISABLE`` adds any names.

    Raises:
        UserInputError: ``MIRRORKIT_COMPAT_DISABLE`` names an unknown patch.

    Example:
        >>> from mirrorkit._env import patch
        >>> with patch({"MIRRORKIT_COMPAT": "off"}):
        ...     "scalar-logs" in disabled() and "script-strategies" not in disabled()
        True
    """
    off = check_names(_env.compat_disabled(), _env.COMPAT_DISABLE)
    if not _env.compat_enabled():
        off |= set(fix_names())
    return off


def is_disabled(name: str) -> bool:
    """True when the environment turns patch ``name`` off.

    Example:
        >>> is_disabled("script-strategies")
        False
    """
    return name in disabled()
