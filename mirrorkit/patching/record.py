"""What one patch is: a record of what mirrorkit changes in Keras, TensorFlow or Python.

Every place where mirrorkit replaces or wraps behaviour that is not its own
has one :class:`Patch` in :data:`mirrorkit.patching.catalogue.PATCHES`: its
name (what ``MIRRORKIT_COMPAT_DISABLE`` and ``mirrorkit info`` call it), what
it replaces, what that changes, why (an upstream issue or mirrorkit's own
reason), when it is in force, the versions it was tested on, and the test
that shows what breaks with it off.

Example:
    >>> p = Patch("demo", ("keras.Model.fit",), "fit prints hello", "a demo",
    ...           scope="script", kind="adaptation", tested="keras 3.15.1",
    ...           control="tests/patching/test_engine.py")
    >>> p.in_force_when()
    'while `mirrorkit run` runs a script'
"""

from __future__ import annotations

import dataclasses

# The compat matrix (tools/compat_matrix.py, results in tools/compat-matrix/).
TESTED = "tensorflow 2.19.1, 2.20.0 and 2.21.0 with keras 3.15.1"
# Patches added after the last compat-matrix run.
TESTED_LATEST = "tensorflow 2.21.0 with keras 3.15.1"

# When a patch is in force, by scope (what ``mirrorkit info`` says of it).
SCOPES = {
    "process": "once applied, for the rest of the process",
    "multi-worker process": "in a process that joins a multi-worker cluster",
    "worker": "in a Python worker started by `mirrorkit launch`",
    "start-up": "from the start of a `mirrorkit` command and of a Python worker started by "
                "`mirrorkit launch`",
    "script": "while `mirrorkit run` runs a script",
    "multi-worker script": "while `mirrorkit run` runs a script as one worker of a cluster",
    "object": "on the objects mirrorkit creates itself",
}
# "fix": works around an upstream bug (MIRRORKIT_COMPAT=off turns every one off);
# "adaptation": makes stock code behave as mirrorkit promises (chief-only saving...).
KINDS = ("fix", "adaptation")


@dataclasses.dataclass(frozen=True)
class Patch:
    """One change mirrorkit makes to code that is not its own.

    Attributes:
        name: short name for ``MIRRORKIT_COMPAT_DISABLE`` and ``mirrorkit info``.
        targets: dotted names of what is replaced or wrapped.
        changes: what the patch changes, in one sentence.
        reason: the upstream issue (``keras#20585``) or why mirrorkit needs it.
        scope: a key of :data:`SCOPES`.
        kind: ``"fix"`` (an upstream bug) or ``"adaptation"``.
        tested: the versions it was tested on.
        control: the test that shows what breaks with the patch off, or why
            no test can.

    Example:
        >>> Patch("x", ("sys.excepthook",), "c", "r", scope="process", kind="fix",
        ...       tested="t", control="c").kind
        'fix'
    """

    name: str
    targets: tuple[str, ...]
    changes: str
    reason: str
    scope: str
    kind: str
    tested: str
    control: str

    def __post_init__(self) -> None:
        # Programming errors in the catalogue itself, caught by its own tests.
        if self.scope not in SCOPES:
            raise ValueError(f"Patch {self.name!r}: unknown scope. Received: scope="
                             f"{self.scope!r}; accepted: {', '.join(SCOPES)}")
        if self.kind not in KINDS:
            raise ValueError(f"Patch {self.name!r}: unknown kind. Received: kind="
                             f"{self.kind!r}; accepted: {', '.join(KINDS)}")

    def in_force_when(self) -> str:
        """When the patch is in force, in words (see :data:`SCOPES`).

        Example:
            >>> from mirrorkit.patching.catalogue import PATCHES
            >>> PATCHES["script-strategies"].in_force_when()
            'while `mirrorkit run` runs a script'
        """
        return SCOPES[self.scope]

    def to_dict(self) -> dict[str, object]:
        """The record as JSON-ready data (for ``mirrorkit info --json``).

        Example:
            >>> from mirrorkit.patching.catalogue import PATCHES
            >>> PATCHES["scalar-logs"].to_dict()["kind"]
            'fix'
        """
        data = dataclasses.asdict(self)
        data["targets"] = list(self.targets)
        return data
