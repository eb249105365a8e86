"""The upstream fixes of how a replica's loss, gradient and logs relate to one device's.

Records as in :mod:`mirrorkit.patching.fixes` (one each, the whole truth:
targets by role, the bug, its report or reproduction, probe, control test).
These fixes change the same few Keras functions (the loss module's scaling
and reductions, ``GradientTape.gradient``): each such function is wrapped
once, the fixes' layers in the order :mod:`mirrorkit.patching.spots` writes,
following the model of :mod:`mirrorkit.compat.replica_loss`.

Example:
    >>> [p.name for p in LOSS_FIX_RECORDS][:2]
    ['uneven-batch-losses', 'cross-replica-step']
"""

from __future__ import annotations

from mirrorkit.patching.record import (
    TESTED_KERAS,
    TESTED_LATEST,
    Bug,
    Patch,
)
from mirrorkit.patching.record import Target as T
from mirrorkit.patching.record import (
    fix_record as _fix,
)

LOSS_FIX_RECORDS: tuple[Patch, ...] = (
    _fix("uneven-batch-losses",
         targets=(T("loss-module", "scale_loss_for_distribution", "uneven_batches:make_scale"),
                  T("loss-module", "unscale_loss_for_distribution", "uneven_batches:make_unscale"),
                  T("strategy-base", "run", "step_rows:make_run")),
         changes="a replica's loss share is weighed by its rows over the global batch's (the "
                 "logged value by the inverse); across workers one all-gather of the replicas' "
                 "row counts per traced step whose batch size is not static",
         reason="under N replicas a batch that does not split evenly (5 rows on 2 replicas) "
                "weighs each replica's mean 1/N: the smaller slice's rows count more than on "
                "one device.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "an uneven batch weighs each replica's mean 1/N",
                 repro="upstream_repros/uneven_batch_losses.py"),
         probe="probes_losses:uneven_batch",
         control="tests/compat/test_uneven_batches.py"),
    _fix("cross-replica-step",
         targets=(T("backend-variable", "handle", "cross_replica_step:make_handle"),
                  T("loss-module", "scale_loss_for_distribution",
                    "cross_replica_step:make_loss_scale"),
                  T("loss-module", "unscale_loss_for_distribution",
                    "cross_replica_step:make_loss_scale"),
                  T("tf-interim", "maybe_merge_call", "cross_replica_step:make_maybe_merge_call"),
                  T("loss-scale-optimizer", "_tf_apply", "cross_replica_step:make_lso_apply")),
         changes="a GradientTape step outside strategy.run reads and updates mirrored variables "
                 "as one replica",
         reason="a GradientTape step outside strategy.run on mirrored variables fails "
                "('DistributedVariable.handle is not available outside the replica context') "
                "and Keras losses are divided by the replica count there.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "DistributedVariable.handle is not available outside the replica context",
                 upstream=("tensorflow/tensorflow#36392",)),
         probe="probes_training:step_outside_run",
         control="tests/compat/test_training_loops.py"),
    _fix("layer-losses",
         targets=(T("loss-module", "reduce_values", "layer_losses:make"),),
         changes="a Loss called inside a layer for add_loss is scaled for the replicas once",
         reason="under N replicas a keras.losses.Loss called inside a layer and passed to "
                "add_loss (keras.io's LogisticEndpoint) is divided by N twice: it trains at 1/N "
                "strength.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS, "add_loss of a layer's Loss trains at 1/N",
                 repro="upstream_repros/layer_losses.py"),
         probe="probes_losses:add_loss_of_a_loss",
         control="tests/compat/test_layer_losses.py"),
    _fix("scalar-losses",
         targets=(T("loss-module", "reduce_weighted_values", "scalar_losses:make"),),
         changes="a loss that returns one value for the batch is divided by the replicas like a "
                 "per-example loss's mean",
         reason="under N replicas a loss function or Loss.call that returns one value for the "
                "batch (ops.mean(...) of the errors) is not divided by N like a per-example "
                "loss: evaluate reports N times the one-device loss and every step moves the "
                "weights N times as far (tensorflow#35093, keras#16285 report the family).",
         bug=Bug("keras", "3.0", None, TESTED_KERAS, "a loss returning a scalar trains at N times",
                 upstream=("keras-team/keras#16285", "tensorflow/tensorflow#35093"),
                 repro="upstream_repros/scalar_losses.py"),
         probe="probes_losses:scalar_loss",
         control="tests/compat/test_scalar_losses.py"),
    _fix("masked-loss-means",
         targets=(T("loss-module", "reduce_weighted_values", "masked_means:make"),),
         changes="a loss with a Keras mask (or reduction mean_with_sample_weight) is divided by "
                 "the global batch's valid entries (sum of weights), one sum of the replicas' "
                 "counts per call",
         reason="under N replicas a loss with a Keras mask (padded sequences behind "
                "Embedding(mask_zero=True), ignore_class) averages over each replica's own "
                "valid entries, not the batch's: the update and the logged loss differ from one "
                "device's.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "a masked loss averages per replica, not over the batch",
                 repro="upstream_repros/masked_loss_means.py"),
         probe="probes_losses:masked_mean",
         control="tests/compat/test_masked_means.py", tested=TESTED_LATEST),
    _fix("overridden-loss-call",
         targets=(T("keras.src.trainers.compile_utils.CompileLoss", "build",
                    "overridden_losses:make_build"),
                  T("loss-module", "scale_loss_for_distribution", "overridden_losses:make_scale")),
         changes="a compiled Loss whose class overrides __call__ runs on the global batch "
                 "(every replica's rows gathered) and its scalar is divided by the replicas, "
                 "unless Keras's own scaling ran during the call (per-example values: their "
                 "logged value only)",
         reason="under N replicas a keras.losses.Loss subclass that overrides __call__ and "
                "returns one value for the batch (keras.io's supervised contrastive learning) "
                "is never divided by N: the logged loss is N times the replicas' mean and every "
                "step moves the weights N times as far; one that returns per-example values "
                "trains right but logs N times the loss.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "a Loss overriding __call__ trains at N times",
                 repro="upstream_repros/overridden_loss_call.py"),
         probe="probes_losses:overridden_call",
         control="tests/compat/test_scalar_losses.py", tested=TESTED_LATEST),
    _fix("batch-wide-metrics",
         targets=(T("keras.src.trainers.compile_utils.CompileMetrics", "build",
                    "batch_metrics:make_build"),),
         changes="a compiled metric whose class or function the script wrote is updated once "
                 "per step on the global batch (every replica's labels, predictions and weights "
                 "gathered), on the first replica",
         reason="under N replicas every replica updates a compiled metric with its own slice of "
                "the batch and Keras sums the replicas' variables: one device's value only for "
                "a sum of per-example terms. A metric that pairs the examples of its batch "
                "(keras.io's CategoricalTruePositives compares (batch,) labels with (batch, 1) "
                "predictions) or a metric function returning one value for its batch logs "
                "another number than plain Python (2 replicas: 4433 true positives vs 8248).",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "a metric the script wrote counts 1/N of its batch's pairs",
                 upstream=("keras-team/keras#21054",),
                 repro="upstream_repros/batch_wide_metrics.py"),
         probe="probes_losses:metric_of_the_batch",
         control="tests/compat/test_batch_metrics.py", tested=TESTED_LATEST),
    _fix("batch-sum-losses",
         targets=(T("layer", "add_loss", "batch_sums:make"),
                  T("loss-module", "reduce_values", "batch_sums:make_reduce_values"),
                  T("backend-nn", "ctc_loss", "batch_sums:make_ctc_loss")),
         changes="an add_loss value that sums over the batch (read from its graph) is "
                 "multiplied by the global rows over the replica's rows, so Keras's division "
                 "leaves each replica its own sum",
         reason="under N replicas Keras divides every add_loss value by N: right for a mean "
                "over the batch or a weight regularizer, but a value that sums over the batch "
                "(keras.io's ActivityRegularizationLayer adds ops.sum(inputs) * 0.1), or has "
                "one value per example, which Keras sums (keras.io's OCR CTCLayer), then weighs "
                "1/N of plain Python's term in the gradients and the logged loss (2 replicas: "
                "6.25 vs 10.19).",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "an add_loss summing over the batch trains at 1/N",
                 repro="upstream_repros/batch_sum_losses.py"),
         probe="probes_losses:add_loss_sum",
         control="tests/compat/test_batch_sums.py", tested=TESTED_LATEST),
    _fix("paired-step-losses",
         targets=(T("gradient-tape", "gradient", "paired_losses:make"),),
         changes="in a replica's step of 2+ replicas, a loss whose graph multiplies two per-row "
                 "matrices (a similarity matrix pairing the batch's examples) is named once, "
                 "with the way to make it exact; the gradient is unchanged",
         reason="under N replicas a loss that pairs the examples of its batch (a contrastive "
                "loss scoring a (batch, batch) similarity matrix in a custom train_step, "
                "keras.io's SimCLR) is computed by each replica over its own slice only: the "
                "loss and the weight updates differ from one device's, with no error.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "a step loss pairing its batch's examples differs silently",
                 repro="upstream_repros/paired_step_losses.py", check=True),
         probe="probes_losses2:paired_rows",
         control="tests/compat/test_paired_losses.py", tested=TESTED_LATEST),
    _fix("no-gradient-losses",
         targets=(T("loss-module", "scale_loss_for_distribution", "no_gradient_losses:make"),
                  T("loss-module", "unscale_loss_for_distribution", "no_gradient_losses:make")),
         changes="a loss is divided by the replicas (and multiplied back for the logs) only "
                 "while a gradient tape records",
         reason="under N replicas a keras.losses.Loss called where no gradient is taken (a "
                "custom test_step, a metric computed by hand) is divided by N like a training "
                "loss: it reports 1/N of the one-device value.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS, "a loss in a custom test_step reports 1/N",
                 repro="upstream_repros/no_gradient_losses.py"),
         probe="probes_losses2:loss_without_gradient",
         control="tests/compat/test_step_losses.py"),
    _fix("logged-step-losses",
         targets=(T("mean-metric", "update_state", "logged_losses:make_update_state"),
                  T("loss-module", "reduce_weighted_values", "logged_losses:make_share"),
                  T("base-trainer", "compute_loss", "logged_losses:make_compute_loss"),
                  T("backend-trainer", "_make_function", "logged_losses:make_make_function"),
                  T("loss-module", "unscale_loss_for_distribution", "logged_losses:make_unscale"),
                  T("base-trainer", "_compute_loss", "logged_losses:make_step_loss"),
                  T("tf-nn", "compute_average_loss", "logged_losses:make_share"),
                  T("tf-nn", "scale_regularization_loss", "logged_losses:make_share")),
         changes="a Mean metric given a value of Keras's training step, or a log the step "
                 "returns, logs its loss-share parts and sums over the rows N times over (a "
                 "Loss call's, compute_loss's, tf.nn.compute_average_loss's result; alpha * a + "
                 "(1 - alpha) * b); Keras's own loss log unscales only the share parts of what "
                 "compute_loss returns",
         reason="under N replicas a custom train_step that logs the loss it computed "
                "(self.loss_tracker.update_state(loss)) reports 1/N of the one-device loss: the "
                "loss is each replica's share of the global loss.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS, "a custom train_step logs 1/N of its loss",
                 upstream=("keras-team/keras#15509",),
                 repro="upstream_repros/logged_step_losses.py"),
         probe="probes_losses2:logged_step_loss",
         control="tests/compat/test_step_losses.py"),
    _fix("hand-mean-gradients",
         targets=(T("gradient-tape", "gradient", "mean_gradients:make_gradient"),),
         changes="in fit's step on 2+ replicas, the part of the differentiated loss that is a "
                 "mean over the replica's rows (or independent of the batch) has its gradient "
                 "weighed by 1/N (rows over global rows on an uneven split), a hand-written "
                 "masked mean's by its mask's sum over the replicas' total, through the tape's "
                 "output_gradients; Keras shares and sums over the rows are left as they are",
         reason="under N replicas a loss a custom train_step averages by hand (ops.mean, "
                "keras.io's VAE) is not divided by N: the summed gradient is N times one "
                "device's.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "a loss averaged by hand in a custom step trains at N times",
                 repro="upstream_repros/hand_mean_gradients.py"),
         probe="probes_losses2:hand_mean",
         control="tests/compat/test_step_losses.py", tested=TESTED_LATEST),
)
