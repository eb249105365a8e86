"""One upstream fix: its target, how it knows it is needed, and how it patches.

A :class:`Fix` decides whether the installed Keras has its bug in one of
three ways, recorded as :attr:`Decision.how`:

``version table``
    The installed Keras is inside the range on which mirrorkit's test matrix
    showed the bug (:attr:`mirrorkit.compat.known_issues.KnownIssue.tested`):
    the table's answer holds, with no work at run time.
``probe``
    Outside that range, a small run of the bug's own behaviour on the strategy
    at hand (:mod:`mirrorkit.compat.probes`), once per process, tells.
``assumed``
    Outside the range and with nothing to probe on (one replica, or a bug that
    only shows across workers): the fix is applied. Every patch behaves like
    the code it wraps when the bug is absent, so applying it in doubt is safe;
    leaving it out in doubt is what breaks training.

The source text of Keras is never consulted: a harmless upstream refactor
(a renamed local, a decorator around the method) changes nothing here. When
the target itself is gone or cannot be patched, :meth:`Fix.apply` raises
:class:`FixUnavailable`, which the registry turns into one warning and the
``unavailable`` status.

Example:
    >>> from mirrorkit.compat import FIXES
    >>> FIXES["multi-step"].decide(None, keras_version="3.15.1").how
    'version table'
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

from mirrorkit.compat import known_issues
from mirrorkit.patching import engine, spots, targets
from mirrorkit.patching.catalogue import PATCHES
from mirrorkit.patching.spots import SPOTS


class FixUnavailable(RuntimeError):
    """The fix's target cannot be found or patched in the installed Keras.

    Example:
        >>> str(FixUnavailable("multi-step", "no attribute '_make_function'"))
        "multi-step: no attribute '_make_function'"
    """

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"{name}: {why}")
        self.name, self.why = name, why


@dataclasses.dataclass(frozen=True)
class Decision:
    """Whether a fix is needed, and how that was decided.

    Attributes:
        needed: True when the installed Keras has the bug (or may have it).
        how: ``"version table"``, ``"probe"`` or ``"assumed"``.
        detail: one phrase for ``mirrorkit info`` (the version, the probe's finding).

    Example:
        >>> Decision(True, "assumed", "keras 9.0 is untested").needed
        True
    """

    needed: bool
    how: str
    detail: str


@dataclasses.dataclass(frozen=True)
class Fix:
    """One upstream failure and the patch that works around it.

    Its record (what it changes, the upstream issue, the versions tested) is
    ``PATCHES[name]`` in :mod:`mirrorkit.patching.catalogue`; this object holds
    the mechanics. It is installed through :mod:`mirrorkit.patching.engine`.

    Attributes:
        name: short name used by ``disable=`` and ``MIRRORKIT_COMPAT_DISABLE``.
        error: a fragment of the upstream error message (tests assert it).
        target: ``(module, attribute, class or None)`` of the patched function.
        make: builds the patched function from the original.
        probe: ``probe(strategy)`` -> True when the bug shows, False when it
            does not, None when it cannot tell on that strategy.
        also: further spots patched under the same name, each ``(role,
            attribute, make)``; every one must exist, or the fix is unavailable.
    """

    name: str
    error: str
    target: tuple[str, str]
    make: Callable[[Callable[..., Any]], Callable[..., Any]]
    probe: Callable[[Any], bool | None] | None = None
    also: tuple[tuple[str, str, Callable[..., Any]], ...] = ()

    @property
    def ref(self) -> str:
        """The upstream report (``keras-team/keras#20585``), or where the reproduction is."""
        return PATCHES[self.name].bug.ref

    @property
    def summary(self) -> str:
        """What breaks without the fix, in one sentence."""
        return PATCHES[self.name].reason

    def where(self) -> list[str]:
        """Every patched spot as found in this Keras/TensorFlow (``module.Class.attr``).

        Example:
            >>> from mirrorkit.compat import FIXES
            >>> FIXES["scalar-logs"].where()                      # doctest: +SKIP
            ['keras.src.backend.tensorflow.trainer.reduce_per_replica']
        """
        return [targets.describe(role, attr) for (role, attr), _ in self._specs()]

    def _specs(self) -> list[tuple[tuple[str, str], Callable[..., Any]]]:
        return [(self.target, self.make)] + [((role, attr), make)
                                             for role, attr, make in self.also]

    def find_targets(self) -> None:
        """Check that every spot this fix patches exists here.

        Raises:
            FixUnavailable: naming the first spot that does not.

        Example:
            >>> from mirrorkit.compat import FIXES
            >>> FIXES["scalar-logs"].find_targets()               # doctest: +SKIP
        """
        self._targets()

    def _targets(self) -> list[tuple[tuple[str, str], Callable[..., Any]]]:
        # Every spot must be there: a fix half applied is a fix silently off
        # for whatever the missing half covered.
        for target, _ in self._specs():
            self._owner(target)
        return self._specs()

    def _owner(self, target: tuple[str, str] | None = None) -> Any:
        role, attr = target or self.target
        try:
            owner = targets.owner(role)
            getattr(owner, attr)
        except (LookupError, AttributeError) as err:
            raise FixUnavailable(self.name, f"{targets.describe(role, attr)} is not in this "
                                 f"Keras/TensorFlow ({err})") from err
        return owner

    def _original(self, target: tuple[str, str] | None = None) -> Any:
        """What this fix wraps at ``target``: the value there now.

        Never this fix's own wrapper: :meth:`apply` returns early when this
        fix is anywhere in the chain. A function other fixes change too is a
        spot (:mod:`mirrorkit.patching.spots`), joined rather than wrapped.
        """
        target = target or self.target
        # Class attributes are read from the class __dict__ so a property
        # (Variable.handle) is the property object itself.
        owner = self._owner(target)
        return vars(owner).get(target[1], getattr(owner, target[1])) \
            if isinstance(owner, type) else getattr(owner, target[1])

    def issue(self) -> known_issues.KnownIssue:
        """The known-issue entry of this fix (its tested version range), from its record.

        Example:
            >>> from mirrorkit.compat import FIXES
            >>> FIXES["scalar-logs"].issue().ref
            'tensorflow/tensorflow#72388'
        """
        return known_issues.issue_of(PATCHES[self.name])

    def decide(self, strategy: Any = None, *, keras_version: str | None = None) -> Decision:
        """Decide whether this fix is needed (see the module docstring).

        Args:
            strategy: the strategy a probe may run on; None: no probe.
            keras_version: the Keras version to judge. Defaults to the installed one.

        Example:
            >>> from mirrorkit.compat import FIXES
            >>> FIXES["scalar-logs"].decide(None, keras_version="9.0").how
            'assumed'
        """
        issue = self.issue()
        version = keras_version or known_issues.installed_version(issue.package) or "0"
        if issue.tested_on(version):
            affected = issue.affects(version)
            return Decision(affected, "version table",
                            f"{issue.package} {version} {'has' if affected else 'is free of'} "
                            f"the bug ({issue.ref}; tested {issue.tested[0]}-{issue.tested[1]})")
        found = None
        if self.probe is not None and strategy is not None:
            try:
                found = self.probe(strategy)
            except Exception:  # noqa: BLE001 -- a probe that breaks decides nothing
                found = None
        if found is not None:
            return Decision(found, "probe", f"{issue.package} {version} is untested; a probe "
                            f"{'reproduced' if found else 'did not reproduce'} the bug "
                            f"({issue.ref})")
        return Decision(True, "assumed", f"{issue.package} {version} is untested and there is "
                        "nothing to probe on here; applied (harmless without the bug)")

    def _current(self, target: tuple[str, str]) -> Any:
        owner = self._owner(target)
        return vars(owner).get(target[1]) if isinstance(owner, type) \
            else getattr(owner, target[1])

    def is_applied(self) -> bool:
        """True when the patch is in place in this process (False if the target is gone)."""
        try:
            current = self._current(self.target)
        except FixUnavailable:
            return False
        return any(engine.patched_by(layer) == self.name or self.name in spots.layers(layer)
                   for layer in engine.chain(current))

    def apply(self) -> None:
        """Patch the target (idempotent).

        Raises:
            FixUnavailable: the target is missing or the patch cannot be built.
        """
        if self.is_applied():
            return
        self._original()  # the main target must exist
        try:
            for target, make in self._targets():
                if target in SPOTS:
                    # Changed by other fixes too: one wrapper, layers in the spot's order.
                    engine.join(self.name, self._owner(target), target[1], make, SPOTS[target],
                                force=True)
                    continue
                original = self._original(target)
                # The registry has decided (disable=, the environment): force.
                engine.replace(self.name, self._owner(target), target[1],
                               lambda _current, make=make, original=original:
                               _wrapped(make, original), force=True)
        except FixUnavailable:
            self.revert()
            raise
        except Exception as err:  # noqa: BLE001 -- any failure to patch turns the fix off
            self.revert()
            raise FixUnavailable(self.name, f"cannot patch it ({type(err).__name__}: {err})") \
                from err

    def revert(self) -> None:
        """Put Keras's own functions back (a no-op where not applied or gone)."""
        engine.undo(self.name)

    def _has_target(self) -> bool:
        try:
            self._owner()
        except FixUnavailable:
            return False
        return True


def _wrapped(make: Callable[[Any], Any], original: Any) -> Any:
    patched = make(original)
    if callable(patched) and not isinstance(patched, property):
        functools.update_wrapper(patched, original)
    return patched
