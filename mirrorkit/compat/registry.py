"""The registry of upstream fixes: each a named :class:`Fix`, applied where needed.

A fix knows its upstream issue, the error it prevents, the Keras function it
wraps and how to tell whether the installed Keras has the bug (a tested
version table, else a behavioural probe, else applied in doubt: see
:mod:`mirrorkit.compat.fix`). Every fix is idempotent, applied only when
needed, and can be turned off by name (``apply(disable=[...])``,
``MIRRORKIT_COMPAT=off``, ``MIRRORKIT_COMPAT_DISABLE=a,b``). Targets are
found by role (:mod:`mirrorkit.patching.targets`), so a release that renames
a private class or moves a module changes nothing here. A fix whose target
is gone all the same is ``not-needed`` when its probe shows the bug gone
too; otherwise :func:`apply` stops with :class:`~mirrorkit.compat.failures.FixMissing`
naming the fix and ``MIRRORKIT_COMPAT_DISABLE``: a strategy that trains
with the bug silently is worse than one that is not created. Each fix is
described once, by its record in :data:`mirrorkit.patching.PATCHES`; the
mechanics here are built from it (its targets name the ``make`` functions,
one module each of :mod:`mirrorkit.compat`). A function several fixes change
is wrapped once, their layers in the order :mod:`mirrorkit.patching.spots`
writes, so the order fixes are applied in decides nothing. One
more is a process setting (:mod:`~mirrorkit.compat.allocator`,
``malloc-thresholds``): :func:`apply` runs it and it is turned off by name
like the others, but it is not in :data:`FIXES` nor in :func:`apply`'s result.

Example:
    >>> sorted(FIXES)[:3]
    ['batch-sum-losses', 'batch-wide-metrics', 'cross-replica-step']
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Callable, Iterable

from mirrorkit import _env
from mirrorkit.compat import allocator, known_issues
from mirrorkit.compat.failures import FixMissing
from mirrorkit.compat.fix import Decision, Fix, FixUnavailable
from mirrorkit.patching import switches
from mirrorkit.patching.catalogue import PATCHES
from mirrorkit.patching.record import Patch

logger = logging.getLogger(__name__)


# Status values :func:`apply` and :func:`status` report for each fix.
APPLIED = "applied"
NOT_NEEDED = "not-needed"
DISABLED = "disabled"
NOT_APPLIED = "not-applied"
UNAVAILABLE = "unavailable"


def _resolve(ref: str) -> Callable[..., Any]:
    """``"module:function"`` of :mod:`mirrorkit.compat` -> the function."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(f"mirrorkit.compat.{module}"), name)


def _mechanics(record: Patch) -> Fix:
    first, *rest = record.mechanics()
    return Fix(record.name, record.bug.error if record.bug else "", (first.role, first.attr),
               _resolve(first.make), _resolve(record.probe) if record.probe else None,
               tuple((t.role, t.attr, _resolve(t.make)) for t in rest))


# The mechanics of every fix that patches through this package, built from its record
# in mirrorkit.patching (the one table). Their order decides nothing: a function several
# fixes change is one spot (mirrorkit.patching.spots).
FIXES: dict[str, Fix] = {record.name: _mechanics(record) for record in PATCHES.values()
                         if record.kind == "fix" and record.mechanics()}

# Per process: each fix's decision (probes run once) and the fixes whose
# unavailability was already reported.
_DECISIONS: dict[str, Decision] = {}
_UNAVAILABLE: dict[str, str] = {}


def disabled_by_environment() -> set[str]:
    """The patch names ``MIRRORKIT_COMPAT`` / ``MIRRORKIT_COMPAT_DISABLE`` turn off, checked.

    Where no fix is applied (the default strategy) a misspelt name must
    still fail as it does everywhere else, not be ignored.

    Raises:
        ValueError: an unknown name (the accepted ones listed).

    Example:
        >>> from mirrorkit._env import patch
        >>> with patch({"MIRRORKIT_COMPAT_DISABLE": "multi-step"}):
        ...     sorted(disabled_by_environment())
        ['multi-step']
    """
    return switches.disabled()


def _keras_is_tensorflow() -> bool:
    import keras

    return keras.backend.backend() == "tensorflow"


def _versions() -> str:
    return ", ".join(f"{p} {known_issues.installed_version(p)}" for p in ("tensorflow", "keras"))


def _unavailable(fix: Fix, err: FixUnavailable, strategy: Any) -> str:
    """A fix whose target is gone: not needed (its probe says so), or mirrorkit stops."""
    _UNAVAILABLE[fix.name] = err.why
    decision = _decision(fix, strategy)
    if not decision.needed:
        return NOT_NEEDED
    raise FixMissing(fix.name, fix.ref, err.why, _versions()) from err


def _missing_target(fix: Fix) -> str:
    try:
        fix.find_targets()
    except FixUnavailable as err:
        return err.why
    return "its target is not in this Keras"


def _decision(fix: Fix, strategy: Any) -> Decision:
    known = _DECISIONS.get(fix.name)
    # An "assumed" answer may still be settled by a probe on a later strategy.
    if known is None or (known.how == "assumed" and strategy is not None):
        known = _DECISIONS[fix.name] = fix.decide(strategy)
    return known


def _apply_one(fix: Fix, strategy: Any) -> str:
    if fix.is_applied():
        return APPLIED
    try:
        fix.find_targets()  # every target must exist before anything else is decided
    except FixUnavailable as err:
        return _unavailable(fix, err, strategy)
    if not _decision(fix, strategy).needed:
        return NOT_NEEDED
    try:
        fix.apply()
    except FixUnavailable as err:
        return _unavailable(fix, err, strategy)
    return APPLIED


def apply(*, disable: Iterable[str] | None = None, strategy: Any = None) -> dict[str, str]:
    """Apply every needed fix for Keras 3 under ``tf.distribute``.

    Safe to call many times and under any strategy: a patched function
    behaves exactly like the original unless batches are split across
    replicas (``symbolic-build``: 2+ replicas or multi-worker mode;
    ``scalar-logs``: a ``MultiWorkerMirroredStrategy`` in multi-worker mode;
    ``multi-step``: ``steps_per_execution > 1`` with 2+ replicas).

    Args:
        disable: fix names to leave out (``"all"`` for every fix). Defaults to
            ``MIRRORKIT_COMPAT=off`` (all) / ``MIRRORKIT_COMPAT_DISABLE``
            (comma-separated names), else none. A disabled fix that was
            applied earlier in this process is reverted.
        strategy: the strategy about to train; lets a fix probe for its bug
            when the installed Keras is outside the tested range. Defaults to
            None (no probe).

    Returns:
        Fix name -> ``"applied"``, ``"not-needed"``, ``"disabled"`` or ``"unavailable"``.

    Raises:
        ValueError: for an unknown fix name.
        FixMissing: a fix is needed (by the version table, its probe, or in
            doubt) but its target is not in this Keras/TensorFlow.

    Example:
        >>> from mirrorkit import compat
        >>> compat.apply(disable=["scalar-logs"])            # doctest: +SKIP
        {'symbolic-build': 'applied', 'scalar-logs': 'disabled', 'multi-step': 'applied'}
    """
    skip = disabled_by_environment() if disable is None else switches.check_names(
        [disable] if isinstance(disable, str) else disable, "disable")
    if not _keras_is_tensorflow():
        # Other backends never reach the TF trainer; nothing to patch.
        return {name: NOT_NEEDED for name in FIXES}
    for name in skip:
        if name in FIXES:
            # A layer of a shared function comes out alone (engine.join).
            FIXES[name].revert()
    result: dict[str, str] = {}
    for name, fix in FIXES.items():
        if name in skip:
            result[name] = DISABLED
        else:
            result[name] = _apply_one(fix, strategy)
    # Not a Keras fix: TensorFlow's allocator setting (2x slower CPU steps);
    # reported by mirrorkit info, not in this dict.
    allocator.restore(disabled=allocator.NAME in skip)
    logger.info("mirrorkit.compat: %s", ", ".join(f"{k}={v}" for k, v in result.items()))
    return result


def status() -> dict[str, str]:
    """Report each fix as ``applied``, ``not-needed``, ``not-applied`` or ``unavailable``.

    Example:
        >>> from mirrorkit import compat
        >>> compat.status()                                  # doctest: +SKIP
        {'symbolic-build': 'not-applied', 'scalar-logs': 'not-applied', 'multi-step': 'not-applied'}
    """
    out = {}
    for name, fix in FIXES.items():
        try:
            fix.find_targets()
        except FixUnavailable:
            out[name] = UNAVAILABLE
            continue
        if fix.is_applied():
            out[name] = APPLIED
        else:
            out[name] = NOT_APPLIED if _decision(fix, None).needed else NOT_NEEDED
    return out


def works(name: str, replicas: int) -> bool:
    """True when what fix ``name`` makes possible works here (for features that depend on it).

    With one replica nothing is split and Keras's own code works; with more,
    the fix must be applied or not needed.

    Example:
        >>> works("multi-step", replicas=1)
        True
    """
    if replicas <= 1:
        return True
    return status()[name] in (APPLIED, NOT_NEEDED)


def decisions() -> dict[str, dict[str, str]]:
    """Each fix's status, how its need was decided, and why (for ``mirrorkit info``).

    Fixes turned off by ``MIRRORKIT_COMPAT``/``MIRRORKIT_COMPAT_DISABLE`` read
    ``disabled``.

    Raises:
        ValueError: ``MIRRORKIT_COMPAT_DISABLE`` names an unknown fix.

    Example:
        >>> from mirrorkit import compat
        >>> compat.decisions()["multi-step"]["how"]          # doctest: +SKIP
        'version table'
    """
    current = status()
    off = disabled_by_environment()
    out = {}
    for name, fix in FIXES.items():
        if name in off:
            out[name] = {"status": DISABLED, "ref": fix.ref, "how": "environment",
                         "detail": f"{_env.COMPAT} / {_env.COMPAT_DISABLE}"}
            continue
        decision = _decision(fix, None)
        if current[name] == UNAVAILABLE:
            why = _UNAVAILABLE.get(name) or _missing_target(fix)
            consequence = ("a strategy with 2+ replicas stops with an error naming it"
                           if decision.needed else "not needed here")
            out[name] = {"status": UNAVAILABLE, "ref": fix.ref, "how": "target missing",
                         "detail": f"{why}; {decision.detail}: {consequence}"}
            continue
        out[name] = {"status": current[name], "ref": fix.ref, "how": decision.how,
                     "detail": decision.detail}
    return out


def revert() -> None:
    """Undo every applied fix and forget decisions (restores Keras's own functions; for tests).

    Example:
        >>> from mirrorkit import compat
        >>> compat.revert()                                  # doctest: +SKIP
    """
    for fix in reversed(FIXES.values()):
        try:
            fix.revert()
        except FixUnavailable:
            pass
    _DECISIONS.clear()
    _UNAVAILABLE.clear()
