"""Where a patch's target lives, found by the role it plays rather than by its private name.

Keras and TensorFlow rename and move their private modules between releases
(Keras 3.16 renamed ``TensorFlowTrainer`` to ``Trainer`` and moved
``backend/tensorflow/nn.py`` to ``backend/tensorflow/ops/nn.py``; the methods
kept their names). A fix that looked its target up by spelling went quiet on
the next release. Here each owner of a patched attribute is a :class:`Role`:
how to find it from a public object (the class in ``keras.Model.__mro__``
that defines ``make_train_function`` *is* the TensorFlow trainer, whatever it
is called) and every private spelling it has had, with the versions that
spell it so. Where no public object leads to it, the spelling is the role
(``tensorflow.python.ops.script_ops.FuncRegistry``).

:func:`check` compares what a role finds with its recorded spellings for the
installed versions: a new release that moves a target is caught by the test
suite on the nightlies (``tests/patching/test_target_roles.py``), not by a user.

Example:
    >>> ROLES["backend-trainer"].spellings[0][0]
    'keras.src.backend.tensorflow.trainer.TensorFlowTrainer'
    >>> describe("backend-trainer", "_make_function")         # doctest: +SKIP
    'keras.src.backend.tensorflow.trainer.TensorFlowTrainer._make_function'
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any, Callable

from packaging.specifiers import SpecifierSet

from mirrorkit.patching.versions import installed_version

# Keras 3.16's nightlies rename the trainers and move backend modules.
_KERAS_315 = "keras>=3.0,<3.16.0.dev0"
_KERAS_316 = "keras>=3.16.0.dev0"
_ANY_KERAS = "keras>=3.0"
_ANY_TF = "tensorflow>=2.16"


@dataclasses.dataclass(frozen=True)
class Role:
    """An owner of patched attributes (a class or a module), found by what it does.

    Attributes:
        name: the key in :data:`ROLES` that targets name.
        what: one phrase saying what it is.
        find: returns the owner from public objects (raises ``LookupError``,
            ``ImportError`` or ``AttributeError`` when it is not there).
        spellings: every private dotted name it is known by, each with the
            versions (a ``"package<specifier>"`` string) that spell it so.

    Example:
        >>> role = ROLES["loss-module"]
        >>> role.spellings
        (('keras.src.losses.loss', 'keras>=3.0'),)
    """

    name: str
    what: str
    find: Callable[[], Any]
    spellings: tuple[tuple[str, str], ...]


def _import(dotted: str) -> Any:
    """The object at ``dotted``, walked from the top package by attribute, importing as needed.

    By attribute first: ``tensorflow.nn`` is the object users reach as
    ``tf.nn`` (TensorFlow's lazy API modules), not a second import of it.
    """
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            obj = importlib.import_module(".".join(parts[:i + 1]))
    return obj


def _defining(cls: type, attr: str, after: type | None = None) -> type:
    """The first class in ``cls``'s MRO (after ``after``) whose own namespace has ``attr``."""
    mro = cls.__mro__
    start = mro.index(after) + 1 if after is not None else 1
    for klass in mro[start:]:
        if attr in vars(klass):
            return klass
    raise LookupError(f"no class in {cls.__qualname__}'s MRO defines {attr!r}")


def _backend_trainer() -> type:
    import keras

    # Keras's Model inherits its backend's trainer, which alone builds train functions.
    return _defining(keras.Model, "make_train_function")


def _base_trainer() -> type:
    import keras

    # Below the backend's trainer, the backend-neutral one holds compile().
    return _defining(keras.Model, "compile", after=_backend_trainer())


def _backend_module(leaf: str) -> Callable[[], Any]:
    def find() -> Any:
        # The TensorFlow backend's package is the trainer's; its `leaf` module may
        # sit at any depth in it (backend/tensorflow/nn.py, .../ops/nn.py).
        package = _backend_trainer().__module__.rpartition(".")[0]
        importlib.import_module(package)
        found = [module for name, module in list(sys.modules.items())
                 if name.startswith(package + ".") and name.rpartition(".")[2] == leaf]
        if len(found) != 1:
            raise LookupError(f"{len(found)} modules named {leaf!r} in {package}")
        return found[0]

    return find


def _module_of(find_class: Callable[[], type]) -> Callable[[], Any]:
    return lambda: sys.modules[find_class().__module__]


def _public(dotted: str) -> Callable[[], Any]:
    return lambda: _import(dotted)


def _class_defining(dotted: str, attr: str) -> Callable[[], type]:
    def find() -> type:
        cls = _import(dotted)
        return cls if attr in vars(cls) else _defining(cls, attr)

    return find


def _spelled(dotted: str, versions: str) -> Role:
    return Role(dotted, "a private name with no public object leading to it",
                lambda: _import(dotted), ((dotted, versions),))


_ROLES = (
    Role("backend-trainer", "the TensorFlow trainer keras.Model inherits "
         "(the class that defines make_train_function)", _backend_trainer,
         (("keras.src.backend.tensorflow.trainer.TensorFlowTrainer", _KERAS_315),
          ("keras.src.backend.tensorflow.trainer.Trainer", _KERAS_316))),
    Role("base-trainer", "the backend-neutral trainer below it (the class that defines "
         "compile)", _base_trainer,
         (("keras.src.trainers.trainer.Trainer", _KERAS_315),
          ("keras.src.trainers.trainer.BaseTrainer", _KERAS_316))),
    Role("backend-trainer-module", "the module of the TensorFlow trainer",
         _module_of(_backend_trainer), (("keras.src.backend.tensorflow.trainer", _ANY_KERAS),)),
    Role("base-trainer-module", "the module of the backend-neutral trainer",
         _module_of(_base_trainer), (("keras.src.trainers.trainer", _ANY_KERAS),)),
    Role("backend-nn", "the TensorFlow backend's nn module (convolutions, ctc_loss)",
         _backend_module("nn"),
         (("keras.src.backend.tensorflow.nn", _KERAS_315),
          ("keras.src.backend.tensorflow.ops.nn", _KERAS_316))),
    Role("backend-random", "the TensorFlow backend's random module",
         _backend_module("random"), (("keras.src.backend.tensorflow.random", _ANY_KERAS),)),
    Role("backend-variable", "the TensorFlow backend's Variable (the class in keras.Variable's "
         "MRO that defines _initialize_with_initializer)",
         _class_defining("keras.Variable", "_initialize_with_initializer"),
         (("keras.src.backend.tensorflow.core.Variable", _KERAS_315),
          ("keras.src.backend.tensorflow.ops.core.Variable", _KERAS_316))),
    Role("backend-optimizer", "the TensorFlow backend's optimizer base (the class in "
         "keras.optimizers.Optimizer's MRO that defines _all_reduce_sum_gradients)",
         _class_defining("keras.optimizers.Optimizer", "_all_reduce_sum_gradients"),
         (("keras.src.backend.tensorflow.optimizer.TFOptimizer", _ANY_KERAS),)),
    Role("loss-module", "the module of keras.losses.Loss (the distribution scaling helpers)",
         _module_of(lambda: _import("keras.losses.Loss")),
         (("keras.src.losses.loss", _ANY_KERAS),)),
    Role("loss", "keras.losses.Loss", _public("keras.losses.Loss"),
         (("keras.src.losses.loss.Loss", _ANY_KERAS),)),
    Role("mean-metric", "the class that defines keras.metrics.Mean.update_state",
         _class_defining("keras.metrics.Mean", "update_state"),
         (("keras.src.metrics.reduction_metrics.Mean", _ANY_KERAS),)),
    Role("layer", "keras.layers.Layer", _public("keras.layers.Layer"),
         (("keras.src.layers.layer.Layer", _ANY_KERAS),)),
    Role("loss-scale-optimizer", "keras.mixed_precision.LossScaleOptimizer",
         _public("keras.mixed_precision.LossScaleOptimizer"),
         (("keras.src.optimizers.loss_scale_optimizer.LossScaleOptimizer", _ANY_KERAS),)),
    Role("seed-generator-module", "the module of keras.random.SeedGenerator",
         _module_of(lambda: _import("keras.random.SeedGenerator")),
         (("keras.src.random.seed_generator", _ANY_KERAS),)),
    Role("gradient-tape", "tf.GradientTape", _public("tensorflow.GradientTape"),
         (("tensorflow.python.eager.backprop.GradientTape", _ANY_TF),)),
    Role("strategy-base", "the class that defines tf.distribute.Strategy.run",
         _class_defining("tensorflow.distribute.MirroredStrategy", "run"),
         (("tensorflow.python.distribute.distribute_lib.StrategyBase", _ANY_TF),)),
    Role("tf-nn", "tf.nn", _public("tensorflow.nn"), (("tensorflow._api.v2.nn", _ANY_TF),)),
    Role("tf-random-seed", "the module of tf.random.set_seed (get_seed)",
         _module_of(lambda: _import("tensorflow.random.set_seed")),
         (("tensorflow.python.framework.random_seed", _ANY_TF),)),
    Role("tf-interim", "tf.__internal__.distribute.interim",
         _public("tensorflow.__internal__.distribute.interim"),
         (("tensorflow._api.v2.__internal__.distribute.interim", _ANY_TF),)),
    # No public object leads to these: their spelling is the role.
    _spelled("keras.src.trainers.compile_utils.CompileLoss", _ANY_KERAS),
    _spelled("keras.src.trainers.compile_utils.CompileMetrics", _ANY_KERAS),
    _spelled("tensorflow.python.ops.script_ops.FuncRegistry", _ANY_TF),
    _spelled("tensorflow.python.distribute.values", _ANY_TF),
    _spelled("tensorflow.python.distribute.mirrored_run._MirroredReplicaThread", _ANY_TF),
    _spelled("tensorflow.python.distribute.input_lib.DistributedDataset", _ANY_TF),
    _spelled("tensorflow.python.ops.gen_random_ops", _ANY_TF),
)

#: Every role, by name.
ROLES: dict[str, Role] = {role.name: role for role in _ROLES}


def owner(role: str) -> Any:
    """The class or module that plays ``role`` in the installed Keras/TensorFlow.

    Raises:
        LookupError: ``role`` is not in :data:`ROLES`, or nothing plays it here
            (the message says which and why).

    Example:
        >>> owner("loss-module").__name__                        # doctest: +SKIP
        'keras.src.losses.loss'
    """
    if role not in ROLES:
        raise LookupError(f"unknown target role {role!r}; known: {', '.join(ROLES)}")
    try:
        return ROLES[role].find()
    except (ImportError, AttributeError, LookupError, KeyError) as err:
        raise LookupError(f"nothing plays {role!r} ({ROLES[role].what}) here: "
                          f"{type(err).__name__}: {err}") from err


def dotted_name(obj: Any) -> str:
    """``module.Qualname`` of a class, or a module's name.

    Example:
        >>> dotted_name(dataclasses)
        'dataclasses'
    """
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    return getattr(obj, "__name__", repr(obj))


def describe(role: str, attr: str) -> str:
    """The target as found here (``module.Class.attr``), or the role's name when none plays it.

    Example:
        >>> describe("no-such-role", "x")
        '<no-such-role>.x'
    """
    try:
        return f"{dotted_name(owner(role))}.{attr}"
    except LookupError:
        return f"<{role}>.{attr}"


def installed(package: str) -> str | None:
    """The installed version of ``package`` (whichever distribution provides it).

    Example:
        >>> installed("surely-not-installed-pkg") is None
        True
    """
    return installed_version(package)


def applies(versions: str, installed_versions: dict[str, str | None] | None = None) -> bool:
    """True when ``"package<specifier>"`` holds for the installed package (pre-releases too).

    Example:
        >>> applies("keras>=3.16.0.dev0", {"keras": "3.16.0.dev2026102704"})
        True
        >>> applies("keras>=3.0,<3.16.0.dev0", {"keras": "3.16.0.dev2026102704"})
        False
    """
    cut = min((versions.index(c) for c in "<>=!~" if c in versions), default=len(versions))
    package, spec = versions[:cut], versions[cut:]
    version = (installed_versions or {}).get(package) if installed_versions is not None \
        else installed(package)
    return version is not None and SpecifierSet(spec, prereleases=True).contains(
        version, prereleases=True)


def check(role: str, installed_versions: dict[str, str | None] | None = None,
          roles: dict[str, Role] | None = None) -> str | None:
    """What is wrong with ``role``'s record here, or None when it is right.

    Right means: the role finds its owner, and one of its spellings recorded
    for the installed versions names that very object. A release that moves
    the target fails here until its spelling is added to the record.

    Example:
        >>> check("loss-module") is None                          # doctest: +SKIP
        True
    """
    record = (roles or ROLES)[role]
    try:
        found = record.find()
    except (ImportError, AttributeError, LookupError, KeyError) as err:
        return f"{role}: nothing plays it here ({type(err).__name__}: {err})"
    recorded = [dotted for dotted, versions in record.spellings
                if applies(versions, installed_versions)]
    for dotted in recorded:
        try:
            if _import(dotted) is found:
                return None
        except (ImportError, AttributeError):
            continue
    return (f"{role}: found {dotted_name(found)}, which no spelling recorded for these "
            f"versions names (recorded: {', '.join(recorded) or 'none'}); add it to "
            f"mirrorkit/patching/targets.py")
