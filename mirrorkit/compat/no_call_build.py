"""``fit`` on a model without ``call()`` under a strategy (keras.io's GAN guide).

keras.io's "Customizing what happens in fit()" GAN (and WGAN-GP, DCGAN,
CycleGAN, ...) subclasses ``keras.Model`` without a ``call()``: the class holds
a discriminator and a generator, has its own ``compile(d_optimizer,
g_optimizer, loss_fn)`` and overrides ``train_step``. Without a strategy
Keras defers building to the traced step, which never calls the model
itself. With any ``tf.distribute`` strategy, Keras's TensorFlow trainer
builds the model symbolically before the first step
(``TensorFlowTrainer._maybe_symbolic_build`` -> ``Trainer._symbolic_build``),
which calls the model on symbolic inputs and fails: ``RuntimeError: Unable to
automatically build the model ... Model GAN does not have a `call()` method
implemented.``

The same build also guesses how the step calls the model: it unpacks a batch
as ``(x, y, sample_weight)`` and calls the model on ``x``. keras.io's "Image
similarity estimation using a Siamese Network with a triplet loss" feeds
batches of ``(anchor, positive, negative)`` whose ``train_step`` passes the
whole tuple to the network: under any strategy (one replica included) the
build calls it on the anchors alone and fails (``Layer "functional" expects
3 named input(s) ... but it received 1 input tensors``); plain Python never
makes that call.

There is nothing to build through a model that cannot be called, so the fix
does what Keras does without a strategy: for a model whose ``call`` is Keras's
unimplemented placeholder it skips the symbolic build and leaves building to
the step; for a model that overrides ``train_step``, ``test_step`` or
``predict_step`` it tries Keras's build and, when the guess fails, leaves
building to the step as well (a real mistake in the model then fails there,
as in plain Python). The optimizers the step then builds lazily are handled
by the ``step-variables`` fix (:mod:`mirrorkit.compat.step_variables`). Every
other model keeps Keras's symbolic build. :mod:`mirrorkit.compat` registers
it as the ``no-call-build`` fix.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

logger = logging.getLogger(__name__)


def has_no_call(model: Any) -> bool:
    """True when ``model``'s ``call`` is Keras's unimplemented placeholder.

    Example:
        >>> class GAN(keras.Model):                              # doctest: +SKIP
        ...     def train_step(self, data): ...
        >>> has_no_call(GAN())                                   # doctest: +SKIP
        True
    """
    from keras.src.layers.layer import Layer
    from keras.src.models.model import Model

    call = getattr(type(model), "call", None)
    return call is Model.call or call is Layer.call


def has_own_step(model: Any) -> bool:
    """True when ``model``'s class overrides Keras's ``train_step``, ``test_step`` or ``predict_step``.

    Example:
        >>> has_own_step(keras.Sequential([keras.layers.Dense(1)]))   # doctest: +SKIP
        False
    """
    from mirrorkit.patching import targets

    trainer = targets.owner("backend-trainer")
    return any(getattr(type(model), step, None) is not getattr(trainer, step)
               for step in ("train_step", "test_step", "predict_step"))


def make(original: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap ``Trainer._symbolic_build`` (``original``) with the fix.

    Example:
        >>> from keras.src.trainers.trainer import Trainer      # doctest: +SKIP
        >>> patched = make(Trainer._symbolic_build)            # doctest: +SKIP
    """

    def _symbolic_build(self: Any, iterator: Any = None, data_batch: Any = None) -> Any:
        if getattr(self, "_distribute_strategy", None) is not None and has_no_call(self):
            # As without a strategy: the overridden train_step builds what it uses.
            logger.debug("%s has no call(); building is left to its train_step",
                         type(self).__name__)
            return None
        if getattr(self, "_distribute_strategy", None) is None or not has_own_step(self):
            return original(self, iterator=iterator, data_batch=data_batch)
        try:
            return original(self, iterator=iterator, data_batch=data_batch)
        except Exception as err:  # noqa: BLE001 -- Keras's guess of the call, not the step's
            logger.debug("%s: Keras's symbolic build failed (%s); building is left to its "
                         "own step, as without a strategy", type(self).__name__, err)
            return None

    return _symbolic_build
