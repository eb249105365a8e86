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
with the bug silently is worse than one that is not created. The fixes live in one module each
of :mod:`mirrorkit.compat` (the ``make`` functions below name them). One
more is a process setting (:mod:`~mirrorkit.compat.allocator`,
``malloc-thresholds``): :func:`apply` runs it and it is turned off by name
like the others, but it is not in :data:`FIXES` nor in :func:`apply`'s result.

Example:
    >>> sorted(FIXES)[:3]
    ['batch-sum-losses', 'batch-wide-metrics', 'cross-replica-step']
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from mirrorkit import _env
from mirrorkit.compat import (  # one module per fix, and the modules they share
    accumulation, allocator, batch_metrics, batch_sums, cross_replica_step, empty_conv,
    generator_copies, known_issues, layer_losses, logged_losses, masked_means, mean_gradients,
    multistep, no_call_build, no_gradient_losses, on_batch, overridden_losses, paired_losses,
    probes, replica_copies, replica_op_draws, replica_random, replica_seeds, scalar_losses,
    scalar_logs, sparse_sums,
    static_batches, step_metrics, step_variables, symbolic_build, symbolic_names,
    symbolic_order, uneven_batches, xla_cpu,
)
from mirrorkit.compat.failures import FixMissing
from mirrorkit.compat.fix import Decision, Fix, FixUnavailable
from mirrorkit.patching import switches

logger = logging.getLogger(__name__)


# Status values :func:`apply` and :func:`status` report for each fix.
APPLIED = "applied"
NOT_NEEDED = "not-needed"
DISABLED = "disabled"
NOT_APPLIED = "not-applied"
UNAVAILABLE = "unavailable"

# The three *_on_batch methods share one upstream bug (keras-on-batch).
_ON_BATCH = (
    ("predict", "returned N times the rows", on_batch.make_predict),
    ("test", "counted every example N times", on_batch.make_test),
    ("train", "counted every example N times", on_batch.make_train),
)

# The mechanics of each fix; what it is and why is its record in
# mirrorkit.patching.catalogue (the same name).
FIXES: dict[str, Fix] = {fix.name: fix for fix in (
    Fix("symbolic-build", "Attempt to convert a value (PerReplica",
        ("backend-trainer", "_maybe_symbolic_build"), symbolic_build.make,
        probes.uneven_global_batch),
    Fix("scalar-logs", "Invalid reduction dimension 0 for input with 0 dimensions",
        ("backend-trainer-module", "reduce_per_replica"), scalar_logs.make),
    Fix("multi-step", "You must feed a value for placeholder tensor",
        ("backend-trainer", "_make_function"), multistep.make,
        probes.several_steps_per_call),
    Fix("empty-conv", "Incompatible shapes", ("backend-nn", "conv"), empty_conv.guard_op,
        also=(("backend-nn", "depthwise_conv", empty_conv.guard_op),
              ("backend-nn", "separable_conv", empty_conv.guard_op),
              ("backend-nn", "conv_transpose", empty_conv.guard_op),
              ("backend-trainer", "make_predict_function",
               empty_conv.guard_predict_function),
              ("backend-trainer", "make_test_function",
               empty_conv.guard_test_function))),
    # Not a multi-worker bug: any strategy with 2+ replicas.
    *(Fix(f"{kind}-on-batch", f"{kind}_on_batch {symptom}",
          ("backend-trainer", f"{kind}_on_batch"), make)
      for kind, symptom, make in _ON_BATCH),
    Fix("step-variables", "You must feed a value for placeholder tensor",
        ("backend-variable", "_initialize_with_initializer"), step_variables.make),
    Fix("no-call-build", "does not have a `call()` method implemented",
        ("base-trainer", "_symbolic_build"), no_call_build.make),
    # Below cross-replica-step's and no-gradient-losses' wrappers of the same
    # two functions: it weighs a share only where they let Keras scale it.
    Fix("uneven-batch-losses", "an uneven batch weighs each replica's mean 1/N",
        ("loss-module", "scale_loss_for_distribution"), uneven_batches.make_scale,
        also=(("loss-module", "unscale_loss_for_distribution", uneven_batches.make_unscale),
              ("strategy-base", "run",
               uneven_batches.make_run))),
    Fix("cross-replica-step",
        "DistributedVariable.handle is not available outside the replica context",
        ("backend-variable", "handle"), cross_replica_step.make_handle,
        also=(("loss-module", "scale_loss_for_distribution",
               cross_replica_step.make_loss_scale),
              ("loss-module", "unscale_loss_for_distribution",
               cross_replica_step.make_loss_scale),
              ("tf-interim", "maybe_merge_call",
               cross_replica_step.make_maybe_merge_call),
              ("loss-scale-optimizer", "_tf_apply",
               cross_replica_step.make_lso_apply))),
    Fix("generator-copies", "shares memory with the generator's array",
        ("tensorflow.python.ops.script_ops.FuncRegistry", "__call__"),
        generator_copies.make),
    Fix("gradient-accumulation", "`merge_call` called while defining a new graph",
        ("backend-optimizer", "_backend_apply_gradients"),
        accumulation.make),
    Fix("layer-losses", "add_loss of a layer's Loss trains at 1/N",
        ("loss-module", "reduce_values"), layer_losses.make),
    Fix("scalar-losses", "a loss returning a scalar trains at N times",
        ("loss-module", "reduce_weighted_values"), scalar_losses.make),
    # Stacks on scalar-losses' wrapper of the same function.
    Fix("masked-loss-means", "a masked loss averages per replica, not over the batch",
        ("loss-module", "reduce_weighted_values"), masked_means.make),
    Fix("overridden-loss-call", "a Loss overriding __call__ trains at N times",
        ("keras.src.trainers.compile_utils.CompileLoss", "build"),
        overridden_losses.make_build,
        also=(("loss-module", "scale_loss_for_distribution", overridden_losses.make_scale),)),
    Fix("batch-wide-metrics", "a metric the script wrote counts 1/N of its batch's pairs",
        ("keras.src.trainers.compile_utils.CompileMetrics", "build"),
        batch_metrics.make_build),
    Fix("batch-sum-losses", "an add_loss summing over the batch trains at 1/N",
        ("layer", "add_loss"), batch_sums.make,
        # Stacks on layer-losses' wrapper of the same function.
        also=(("loss-module", "reduce_values", batch_sums.make_reduce_values),
              ("backend-nn", "ctc_loss", batch_sums.make_ctc_loss))),
    Fix("paired-step-losses", "a step loss pairing its batch's examples differs silently",
        ("gradient-tape", "gradient"), paired_losses.make),
    # Stacks on no-call-build's wrapper of the same function.
    Fix("symbolic-build-names", "Invalid Input name (keras_tensor_",
        ("base-trainer", "_symbolic_build"), symbolic_names.make),
    # Both stack on cross-replica-step's wrappers of the same two functions.
    Fix("no-gradient-losses", "a loss in a custom test_step reports 1/N",
        ("loss-module", "scale_loss_for_distribution"), no_gradient_losses.make,
        also=(("loss-module", "unscale_loss_for_distribution", no_gradient_losses.make),)),
    Fix("logged-step-losses", "a custom train_step logs 1/N of its loss",
        ("mean-metric", "update_state"),
        logged_losses.make_update_state,
        also=(("loss", "__call__", logged_losses.make_loss_call),
              ("base-trainer", "compute_loss",
               logged_losses.make_compute_loss),
              # Stacks on multi-step's wrapper of the same method.
              ("backend-trainer", "_make_function",
               logged_losses.make_make_function),
              ("loss-module", "unscale_loss_for_distribution", logged_losses.make_unscale),
              ("base-trainer", "_compute_loss",
               logged_losses.make_step_loss),
              *(("tf-nn", name, logged_losses.make_share)
                for name in ("compute_average_loss", "scale_regularization_loss")))),
    # Stacks on paired-step-losses' wrapper; needs logged-step-losses' shares and step mark.
    Fix("hand-mean-gradients", "a loss averaged by hand in a custom step trains at N times",
        ("gradient-tape", "gradient"),
        mean_gradients.make_gradient),
    # Stacks on symbolic-build's wrapper of the same method.
    Fix("symbolic-build-order", "fit trains in another data order under a strategy",
        ("backend-trainer", "_maybe_symbolic_build"), symbolic_order.make),
    Fix("step-metrics", "batch-end logs average the replicas' metric results",
        ("base-trainer", "get_metrics_result"), step_metrics.make),
    Fix("replica-random", "every replica draws the same Dropout masks",
        ("backend-random", "dropout"), replica_random.make_dropout,
        also=(*(("backend-random", name, replica_random.make_draw)
                for name in ("uniform", "normal", "truncated_normal", "randint")),
              ("backend-random", "categorical",
               replica_random.make_categorical),
              ("strategy-base", "run",
               replica_random.make_run),
              *(("tensorflow.python.ops.gen_random_ops", name, replica_op_draws.make)
                for name in ("random_standard_normal", "random_uniform", "truncated_normal")),
              ("tf-random-seed", "get_seed",
               replica_op_draws.make_get_seed))),
    Fix("replica-global-seed", "tf.function only supports singleton tf.Variables created on "
        "the first call", ("seed-generator-module", "global_seed_generator"),
        replica_seeds.make_generator,
        also=(("tensorflow.python.distribute.mirrored_run._MirroredReplicaThread", "__init__",
               replica_seeds.make_thread_init),)),
    Fix("replica-variable-copies", "a variable the replicas assign from their rows drifts apart",
        ("tensorflow.python.distribute.values", "_on_write_update_replica"),
        replica_copies.make),
    Fix("static-batch-shapes", "Cannot take the length of shape with unknown rank",
        ("tensorflow.python.distribute.input_lib.DistributedDataset", "build"),
        static_batches.make_build),
    Fix("sparse-gradient-sums", "an embedding's Adam update differs under replicas",
        ("backend-optimizer", "_all_reduce_sum_gradients"),
        sparse_sums.make),
    Fix("xla-cpu-replicas", "Collectives are not yet implemented for CPU devices",
        ("base-trainer-module", "model_supports_jit"), xla_cpu.make),
)}

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
    if any(FIXES[name].is_applied() for name in skip if name in FIXES):
        # A fix may sit under another's wrapper of the same function: take
        # every fix off, newest first, and put the enabled ones back in order.
        for fix in reversed(FIXES.values()):
            fix.revert()
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
    # Newest first: a fix stacked on another's function comes off before it.
    for fix in reversed(FIXES.values()):
        try:
            fix.revert()
        except FixUnavailable:
            pass
    _DECISIONS.clear()
    _UNAVAILABLE.clear()
