"""Known upstream TensorFlow/Keras problems, and whether the installed versions have them.

A view, not a second table: each fix's entry is built from its record in
:data:`mirrorkit.patching.PATCHES`; only the problems mirrorkit handles
without a patch are written here. ``mirrorkit info`` warns with it, and
:mod:`mirrorkit.compat` decides from it which fixes to apply.

Example:
    >>> issues = affecting({"keras": "3.15.1", "tensorflow": "2.21.0"})
    >>> "keras-team/keras#20585" in [i.ref for i in issues]
    True
"""

from __future__ import annotations

# What an entry is and how versions compare live in issue_record; they are
# part of this module's documented interface too.
from mirrorkit.compat.issue_record import (
    KnownIssue,
    installed_version,
    parse_version,
    provider,
)
from mirrorkit.patching.catalogue import PATCHES
from mirrorkit.patching.record import (
    TESTED_KERAS,
    TESTED_TENSORFLOW,
    TESTED_TENSORFLOW_LATEST,
    Patch,
)

__all__ = ["KNOWN_ISSUES", "KnownIssue", "TESTED_KERAS", "TESTED_TENSORFLOW",
           "TESTED_TENSORFLOW_LATEST", "affecting", "installed_version", "issue_of", "parse_version",
           "provider"]


# Problems mirrorkit handles by its own design rather than by a patch (the chief-only
# callbacks, the bounded join): no record in the patch table describes them.
_WITHOUT_A_PATCH: tuple[KnownIssue, ...] = (
    KnownIssue(
        "keras-chief-saving", "keras", "3.0", None,
        "BackupAndRestore/ModelCheckpoint/TensorBoard have no chief logic: workers "
        "sharing a path collide on HDF5 locks (BlockingIOError, then UnavailableError).",
        "mirrorkit.callbacks' BackupAndRestore/ModelCheckpoint/TensorBoard and "
        "save_model: only the chief writes the real path.",
    ),
    KnownIssue(
        "tf-mwms-join-wait", "tensorflow", "2.0", None,
        "a MultiWorkerMirroredStrategy worker waits for peers that never start "
        "with no practical bound (still waiting after 90 s; TF's default is an hour).",
        "get_strategy bounds the wait (MIRRORKIT_JOIN_TIMEOUT, default 300 s) and "
        "peer-loss detection (MIRRORKIT_COLLECTIVE_TIMEOUT, default 10 s).",
    ),
)


def issue_of(record: Patch) -> KnownIssue:
    """The known issue a fix's record describes (its bug, what breaks, what the fix does).

    Example:
        >>> from mirrorkit.patching import PATCHES
        >>> issue_of(PATCHES["multi-step"]).ref
        'keras-team/keras#19246'
    """
    bug = record.bug
    return KnownIssue(bug.ref, bug.package, bug.first, bug.fixed, record.reason,
                      f"compat fix {record.name!r} {record.changes}.", bug.tested)


#: Every known upstream problem: one per fix record with a bug, then those above.
KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    *(issue_of(p) for p in PATCHES.values() if p.kind == "fix" and p.bug is not None),
    *_WITHOUT_A_PATCH,
)


def affecting(versions: dict[str, str | None] | None = None) -> list[KnownIssue]:
    """Known issues that affect ``versions`` (default: what is installed).

    Example:
        >>> affecting({"keras": "2.15.0"})
        []
    """
    if versions is None:
        versions = {i.package: installed_version(i.package) for i in KNOWN_ISSUES}
    return [i for i in KNOWN_ISSUES if i.affects(versions.get(i.package))]
