"""The one way mirrorkit replaces an attribute of code that is not its own.

Every replacement names its :class:`~mirrorkit.patching.record.Patch` (a name
not in :data:`~mirrorkit.patching.catalogue.PATCHES` is refused), carries one
marker on a replaced function (``__mirrorkit_patch__``: the patch's name,
``__mirrorkit_original__``: what it replaced) and is remembered so it can be undone. A patch turned off
by name (:mod:`mirrorkit.patching.switches`) is not installed: the caller gets
``None`` back and runs without it, and one log line says so.

* :func:`replace` / :func:`undo`: for the process (upstream fixes).
* :func:`applied`: for the length of a ``with`` block (``mirrorkit run``'s
  script-lifetime adaptations), undone on exit.
* :func:`on_object`: an attribute of one object mirrorkit manages (nothing to
  undo: the object is mirrorkit's).
* :func:`join`: one function several patches change (a *spot*,
  :mod:`~mirrorkit.patching.spots`): wrapped once, each patch adding a layer,
  the layers composed in the spot's written order whatever order the patches
  come in.

Example:
    >>> import types
    >>> module = types.SimpleNamespace(fit=lambda: "keras")
    >>> with applied("script-model-methods", [(module, "fit", lambda f: lambda: "mirrorkit")]):
    ...     module.fit(), patched_by(module.fit)
    ('mirrorkit', 'script-model-methods')
    >>> module.fit()
    'keras'
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sys
import types
from collections import Counter
from typing import Any, Callable, Iterable, Iterator

from mirrorkit.patching import spots, switches
from mirrorkit.patching.catalogue import PATCHES
from mirrorkit.patching.spots import LAYERS

logger = logging.getLogger(__name__)

MARKER = "__mirrorkit_patch__"
ORIGINAL = "__mirrorkit_original__"
# The marker of a spot's one wrapper (join): its layers say which patches.
SHARED = "shared"
_MISSING = object()


@dataclasses.dataclass
class _Change:
    owner: Any
    attr: str
    previous: Any  # _MISSING: the attribute was inherited, not the owner's own
    value: Any
    joined: bool = False  # a layer of a spot's shared wrapper (join)


# name -> the replacements in force, in the order they were made.
_LIVE: dict[str, list[_Change]] = {}
# name -> how many objects carry it (on_object).
_OBJECTS: Counter = Counter()
_REPORTED_OFF: set[str] = set()


def _known(name: str) -> None:
    if name not in PATCHES:
        raise ValueError(f"Unknown patch {name!r}: add a record to "
                         f"mirrorkit/patching/catalogue.py first. Known: {', '.join(PATCHES)}")


def _own(owner: Any, attr: str) -> Any:
    """The owner's own value of ``attr`` (a class's __dict__ entry, so a property stays one)."""
    if isinstance(owner, type):
        return vars(owner).get(attr, _MISSING)
    return getattr(owner, attr, _MISSING)


def _mark(value: Any, name: str, original: Any) -> None:
    if isinstance(value, (type, types.ModuleType)):
        # A class outlives the patch (mirrorkit's own subclasses), a module is
        # everyone's (one handed to the module that imports it): remembered only.
        return
    try:
        setattr(value, MARKER, name)
        setattr(value, ORIGINAL, original)
    except (AttributeError, TypeError):
        pass  # a value that takes no attributes (a list, a builtin): remembered only


def enabled(name: str) -> bool:
    """True unless the environment turns patch ``name`` off (then logged once).

    Raises:
        ValueError: ``name`` is not in the catalogue, or the environment names
            an unknown patch.

    Example:
        >>> enabled("speed-up-fit")
        True
    """
    _known(name)
    if not switches.is_disabled(name):
        return True
    if name not in _REPORTED_OFF:
        _REPORTED_OFF.add(name)
        logger.info("mirrorkit: patch %r is turned off (MIRRORKIT_COMPAT_DISABLE / "
                    "MIRRORKIT_COMPAT); %s is left as it is.", name,
                    ", ".join(PATCHES[name].target_names()))
    return False


def replace(name: str, owner: Any, attr: str, make: Callable[[Any], Any], *,
            force: bool = False) -> Any:
    """Set ``owner.attr`` to ``make(current)``, marked and remembered under patch ``name``.

    Args:
        name: the patch (a key of the catalogue).
        owner: the module, class or object whose attribute is replaced.
        attr: the attribute.
        make: builds the replacement from the current value (inherited or own).
        force: install even if the environment turns ``name`` off (for a
            caller that decided with ``disable=`` itself).

    Returns:
        The replacement, or None when the patch is turned off.

    Example:
        >>> import types
        >>> ns = types.SimpleNamespace(f=abs)
        >>> replace("speed-up-fit", ns, "f", lambda f: round) is round, undo("speed-up-fit")
        (True, 1)
    """
    if not force and not enabled(name):
        return None
    _known(name)
    own = _own(owner, attr)
    # A class's own entry as it is stored (a property stays a property).
    current = getattr(owner, attr) if own is _MISSING else own
    value = make(current)
    _mark(value, name, current)
    previous = _own(owner, attr)
    setattr(owner, attr, value)
    _LIVE.setdefault(name, []).append(_Change(owner, attr, previous, value))
    return value


def add_finder(name: str, finder: Any) -> bool:
    """Put an import hook first in ``sys.meta_path`` under patch ``name``.

    Returns False (and adds nothing) when the patch is turned off.

    Raises:
        ValueError: the environment names an unknown patch.

    Example:
        >>> import importlib.abc
        >>> add_finder("fixes-on-import", importlib.abc.MetaPathFinder()), undo("fixes-on-import")
        (True, 1)
    """
    # A new list in front of the finders (importlib reads sys.meta_path on every import).
    return replace(name, sys, "meta_path", lambda finders: [finder, *finders]) is not None


def _restore(change: _Change, name: str = "") -> bool:
    if change.joined:
        layers = getattr(change.value, LAYERS)
        layers.pop(name, None)
        if layers:
            return True  # the spot's wrapper stays for the other patches' layers
    if _own(change.owner, change.attr) is not change.value:
        return False  # replaced again on top of ours: leave the newer value alone
    if change.previous is _MISSING:
        delattr(change.owner, change.attr)
    else:
        setattr(change.owner, change.attr, change.previous)
    return True


def undo(name: str) -> int:
    """Put back everything patch ``name`` replaced; returns how many attributes.

    Example:
        >>> undo("speed-up-fit")
        0
    """
    changes = _LIVE.pop(name, [])
    return sum(_restore(c, name) for c in reversed(changes))


def join(name: str, owner: Any, attr: str, make: Callable[[Any], Any],
         order: tuple[str, ...], *, force: bool = False) -> Any:
    """Add patch ``name``'s layer ``make`` to the one wrapper of ``owner.attr`` (a spot).

    Several patches that change one function each give a layer (``make``
    builds it from the function below, as for :func:`replace`); the function
    is wrapped once, and each call runs the layers in force composed in
    ``order`` (innermost first), so which patch came first never decides what
    the function does. Undoing a patch takes its layer out; the last one out
    puts the function back.

    Returns:
        The spot's wrapper, or None when the patch is turned off.

    Raises:
        ValueError: ``name`` is not in ``order`` (the spot's table must name
            every patch that changes it).

    Example:
        >>> import types
        >>> ns = types.SimpleNamespace(f=lambda: "keras")
        >>> order = ("speed-up-fit", "get-file-lock")
        >>> _ = join("get-file-lock", ns, "f", lambda f: lambda: f() + " +lock", order)
        >>> _ = join("speed-up-fit", ns, "f", lambda f: lambda: f() + " +fast", order)
        >>> ns.f(), spots.layers(ns.f)
        ('keras +fast +lock', ('speed-up-fit', 'get-file-lock'))
        >>> undo("speed-up-fit"), ns.f(), undo("get-file-lock"), ns.f()
        (1, 'keras +lock', 1, 'keras')
    """
    if not force and not enabled(name):
        return None
    _known(name)
    if name not in order:
        raise ValueError(f"patch {name!r} changes {attr!r}, a function other patches change "
                         f"too, but the spot's order does not name it. Order: {order}")
    own = _own(owner, attr)
    current = getattr(owner, attr) if own is _MISSING else own
    shared = current if getattr(current, LAYERS, None) is not None else None
    if shared is None:
        found: dict[str, Callable[[Any], Any]] = {}
        shared = spots.wrapper(current, order, found)
        setattr(shared, LAYERS, found)
        setattr(shared, spots.ORDER, order)
        setattr(shared, MARKER, SHARED)
        setattr(shared, ORIGINAL, current)
        shared.__mirrorkit_previous__ = own
        setattr(owner, attr, shared)
    getattr(shared, LAYERS)[name] = make
    _LIVE.setdefault(name, []).append(
        _Change(owner, attr, shared.__mirrorkit_previous__, shared, joined=True))
    return shared


@contextlib.contextmanager
def applied(name: str, changes: Iterable[tuple[Any, str, Callable[[Any], Any]]]
            ) -> Iterator[bool]:
    """Apply ``(owner, attr, make)`` replacements for the block; undo them after.

    Yields True when the patch is in force, False when it is turned off.

    Example:
        >>> import types
        >>> ns = types.SimpleNamespace(f=abs)
        >>> with applied("speed-up-fit", [(ns, "f", lambda f: round)]) as on:
        ...     on, ns.f is round
        (True, True)
    """
    if not enabled(name):
        yield False
        return
    mine: list[_Change] = []
    try:
        for owner, attr, make in changes:
            replace(name, owner, attr, make)
            mine.append(_LIVE[name][-1])
        yield True
    finally:
        live = _LIVE.get(name, [])
        for change in reversed(mine):
            _restore(change)
            if change in live:
                live.remove(change)
        if not live:
            _LIVE.pop(name, None)


def on_object(name: str, obj: Any, attr: str, value: Any) -> bool:
    """Set ``obj.attr = value`` on an object mirrorkit manages, under patch ``name``.

    Returns False (and sets nothing) when the patch is turned off.

    Example:
        >>> import types
        >>> cb = types.SimpleNamespace(backup_dir="a")
        >>> on_object("backup-paths", cb, "backup_dir", "b"), cb.backup_dir
        (True, 'b')
    """
    if not enabled(name):
        return False
    if callable(value):
        _mark(value, name, getattr(obj, attr, None))
    setattr(obj, attr, value)
    _OBJECTS[name] += 1
    return True


def patched_by(value: Any) -> str | None:
    """The patch that installed ``value``, or None.

    Example:
        >>> patched_by(len) is None
        True
    """
    return getattr(value, MARKER, None)


def original(value: Any) -> Any:
    """What ``value`` replaced, through every patch on top of it (``value`` if none).

    Example:
        >>> original(len) is len
        True
    """
    while patched_by(value) is not None:
        value = getattr(value, ORIGINAL)
    return value


def chain(value: Any) -> list[Any]:
    """``value`` and every patch layer below it, down to the original (outermost first).

    Two patches of one attribute stack: the newer wraps the older, and each
    layer's ``__mirrorkit_original__`` is the one below.

    Example:
        >>> chain(len) == [len]
        True
    """
    layers = [value]
    while patched_by(layers[-1]) is not None:
        layers.append(getattr(layers[-1], ORIGINAL))
    return layers


def is_applied(name: str) -> bool:
    """True when patch ``name`` is in force in this process.

    Example:
        >>> is_applied("get-file-lock")
        False
    """
    return any(_own(c.owner, c.attr) is c.value for c in _LIVE.get(name, ())) \
        or _OBJECTS[name] > 0


def in_force() -> dict[str, list[str]]:
    """Every patch in force now -> the attributes it replaced (``owner.attr``).

    Example:
        >>> in_force()
        {}
    """
    out: dict[str, list[str]] = {}
    for name, changes in _LIVE.items():
        for c in changes:
            if _own(c.owner, c.attr) is c.value:
                owner = getattr(c.owner, "__qualname__", None) or getattr(
                    c.owner, "__name__", type(c.owner).__name__)
                out.setdefault(name, []).append(f"{owner}.{c.attr}")
    for name, count in _OBJECTS.items():
        if count:
            out.setdefault(name, []).append(f"{count} object(s)")
    return out
