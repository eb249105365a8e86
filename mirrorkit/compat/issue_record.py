"""One known upstream problem, and the version arithmetic that decides whether it applies.

The table of the problems mirrorkit knows is :mod:`mirrorkit.compat.known_issues`;
this module holds what an entry is and how versions compare (as pip compares
them, with :mod:`packaging.version`).

Example:
    >>> issue = KnownIssue("x#1", "keras", "3.2", "3.4", "what breaks", "what mirrorkit does")
    >>> issue.affects("3.3.1"), issue.affects("3.4.0")
    (True, False)
"""

from __future__ import annotations

import dataclasses

from packaging.version import InvalidVersion, Version

# Where the installed versions come from; part of this module's interface too.
from mirrorkit.patching.versions import installed_version, provider

__all__ = ["KnownIssue", "installed_version", "parse_version", "provider"]


@dataclasses.dataclass(frozen=True)
class KnownIssue:
    """One upstream problem.

    Attributes:
        ref: short upstream reference, e.g. ``"keras#20585"``.
        package: the package whose versions are affected.
        first: first affected version (inclusive).
        fixed: first fixed version, or None while unfixed upstream.
        summary: what breaks, in one sentence.
        handling: what mirrorkit does about it.
        tested: ``(oldest, newest)`` versions of :attr:`package` on which
            mirrorkit's test matrix (tools/compat_matrix.py) reproduced the
            problem, or None. Inside that range a fix trusts this table;
            outside it, a fix probes or assumes it is needed.

    Versions compare as PEP 440 versions (:func:`parse_version`). When in
    doubt the answer is the one that applies the fix, which is harmless
    without the bug: a pre-release counts as tested only when it is itself
    an end of :attr:`tested` (the matrix tests releases, so ``2.21.0rc1`` is
    untested although it sorts inside ``("2.19.1", "2.21.0")``); a
    pre-release of :attr:`first` is affected (the bug is in the release, so
    it was in its candidates), and so is one of :attr:`fixed` (the fix may
    land only in the final release). A local build (``2.21.0+cu121``) counts
    as its release. A version that does not parse is untested and affected.
    """

    ref: str
    package: str
    first: str
    fixed: str | None
    summary: str
    handling: str
    tested: tuple[str, str] | None = None

    def tested_on(self, version: str | None) -> bool:
        """True when ``version`` lies inside :attr:`tested`.

        Example:
            >>> issue = KnownIssue("x#1", "keras", "3.0", None, "-", "-", ("3.15.1", "3.15.1"))
            >>> issue.tested_on("3.15.1"), issue.tested_on("4.0"), issue.tested_on("3.15.1rc1")
            (True, False, False)
        """
        if version is None or self.tested is None:
            return False
        try:
            # A local label (2.21.0+cu121) is a build of the same release.
            v = Version(parse_version(version).public)
        except ValueError:
            return False
        low, high = (parse_version(end) for end in self.tested)
        if v.is_prerelease and v not in (low, high):
            return False
        return low <= v <= high

    def affects(self, version: str | None) -> bool:
        """True when ``version`` of :attr:`package` has the problem.

        Example:
            >>> issue = KnownIssue("x#1", "keras", "3.2", "3.4", "-", "-")
            >>> [issue.affects(v) for v in ("3.1.9", "3.2.0rc1", "3.3", "3.4.0rc2", "3.4.0")]
            [False, True, True, True, False]
        """
        if version is None:
            return False
        try:
            v = parse_version(version)
        except ValueError:
            return True
        # Compared on the release: 3.2.0rc1 already carries 3.2's bug.
        if Version(v.base_version) < parse_version(self.first):
            return False
        return self.fixed is None or v < parse_version(self.fixed)


def parse_version(text: str) -> Version:
    """Turn ``"3.15.1"`` (or ``"2.21.0rc1"``, ``"2.22.0.dev20250101"``) into a PEP 440 version.

    Pre-releases sort before their release, as pip sorts them.

    Raises:
        ValueError: when ``text`` is not a PEP 440 version.

    Example:
        >>> parse_version("2.21.0rc1") < parse_version("2.21.0") < parse_version("2.21.1")
        True
        >>> parse_version("3.15") == parse_version("3.15.0")
        True
    """
    try:
        return Version(text)
    except InvalidVersion as err:
        raise ValueError(f"`text` must be a PEP 440 version such as '2.21.0'. "
                         f"Received: text={text!r}") from err
