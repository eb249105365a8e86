"""The strategies a script creates itself, made to cooperate with mirrorkit's.

For the script's lifetime, the public ``tf.distribute.MirroredStrategy``,
``MultiWorkerMirroredStrategy`` (also under ``experimental``) and
``OneDeviceStrategy`` names are replaced by stand-ins: a construction with no
device or cluster of its own returns mirrorkit's strategy (``isinstance``
checks still hold); anything pinned is created as written and mirrorkit's
scope steps aside. See :mod:`mirrorkit.runner.script` for the rules.

Example:
    >>> from mirrorkit.runner.strategies import script_strategies   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
from typing import Any, Iterator

from mirrorkit.compat import symbolic_order
from mirrorkit.errors import RunError
from mirrorkit.patching import engine
from mirrorkit.runner.scope import ScriptScope

# Its record: mirrorkit.patching.catalogue.
NAME = "script-strategies"

logger = logging.getLogger(__name__)


# Public names replaced for the script's lifetime: (namespace, attribute).
# OneDeviceStrategy always pins a device, so it is only watched, never adopted.
_STRATEGY_NAMES = (
    ("distribute", "MirroredStrategy"),
    ("distribute", "MultiWorkerMirroredStrategy"),
    ("distribute.experimental", "MultiWorkerMirroredStrategy"),
    ("distribute", "OneDeviceStrategy"),
)
# Arguments that only tune how a strategy communicates. mirrorkit's strategy
# is already configured, so a script passing only these still gets it.
_TUNING_ARGUMENTS = ("cross_device_ops", "communication_options", "communication")


@contextlib.contextmanager
def script_strategies(scope: ScriptScope) -> Iterator[None]:
    """Make the script's own strategy constructions cooperate with mirrorkit's."""
    if not scope.active:
        yield
        return
    import tensorflow as tf

    changes: list[tuple[Any, str, Any]] = []
    replacements: dict[int, Any] = {}
    for namespace, attr in _STRATEGY_NAMES:
        original = getattr(_resolve(tf, namespace), attr)
        if id(original) not in replacements:
            replacements[id(original)] = _watching_class(original, f"tf.{namespace}.{attr}",
                                                         scope)
        replacement = replacements[id(original)]
        # The same class is exposed by tf.distribute and tf.compat.v2.distribute.
        for module in _public_modules():
            if module.__dict__.get(attr) is original:
                changes.append((module, attr, lambda _cls, r=replacement: r))
    with engine.applied(NAME, changes):
        yield


def _resolve(tf: Any, dotted: str) -> Any:
    obj = tf
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _public_modules() -> list[Any]:
    # TensorFlow's generated public API lives under tensorflow._api; its
    # private implementation modules are left alone so TF's own code is unaffected.
    return [m for name, m in list(sys.modules.items())
            if name.startswith("tensorflow._api.") and m is not None]


def _watching_class(original: type, public_name: str, scope: ScriptScope) -> type:
    """A stand-in for ``original`` whose construction goes through :func:`_construct`.

    A subclass with a metaclass: ``isinstance``/``issubclass`` against it
    answer as for ``original``, and mirrorkit's strategy counts as a
    ``tf.distribute.MirroredStrategy`` whatever its class (so
    ``isinstance(s, tf.distribute.MirroredStrategy)`` holds under
    ``mirrorkit launch`` too); calling it can return an existing instance
    without ``__init__`` running again.
    """

    class _Meta(type(original)):  # type: ignore[misc]
        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            if cls is not stand_in:
                # The script's own subclass: its own strategy, as written.
                instance = super().__call__(*args, **kwargs)
                _honoured(scope, f"{cls.__name__} (a subclass of {public_name})", instance)
                return instance
            return _construct(original, public_name, scope, args, kwargs)

        def __instancecheck__(cls, instance: Any) -> bool:
            if cls is stand_in:
                # Under `mirrorkit launch` a MirroredStrategy() script gets a
                # MultiWorkerMirroredStrategy (not a subclass of it) and must
                # still pass its own isinstance check.
                return isinstance(instance, original) or (
                    adopts and instance is scope.strategy)
            return super().__instancecheck__(instance)

        def __subclasscheck__(cls, subclass: type) -> bool:
            if cls is stand_in:
                return issubclass(subclass, original)
            return super().__subclasscheck__(subclass)

    # Only MirroredStrategy claims mirrorkit's strategy whatever its class: a
    # MultiWorkerMirroredStrategy mirrors too, but a local MirroredStrategy
    # passing as multi-worker would mislead a script's cluster logic.
    adopts = public_name == "tf.distribute.MirroredStrategy"
    stand_in = _Meta(original.__name__, (original,), {
        "__module__": original.__module__, "__qualname__": original.__qualname__,
        "__doc__": original.__doc__})
    return stand_in


def _construct(original: type, public_name: str, scope: ScriptScope,
               args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    import tensorflow as tf

    try:
        bound = inspect.signature(original.__init__).bind(None, *args, **kwargs)
    except TypeError:
        return original(*args, **kwargs)  # TensorFlow's own error for bad arguments
    given = {k: v for k, v in bound.arguments.items() if k not in ("self", "kwargs")}
    call = "{}({})".format(public_name, ", ".join(
        f"{k}={_short(v, k in _TUNING_ARGUMENTS)}" for k, v in given.items()))
    pinned = {k: v for k, v in given.items() if k not in _TUNING_ARGUMENTS}
    devices = pinned.pop("devices", None)
    if devices is not None and _same_devices(devices, scope.strategy):
        devices = None
    resolver = pinned.pop("cluster_resolver", None)
    if isinstance(resolver, tf.distribute.cluster_resolver.TFConfigClusterResolver):
        resolver = None  # what MultiWorkerMirroredStrategy() reads anyway
    if "OneDevice" not in public_name and devices is None and resolver is None and not pinned:
        unused = [k for k in given if k in _TUNING_ARGUMENTS]
        logger.info(
            "the script's %s is mirrorkit's strategy (%s, %d replica%s)%s.", call,
            scope.runtime.strategy, scope.runtime.replicas,
            "" if scope.runtime.replicas == 1 else "s",
            f"; its {', '.join(unused)} argument is not used" if unused else "")
        # Under plain Python this script's models have a strategy, so Keras peeks.
        symbolic_order.keep_kerass_peek(scope.strategy)
        return scope.strategy
    if resolver is not None and scope.runtime.strategy == "multi_worker":
        raise RunError(
            f"{call} cannot be created: `mirrorkit run` already joined this process to "
            f"the cluster in TF_CONFIG as {scope.runtime.task}, and TensorFlow allows one "
            "multi-worker strategy per process. Drop the cluster_resolver argument to "
            "use mirrorkit's strategy, or run the script with `python` instead of "
            "`mirrorkit run`.")
    instance = original(*args, **kwargs)
    symbolic_order.keep_kerass_peek(instance)
    _honoured(scope, call, instance)
    return instance


def _short(value: Any, elide: bool) -> str:
    # Device names read well as repr; objects (resolvers, options) by type only.
    if elide:
        return "..."
    if isinstance(value, (str, int, float, list, tuple)) or value is None:
        return repr(value)
    return type(value).__name__


def _same_devices(devices: Any, strategy: Any) -> bool:
    """True when ``devices`` names exactly the devices of ``strategy`` (this worker's)."""
    import tensorflow as tf

    def key(name: Any) -> tuple[str, int]:
        spec = tf.DeviceSpec.from_string(str(getattr(name, "name", name)))
        return (spec.device_type or "").upper(), spec.device_index or 0

    try:
        theirs = sorted(key(d) for d in ([devices] if isinstance(devices, str) else devices))
        ours = sorted(key(d) for d in strategy.extended.worker_devices)
    except (TypeError, ValueError, RuntimeError):
        return False
    return theirs == ours


def _honoured(scope: ScriptScope, call: str, instance: Any) -> None:
    # TensorFlow refuses to enter a second strategy's scope inside another's,
    # so mirrorkit steps aside and the script runs as it would under python.
    replicas = getattr(instance, "num_replicas_in_sync", "?")
    left = scope.leave()
    logger.info(
        "the script creates its own %s (%s replica%s) and uses it as written%s.",
        call, replicas, "" if replicas == 1 else "s",
        "; mirrorkit's strategy scope is left for the rest of the script "
        "(tf.distribute.MirroredStrategy() without devices would be mirrorkit's)"
        if left else "")
