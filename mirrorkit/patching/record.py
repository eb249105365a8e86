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

# The compat matrix (tools/compat_matrix.py, results in tools/compat-matrix/), and the
# nightly pair of constraints/nightly.txt that `.ci/run` tests every fix on.
TESTED = ("tensorflow 2.19.1, 2.20.0 and 2.21.0 with keras 3.15.1; tf-nightly 2.23.0.dev20261026 "
          "with keras-nightly 3.16.0.dev2026102704")
# Patches added after the last compat-matrix run.
TESTED_LATEST = ("tensorflow 2.21.0 with keras 3.15.1; tf-nightly 2.23.0.dev20261026 with "
                 "keras-nightly 3.16.0.dev2026102704")
# The same, as (oldest, newest) versions of the package a bug is judged by: inside the
# range a fix trusts its record (the bug is there); outside, its probe decides.
TESTED_KERAS = ("3.15.1", "3.16.0.dev2026102704")
TESTED_TENSORFLOW = ("2.19.1", "2.23.0.dev20261026")
TESTED_TENSORFLOW_LATEST = ("2.21.0", "2.23.0.dev20261026")

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
class Target:
    """One spot a fix patches: an attribute of the owner that plays ``role``, and its wrapper.

    Attributes:
        role: a key of :data:`mirrorkit.patching.targets.ROLES` (found by what
            it does; every private spelling recorded there).
        attr: the attribute replaced on it.
        make: ``"module:function"`` in :mod:`mirrorkit.compat` that builds the
            replacement from the original (resolved when the fix applies).

    Example:
        >>> Target("backend-trainer", "_make_function", "multistep:make").dotted()
        '<backend-trainer>._make_function'
    """

    role: str
    attr: str
    make: str

    def dotted(self) -> str:
        """The target as the role's name and the attribute (what ``mirrorkit info`` lists)."""
        return f"<{self.role}>.{self.attr}"


@dataclasses.dataclass(frozen=True)
class Bug:
    """The upstream bug a fix works around, and how mirrorkit knows it is there.

    Attributes:
        package: whose versions decide (``"keras"`` or ``"tensorflow"``).
        first: first affected version.
        fixed: first fixed version, or None while unfixed upstream.
        tested: ``(oldest, newest)`` versions of :attr:`package` on which
            mirrorkit's tests showed the bug (the control test, fix off); None
            when only a probe can tell.
        error: a fragment of the error or the symptom, as users see it.
        upstream: the upstream reports (``"keras-team/keras#20585"``), best
            first; empty when none exists.
        repro: a standalone reproduction in this repository that could be
            filed as it is (``upstream_repros/...``), or None.
        check: the fix names the problem in one line and changes no number
            (only the script can make it exact): its probe sees the bug with
            the fix applied too.

    Example:
        >>> Bug("keras", "3.0", None, TESTED_KERAS, "boom", ("keras-team/keras#1",)).ref
        'keras-team/keras#1'
    """

    package: str
    first: str
    fixed: str | None
    tested: tuple[str, str] | None
    error: str
    upstream: tuple[str, ...] = ()
    repro: str | None = None
    check: bool = False

    @property
    def ref(self) -> str:
        """The best upstream report, else the reproduction, else ``"no upstream report"``."""
        if self.upstream:
            return self.upstream[0]
        return f"no upstream report ({self.repro})" if self.repro else "no upstream report"


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
        bug: for a fix, the upstream bug (versions, report, reproduction).
        probe: for a fix, ``"module:function"`` in :mod:`mirrorkit.compat` that
            shows on a strategy whether the bug is there (True/False/None).

    A fix's ``targets`` are :class:`Target` records (found by role, patched
    by :mod:`mirrorkit.compat`); other patches name theirs as text.

    Example:
        >>> Patch("x", ("sys.excepthook",), "c", "r", scope="process", kind="fix",
        ...       tested="t", control="c").kind
        'fix'
    """

    name: str
    targets: tuple[str | Target, ...]
    changes: str
    reason: str
    scope: str
    kind: str
    tested: str
    control: str
    bug: Bug | None = None
    probe: str | None = None

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
        data["targets"] = self.target_names()
        if self.bug is not None:
            data["bug"]["upstream"] = list(self.bug.upstream)
            data["ref"] = self.bug.ref
        return data

    def target_names(self) -> list[str]:
        """Every target as text (a fix's spots as ``<role>.attribute``).

        Example:
            >>> from mirrorkit.patching.catalogue import PATCHES
            >>> PATCHES["multi-step"].target_names()
            ['<backend-trainer>._make_function']
        """
        return [t.dotted() if isinstance(t, Target) else t for t in self.targets]

    def mechanics(self) -> tuple[Target, ...]:
        """The spots a fix patches through :mod:`mirrorkit.compat` (none for the others).

        Example:
            >>> from mirrorkit.patching.catalogue import PATCHES
            >>> PATCHES["scalar-logs"].mechanics()[0].attr
            'reduce_per_replica'
        """
        return tuple(t for t in self.targets if isinstance(t, Target))


def fix_record(name: str, *, targets: tuple[str | Target, ...], changes: str, reason: str,
               control: str, bug: Bug | None = None, probe: str | None = None,
               scope: str = "process",
               tested: str = TESTED) -> Patch:
    """One upstream fix's record (kind ``"fix"``), keyword by keyword.

    Example:
        >>> fix_record("demo", targets=(Target("loss", "__call__", "x:make"),), changes="c",
        ...            reason="r", control="tests/x.py").kind
        'fix'
    """
    return Patch(name, targets, changes, reason, scope=scope, kind="fix", tested=tested,
                 control=control, bug=bug, probe=probe)
