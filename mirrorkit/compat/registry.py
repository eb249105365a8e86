"""The registry of upstream fixes: each a named :class:`Fix`, applied where needed.

A fix knows its upstream issue, the error it prevents, the Keras function it
wraps and how to tell whether the installed Keras still has the bug. Every
fix is idempotent, applied only when needed, and can be turned off by name
(``apply(disable=[...])``, ``MIRRORKIT_COMPAT=off``,
``MIRRORKIT_COMPAT_DISABLE=a,b``). The fixes themselves live in one module
each: :mod:`~mirrorkit.compat.symbolic_build`,
:mod:`~mirrorkit.compat.scalar_logs`, :mod:`~mirrorkit.compat.multistep`.

Example:
    >>> sorted(FIXES)
    ['multi-step', 'scalar-logs', 'symbolic-build']
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
from typing import Any, Callable, Iterable

from mirrorkit import _env
from mirrorkit.compat import multistep, scalar_logs, symbolic_build

logger = logging.getLogger(__name__)


_TRAINER = "keras.src.backend.tensorflow.trainer"


@dataclasses.dataclass(frozen=True)
class Fix:
    """One upstream failure and the patch that works around it.

    Attributes:
        name: short name used by ``disable=`` and ``MIRRORKIT_COMPAT_DISABLE``.
        ref: the upstream issue, as listed in :mod:`mirrorkit.compat.known_issues`.
        summary: what breaks without the fix, in one sentence.
        error: a fragment of the upstream error message (tests assert it).
    """

    name: str
    ref: str
    summary: str
    error: str
    _target: tuple[str, str, str | None]   # (module, attribute, class or None)
    _broken_marker: str                    # source text of the broken call
    _make: Callable[[Callable[..., Any]], Callable[..., Any]]

    def _owner(self) -> Any:
        import importlib

        module, _attr, cls = self._target
        owner = importlib.import_module(module)
        return getattr(owner, cls) if cls else owner

    def _original(self) -> Callable[..., Any]:
        current = getattr(self._owner(), self._target[1])
        return getattr(current, "__mirrorkit_original__", current)

    def needed(self) -> bool:
        """True when the installed Keras still has the broken code path.

        Example:
            >>> FIXES["scalar-logs"].needed()                # doctest: +SKIP
            True
        """
        try:
            source = inspect.getsource(self._original())
        except (OSError, TypeError):
            # No source (zipped or compiled install): trust the version range.
            from mirrorkit.compat import known_issues as upstream

            return any(i.ref == self.ref for i in upstream.affecting())
        return self._broken_marker in _squash(source)

    def is_applied(self) -> bool:
        """True when the patch is in place in this process."""
        current = getattr(self._owner(), self._target[1])
        return getattr(current, "__mirrorkit_fix__", None) == self.name

    def _apply(self) -> None:
        if self.is_applied():
            return
        original = self._original()
        patched = self._make(original)
        functools.update_wrapper(patched, original)
        patched.__mirrorkit_fix__ = self.name  # type: ignore[attr-defined]
        patched.__mirrorkit_original__ = original  # type: ignore[attr-defined]
        setattr(self._owner(), self._target[1], patched)

    def _revert(self) -> None:
        if self.is_applied():
            setattr(self._owner(), self._target[1], self._original())


def _squash(text: str) -> str:
    # Compare code without whitespace so reformatting upstream does not matter.
    return "".join(text.split())


# Status values :func:`apply` and :func:`status` report for each fix.
APPLIED = "applied"
NOT_NEEDED = "not-needed"
DISABLED = "disabled"
NOT_APPLIED = "not-applied"

FIXES: dict[str, Fix] = {fix.name: fix for fix in (
    Fix("symbolic-build", "keras#20585",
        "fit/evaluate reduce a PerReplica data batch across workers to build the model, "
        "which fails in multi-worker mode.",
        "Attempt to convert a value (PerReplica",
        (_TRAINER, "_maybe_symbolic_build", "TensorFlowTrainer"),
        "self.distribute_strategy.reduce(", symbolic_build.make),
    Fix("scalar-logs", "tensorflow#72388",
        "the multi-worker branch of reduce_per_replica reduces scalar logs on axis 0.",
        "Invalid reduction dimension 0 for input with 0 dimensions",
        (_TRAINER, "reduce_per_replica", None), 'strategy.reduce("MEAN",v,axis=0)',
        scalar_logs.make),
    Fix("multi-step", "keras#19246",
        "steps_per_execution > 1 fails in fit/evaluate under a strategy with 2+ replicas "
        "(the step runs inside a tf.cond in a while loop).",
        "You must feed a value for placeholder tensor",
        (_TRAINER, "_make_function", "TensorFlowTrainer"),
        "one_step_on_data(next_optional_inputs.get_value())", multistep.make),
)}


def _check_names(names: Iterable[str], where: str) -> set[str]:
    chosen = {n.strip() for n in names if n and n.strip()}
    if "all" in chosen:
        return set(FIXES)
    unknown = sorted(chosen - set(FIXES))
    if unknown:
        raise ValueError(
            f"Unknown compat fix in {where}. Received: {', '.join(unknown)}; "
            f"accepted: all, {', '.join(FIXES)}"
        )
    return chosen


def _disabled_from_env() -> set[str]:
    if not _env.compat_enabled():
        return set(FIXES)
    return _check_names(_env.compat_disabled(), _env.COMPAT_DISABLE)


def _keras_is_tensorflow() -> bool:
    import keras

    return keras.backend.backend() == "tensorflow"


def apply(*, disable: Iterable[str] | None = None) -> dict[str, str]:
    """Apply every needed fix for Keras 3 under MultiWorkerMirroredStrategy.

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

    Returns:
        Fix name -> ``"applied"``, ``"not-needed"`` or ``"disabled"``.

    Raises:
        ValueError: for an unknown fix name.

    Example:
        >>> from mirrorkit import compat
        >>> compat.apply(disable=["scalar-logs"])            # doctest: +SKIP
        {'symbolic-build': 'applied', 'scalar-logs': 'disabled'}
    """
    skip = _disabled_from_env() if disable is None else _check_names(
        [disable] if isinstance(disable, str) else disable, "disable")
    if not _keras_is_tensorflow():
        # Other backends never reach the TF trainer; nothing to patch.
        return {name: NOT_NEEDED for name in FIXES}
    result: dict[str, str] = {}
    for name, fix in FIXES.items():
        if name in skip:
            fix._revert()
            result[name] = DISABLED
        elif fix.needed():
            fix._apply()
            result[name] = APPLIED
        else:
            result[name] = NOT_NEEDED
    logger.info("mirrorkit.compat: %s", ", ".join(f"{k}={v}" for k, v in result.items()))
    return result


def status() -> dict[str, str]:
    """Report each fix as ``"applied"``, ``"not-needed"`` or ``"not-applied"``.

    Example:
        >>> from mirrorkit import compat
        >>> compat.status()                                  # doctest: +SKIP
        {'symbolic-build': 'not-applied', 'scalar-logs': 'not-applied'}
    """
    out = {}
    for name, fix in FIXES.items():
        if fix.is_applied():
            out[name] = APPLIED
        else:
            out[name] = NOT_APPLIED if fix.needed() else NOT_NEEDED
    return out


def revert() -> None:
    """Undo every applied fix (restores Keras's own functions; for tests).

    Example:
        >>> from mirrorkit import compat
        >>> compat.revert()                                  # doctest: +SKIP
    """
    for fix in FIXES.values():
        fix._revert()
