"""Keras variables first created inside a traced step under 2+ replicas.

Keras 3 creates many variables lazily, at their first use: an optimizer's
slots (Adam's moments, ...) in its first ``apply``/``apply_gradients``, a
layer's weights in its first call. In a custom training loop -- the
TensorFlow tutorial "Custom training with tf.distribute.Strategy", keras.io's
"writing a training loop from scratch" with ``strategy.run`` -- or in an
overridden ``train_step`` (keras.io's GAN), that first use happens while
``tf.function`` traces ``strategy.run(step)``. With 2+ replicas
``MirroredStrategy`` initialises each further replica's copy of a new
variable from the primary copy (``MirroredExtended.
_get_variable_creator_initial_value``: ``primary_var.value()`` inside the
function; ``MultiWorkerMirroredStrategy`` broadcasts it), so ``tf.function``
cannot lift those initializers out of the graph
(``lift_to_graph.UnliftableError``) and falls back to running the whole step
inside ``tf.cond(variables initialized, ...)``
(``polymorphic_function.Function._call``: ``fn_with_cond``). That cond's
branch captures the replica functions' placeholders without feeding them and
the first call fails: ``You must feed a value for placeholder tensor
'cond/else/_1/cond/Placeholder'`` (same root as keras#19246; reported as
tensorflow#72686 / keras#19308). Stock TensorFlow fails the same way with the
script's own ``MirroredStrategy()`` over 2 devices.

``model.fit`` on a model with a ``call()`` never hits this: Keras builds the
model and the optimizer eagerly before the first step. The fix does the same
for every other caller: a Keras variable whose initial value comes from an
initializer (``add_weight``, ``add_variable``, optimizer slots) created inside
a ``tf.function`` under a strategy with 2+ replicas is created outside the
trace (``tf.init_scope``, under the strategy's scope), as tf.keras 2's
optimizer did for its slots (``with tf.init_scope(): ...``). The initial value
is the same (Keras initializers are seeded when constructed); the traced step
then only reads and updates the variable. Replica threads of
``MirroredStrategy`` trace one after another, so the first replica creates
the variable and the others find the layer or optimizer built, as they do
without the fix. Variables created eagerly, in a one-replica strategy or
from a tensor value run Keras's code unchanged.

Keras 3.16 (from its nightlies, :data:`OPTIMIZER_VARIABLES_LIFTED`) fixed the
optimizer half upstream: its TensorFlow optimizer makes its variables under
``tf.init_scope`` (keras-team/keras#23087, for keras-team/keras#23085), so a
step whose layers are built before it (TensorFlow's custom-loop tutorial,
keras.io's GAN with ``Input`` layers) trains there without this fix. A
layer's weights first made in the step still fail, with an optimizer applying
them (``upstream_repros/step_variables_layer_weights.py``): the fix stays
needed there, and its probe builds both.

:mod:`mirrorkit.compat.registry` registers it as the ``step-variables`` fix.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable

logger = logging.getLogger(__name__)
_warned: set[str] = set()

#: The Keras versions whose optimizers make their own variables outside a traced step
#: (keras-team/keras#23087): measured absent from 3.15.1, present in 3.16.0.dev2026102704.
#: There only a layer first built in the step shows the bug; the tests' controls ask it.
OPTIMIZER_VARIABLES_LIFTED = "keras>=3.16.0.dev0"


def _traced_multi_replica() -> Any:
    """The strategy when inside a tf.function under 2+ replicas, else None."""
    import tensorflow as tf

    if not tf.inside_function() or not tf.distribute.has_strategy():
        return None
    strategy = tf.distribute.get_strategy()
    return strategy if int(strategy.num_replicas_in_sync) > 1 else None


def _strategy_scope(strategy: Any) -> Any:
    import tensorflow as tf

    # Already this strategy's cross-replica context (mirrorkit's script scope):
    # nothing to enter.
    if tf.distribute.has_strategy() and tf.distribute.get_strategy() is strategy:
        return contextlib.nullcontext()
    return strategy.scope()


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``Variable._initialize_with_initializer`` (TF backend) with the fix.

    Example:
        >>> from keras.src.backend.tensorflow.core import Variable      # doctest: +SKIP
        >>> patched = make(Variable._initialize_with_initializer)      # doctest: +SKIP
    """

    def _initialize_with_initializer(self: Any, initializer: Any) -> Any:
        strategy = _traced_multi_replica()
        if strategy is None:
            return original(self, initializer)
        import tensorflow as tf

        try:
            with tf.init_scope(), _strategy_scope(strategy):
                return original(self, initializer)
        except Exception as err:  # never break the user's step over the fix
            if getattr(self, "_value", None) is not None:
                raise  # created: the error is the user's own
            if "init" not in _warned:
                _warned.add("init")
                logger.warning("mirrorkit: could not create variable %s outside the "
                               "traced step (%s); Keras creates it in place.",
                               getattr(self, "path", "?"), err)
            return original(self, initializer)

    return _initialize_with_initializer
