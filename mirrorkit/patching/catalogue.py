"""Every change mirrorkit makes to Keras, TensorFlow or Python, one :class:`Patch` each.

This table is the answer to "what did mirrorkit change in my Keras, and how do
I turn one thing off?": ``mirrorkit info`` lists it with each patch's status,
and ``MIRRORKIT_COMPAT_DISABLE=NAME[,NAME]`` turns any of them off by name
(``MIRRORKIT_COMPAT=off``: every ``fix``). The code of a patch lives where its
concept does (:mod:`mirrorkit.compat` for upstream bugs, :mod:`mirrorkit.runner`
for ``mirrorkit run``'s adaptations ...) and installs it only through
:mod:`mirrorkit.patching.engine`, which refuses a name that is not here.

Example:
    >>> from mirrorkit.patching.catalogue import PATCHES
    >>> PATCHES["chief-only-model-save"].targets
    ('keras.Model.save', 'keras.Model.save_weights')
"""

from __future__ import annotations

from mirrorkit.patching.adaptations import ADAPTATIONS
from mirrorkit.patching.record import TESTED, TESTED_LATEST, Patch

_TRAINER = "keras.src.backend.tensorflow.trainer.TensorFlowTrainer"
_NN = "keras.src.backend.tensorflow.nn"
_VARIABLE = "keras.src.backend.tensorflow.core.Variable"
_LOSS = "keras.src.losses.loss"


def _fix(name: str, targets: tuple[str, ...], changes: str, reason: str, control: str,
         scope: str = "process", tested: str = TESTED) -> Patch:
    return Patch(name, targets, changes, reason, scope=scope, kind="fix", tested=tested,
                 control=control)


_ON_BATCH = {
    "predict": "N times the rows come back",
    "test": "summed metrics count each example N times",
    "train": "summed metrics count each example N times and every replica does the whole "
             "batch's work",
}

_FIXES = (
    _fix("symbolic-build", (f"{_TRAINER}._maybe_symbolic_build",),
         "builds the model from this worker's first replica batch instead of a reduced one",
         "keras#20585: fit/evaluate reduce a PerReplica data batch to build the model, which "
         "fails across workers and whenever the global batch does not divide by the replicas.",
         "tests/compat/test_compat.py"),
    _fix("scalar-logs", ("keras.src.backend.tensorflow.trainer.reduce_per_replica",),
         "reduces rank-0 logs with axis=None (one collective per dtype)",
         "tensorflow#72388: the multi-worker branch of reduce_per_replica reduces scalar logs "
         "on axis 0.", "tests/compat/test_compat.py"),
    _fix("multi-step", (f"{_TRAINER}._make_function",),
         "runs several steps per call in a while loop whose condition checks for the next "
         "batch (one replica keeps Keras's code)",
         "keras#19246: steps_per_execution > 1 fails in fit/evaluate under a strategy with 2+ "
         "replicas (the step runs inside a tf.cond in a while loop).",
         "tests/compat/test_multistep.py"),
    _fix("empty-conv", (f"{_NN}.conv", f"{_NN}.depthwise_conv", f"{_NN}.separable_conv",
                        f"{_NN}.conv_transpose", f"{_TRAINER}.make_predict_function",
                        f"{_TRAINER}.make_test_function",
                        "Model.predict_function / test_function (per model)"),
         "an empty batch through a convolution runs on one zero row and returns zero rows",
         "tensorflow#30968: TensorFlow's oneDNN CPU convolutions return their input for an "
         "empty batch, so predict/evaluate fail when a replica's share of the last batch is "
         "empty.", "tests/compat/test_empty_conv.py"),
    *(_fix(f"{kind}-on-batch", (f"{_TRAINER}.{kind}_on_batch",),
           f"{kind}_on_batch splits its batch across the replicas like {kind} does",
           f"keras-on-batch: {kind}_on_batch gives the whole batch to every replica: {harm}.",
           "tests/compat/test_on_batch.py")
      for kind, harm in _ON_BATCH.items()),
    _fix("step-variables", (f"{_VARIABLE}._initialize_with_initializer",),
         "a variable first created inside a traced step is initialised outside the step's cond",
         "keras#19308: a Keras variable first created inside a tf.function under 2+ replicas "
         "(optimizer slots or layer weights in custom training loops) makes the step run in "
         "a tf.cond.", "tests/compat/test_training_loops.py"),
    _fix("no-call-build", ("keras.src.trainers.trainer.Trainer._symbolic_build",),
         "skips the symbolic build of a model without call(), and of a model with its own "
         "step when Keras's build fails",
         "keras-no-call-build: under any strategy fit builds the model by calling it on x of "
         "(x, y): a model without call() (a GAN) or whose step takes other batches (Siamese) "
         "fails.",
         "tests/compat/test_training_loops.py"),
    _fix("uneven-batch-losses", (f"{_LOSS}.scale_loss_for_distribution",
                                 f"{_LOSS}.unscale_loss_for_distribution",
                                 "tensorflow.python.distribute.distribute_lib.StrategyBase.run"),
         "a replica's loss share is weighed by its rows over the global batch's (the logged "
         "value by the inverse); across workers one all-gather of the replicas' row counts per "
         "traced step whose batch size is not static",
         "keras-uneven-batch-losses: under N replicas a batch that does not split evenly "
         "weighs each replica's mean 1/N, so that step's update differs from one device's.",
         "tests/compat/test_uneven_batches.py"),
    _fix("cross-replica-step", (f"{_VARIABLE}.handle", f"{_LOSS}.scale_loss_for_distribution",
                                f"{_LOSS}.unscale_loss_for_distribution",
                                "tf.__internal__.distribute.interim.maybe_merge_call",
                                "keras.src.optimizers.loss_scale_optimizer.LossScaleOptimizer"
                                "._tf_apply"),
         "a GradientTape step outside strategy.run reads and updates mirrored variables as "
         "one replica",
         "mirrorkit-cross-replica-step: a hand-written GradientTape step outside strategy.run "
         "on mirrored Keras variables (no strategy in the script, mirrorkit's script scope) "
         "fails.", "tests/compat/test_training_loops.py"),
    _fix("generator-copies", ("tensorflow.python.ops.script_ops.FuncRegistry.__call__",),
         "copies each array a generator or numpy_function returns before TensorFlow wraps it",
         "mirrorkit-generator-aliasing: tensors from Dataset.from_generator (PyDataset, "
         "generator inputs) and numpy_function share the returned aligned NumPy arrays, and "
         "under 2+ local replicas or workers a training step writes into them.",
         "tests/compat/test_generator_copies.py"),
    _fix("gradient-accumulation",
         ("keras.src.backend.tensorflow.optimizer.TFOptimizer._backend_apply_gradients",),
         "accumulates gradients per replica and synchronises outside the cond",
         "keras#20582: an optimizer with gradient_accumulation_steps synchronises the "
         "replicas inside a cond, which every tf.distribute strategy rejects.",
         "tests/compat/test_accumulation.py"),
    _fix("layer-losses", (f"{_LOSS}.reduce_values",),
         "a Loss called inside a layer for add_loss is scaled for the replicas once",
         "keras-layer-loss-scaling: a keras.losses.Loss called inside a layer and passed to "
         "add_loss is divided by the replica count twice, so it trains at 1/N of its "
         "strength.", "tests/compat/test_layer_losses.py"),
    _fix("scalar-losses", (f"{_LOSS}.reduce_weighted_values",),
         "a loss that returns one value for the batch is divided by the replicas like a "
         "per-example loss's mean",
         "keras-scalar-loss-scaling: a loss function or Loss.call returning a scalar is not "
         "divided by N under N replicas, so evaluate reports N times the loss and every step "
         "moves the weights N times as far.", "tests/compat/test_scalar_losses.py"),
    _fix("masked-loss-means", (f"{_LOSS}.reduce_weighted_values",),
         "a loss with a Keras mask (or reduction mean_with_sample_weight) is divided by the "
         "global batch's valid entries (sum of weights), one sum of the replicas' counts per "
         "call",
         "keras-masked-loss-means: under N replicas a masked loss (Embedding(mask_zero=True), "
         "ignore_class) averages over each replica's own valid entries, so replicas with "
         "short sequences weigh more and the update and the logged loss differ from one "
         "device's.", "tests/compat/test_masked_means.py", tested=TESTED_LATEST),
    _fix("overridden-loss-call", ("keras.src.trainers.compile_utils.CompileLoss.build",
                                  f"{_LOSS}.scale_loss_for_distribution"),
         "a compiled Loss whose class overrides __call__ runs on the global batch (every "
         "replica's rows gathered) and its scalar is divided by the replicas, unless Keras's "
         "own scaling ran during the call (per-example values: their logged value only)",
         "keras-overridden-loss-call: a keras.losses.Loss subclass overriding __call__ (keras.io's "
         "supervised contrastive loss) skips Keras's scaling for the replicas: under N "
         "replicas it logs N times the loss and every step moves the weights N times as far.",
         "tests/compat/test_scalar_losses.py", tested=TESTED_LATEST),
    _fix("batch-wide-metrics", ("keras.src.trainers.compile_utils.CompileMetrics.build",),
         "a compiled metric whose class or function the script wrote is updated once per step "
         "on the global batch (every replica's labels, predictions and weights gathered), on "
         "the first replica",
         "keras-batch-wide-metrics: under N replicas each replica updates a compiled metric "
         "with its own slice, which gives one device's value only for a sum of per-example "
         "terms: keras.io's CategoricalTruePositives (a (batch, batch) comparison) logs about "
         "1/N of plain Python's count.", "tests/compat/test_batch_metrics.py",
         tested=TESTED_LATEST),
    _fix("batch-sum-losses", ("keras.src.layers.layer.Layer.add_loss", f"{_LOSS}.reduce_values",
                              "keras.src.backend.tensorflow.nn.ctc_loss"),
         "an add_loss value that sums over the batch (read from its graph) is multiplied by "
         "the global rows over the replica's rows, so Keras's division leaves each replica "
         "its own sum",
         "keras-batch-sum-losses: under N replicas Keras divides every add_loss value by N, "
         "which for a value summing over the batch (keras.io's ActivityRegularizationLayer, "
         "ops.sum(inputs) * 0.1; its OCR example's per-example CTC losses, which Keras sums) "
         "leaves 1/N of plain Python's term in the loss and the gradients.",
         "tests/compat/test_batch_sums.py", tested=TESTED_LATEST),
    _fix("paired-step-losses", ("tensorflow.python.eager.backprop.GradientTape.gradient",),
         "in a replica's step of 2+ replicas, a loss whose graph multiplies two per-row "
         "matrices (a similarity matrix pairing the batch's examples) is named once, with "
         "the way to make it exact; the gradient is unchanged",
         "keras-paired-step-losses: under N replicas a loss that pairs the examples of its "
         "batch (keras.io's SimCLR contrastive loss in a custom train_step) sees only the "
         "replica's slice, so loss and updates differ from one device's with no error.",
         "tests/compat/test_paired_losses.py", tested=TESTED_LATEST),
    _fix("symbolic-build-names", ("keras.src.trainers.trainer.Trainer._symbolic_build",
                                  "keras.src.backend.compute_output_spec (during the build)"),
         "the throwaway symbolic tensors of the build before the first step leave Keras's "
         "tensor-name counter as plain Python leaves it",
         "keras-symbolic-build-names: under a strategy the symbolic build before the first "
         "fit advances the keras_tensor_N counter, so tensor names (a TFLite signature's input "
         "name, a lazily built Sequential's input) differ from plain Python's.",
         "tests/compat/test_symbolic_names.py"),
    _fix("no-gradient-losses", (f"{_LOSS}.scale_loss_for_distribution",
                                f"{_LOSS}.unscale_loss_for_distribution"),
         "a loss is divided by the replicas (and multiplied back for the logs) only while a "
         "gradient tape records",
         "keras-no-gradient-loss-scaling: under N replicas a keras.losses.Loss called where "
         "no gradient is taken (a custom test_step, a metric by hand) reports 1/N of the "
         "one-device value.", "tests/compat/test_step_losses.py"),
    _fix("logged-step-losses", ("keras.src.metrics.reduction_metrics.Mean.update_state",
                                f"{_LOSS}.Loss.__call__",
                                "keras.src.trainers.trainer.Trainer.compute_loss",
                                f"{_TRAINER}._make_function",
                                f"{_LOSS}.unscale_loss_for_distribution",
                                "keras.src.trainers.trainer.Trainer._compute_loss",
                                "tensorflow.nn.compute_average_loss",
                                "tensorflow.nn.scale_regularization_loss"),
         "a Mean metric given a value of Keras's training step, or a log the step returns, "
         "logs its loss-share parts and sums over the rows N times over (a Loss call's, "
         "compute_loss's, tf.nn.compute_average_loss's result; alpha * a + (1 - alpha) * b); "
         "Keras's own loss log unscales only the share parts of what compute_loss returns",
         "keras-logged-step-loss: under N replicas a custom train_step that logs the loss it "
         "computed, with a keras.metrics.Mean or in its returned logs, reports 1/N of the "
         "one-device loss.",
         "tests/compat/test_step_losses.py"),
    _fix("hand-mean-gradients", ("tensorflow.python.eager.backprop.GradientTape.gradient",),
         "in fit's step on 2+ replicas, the part of the differentiated loss that is a mean "
         "over the replica's rows (or independent of the batch) has its gradient weighed by "
         "1/N (rows over global rows on an uneven split), a hand-written masked mean's by its "
         "mask's sum over the replicas' total, through the tape's output_gradients; Keras "
         "shares and sums over the rows are left as they are",
         "keras-hand-mean-gradients: under N replicas a loss a custom train_step or an "
         "overridden compute_loss averages by hand (ops.mean, keras.io's Variational "
         "AutoEncoder) is not divided by N, so the summed gradient is N times one device's.",
         "tests/compat/test_step_losses.py", tested=TESTED_LATEST),
    _fix("symbolic-build-order", (f"{_TRAINER}._maybe_symbolic_build",),
         "builds the model from the input's element_spec instead of a peeked batch (else "
         "peeks and puts Python's and NumPy's random states back); a script's own strategy "
         "keeps the peek, as under plain Python",
         "keras-symbolic-build-order: under a strategy the batch peeked before fit draws the "
         "input's randomness once more (a reshuffled tf.data pipeline, a PyDataset), so fit "
         "trains in another order than plain Python.", "tests/compat/test_symbolic_names.py"),
    _fix("step-metrics", ("keras.src.trainers.trainer.Trainer.get_metrics_result",),
         "inside a replica, the step's metric results are read once for all replicas (a "
         "merge_call), so each batch's logs are the global batch's",
         "keras-step-metrics: under N replicas the batch-end logs average the replicas' own "
         "metric results, which for weighted metrics and uneven slices (loss included) is "
         "not the global batch's value.", "tests/compat/test_step_losses.py"),
    _fix("replica-random", tuple(f"keras.src.backend.tensorflow.random.{name}" for name in
                                 ("dropout", "uniform", "normal", "truncated_normal", "randint",
                                  "categorical")) +
         ("tensorflow.python.distribute.distribute_lib.StrategyBase.run",) +
         tuple(f"tensorflow.python.ops.gen_random_ops.{name}" for name in
               ("random_standard_normal", "random_uniform", "truncated_normal")) +
         ("tensorflow.python.framework.random_seed.get_seed",),
         "a batch-shaped random draw inside strategy.run (keras.random, Keras's layers, "
         "tf.random.normal/uniform/truncated_normal) is this replica's rows of the draw for "
         "the global batch (across workers one all-gather of the replicas' row counts per "
         "traced step)",
         "keras-replica-random: under N replicas every replica draws the same Dropout masks, "
         "noise and random augmentation for its slice, so training is less random than on "
         "one device and its numbers differ from plain Python's.",
         "tests/compat/test_replica_random.py"),
    _fix("replica-global-seed",
         ("keras.src.random.seed_generator.global_seed_generator",
          "tensorflow.python.distribute.mirrored_run._MirroredReplicaThread.__init__"),
         "a replica thread's seedless keras.random draw uses the global SeedGenerator of the "
         "thread that started the replicas (made there on first use, as on one device)",
         "keras-global-seed-threads: Keras keeps its global SeedGenerator per thread and "
         "tf.distribute runs each replica's step in a new thread per trace, so a seedless "
         "keras.random draw in a step makes a variable on the second trace and the step fails.",
         "tests/compat/test_replica_seeds.py"),
    _fix("replica-variable-copies",
         ("tensorflow.python.distribute.values._on_write_update_replica",),
         "in a replica's step of 2+ replicas, the script's assignment of a variable with "
         "aggregation 'none' from the replica's rows is named once, with the ways to make it "
         "exact; the update is unchanged",
         "tf-none-aggregation-copies: under N replicas a variable with aggregation 'none' "
         "assigned in the step (keras.io's NNCLR feature queue) is written on each replica's "
         "copy alone, so the copies drift apart and from plain Python's value, with no error.",
         "tests/compat/test_replica_copies.py", tested=TESTED_LATEST),
    _fix("static-batch-shapes",
         ("tensorflow.python.distribute.input_lib.DistributedDataset.build",),
         "across workers, a dataset sharded by data whose batches are all full and divide by "
         "the replicas keeps its static batch size (no partial-batch handling)",
         "tf-mwms-dynamic-batch: under MultiWorkerMirroredStrategy every finite distributed "
         "dataset gets a batch dimension of None, so code that is right in one process "
         "(ops.squeeze of a batch of labels, keras.io's supervised contrastive loss) fails "
         "on every worker.", "tests/compat/test_static_batches.py", tested=TESTED_LATEST),
    _fix("sparse-gradient-sums",
         ("keras.src.backend.tensorflow.optimizer.TFOptimizer._all_reduce_sum_gradients",),
         "adds up, row by row, the replicas' sparse gradient slices that carry the same "
         "indices (a position embedding), after the all-reduce concatenated them",
         "keras-sparse-gradient-sums: under N replicas a lookup's IndexedSlices gradient "
         "arrives once per replica and Adam-like optimizers square each part apart, so an "
         "embedding's update differs from one device's.", "tests/compat/test_sparse_sums.py",
         tested=TESTED_LATEST),
    _fix("xla-cpu-replicas", ("keras.src.trainers.trainer.model_supports_jit",),
         "a model whose strategy has 2+ replicas, all CPU devices, does not support "
         "jit_compile (Keras then trains it without XLA), and one line says why",
         "tf-xla-cpu-collectives: XLA cannot compile a step whose replicas are CPU devices "
         "(a resource on another CPU device in one process, 'Collectives are not yet "
         "implemented for CPU devices' across workers), so jit_compile=True (keras.io's "
         "image classification from scratch) fails where one CPU trains.",
         "tests/compat/test_xla_cpu.py", tested=TESTED_LATEST),
    _fix("malloc-thresholds",
         ("glibc mallopt(M_MMAP_THRESHOLD, M_TRIM_THRESHOLD)",
          "tensorflow.python.distribute.distribute_lib.StrategyBase."
          "experimental_distribute_dataset",
          "tensorflow.python.distribute.distribute_lib.StrategyBase."
          "distribute_datasets_from_function"),
         "puts glibc's allocation thresholds back (decided at the first distributed dataset, "
         "the two StrategyBase methods wrapped until then)",
         "mirrorkit-allocator: TensorFlow 2.21 freezes glibc's mmap threshold, so CPU steps "
         "map and unmap large buffers every step (about 2x slower).",
         "tests/compat/test_allocator.py"),
    _fix("saving-skipset-cache", ("keras.src.saving.saving_lib.get_attr_skipset",),
         "caches the attributes a save skips per type, filled on every worker at once",
         "mirrorkit-saving-cache: get_attr_skipset reads one cache key and stores another, so "
         "every save and load builds a throw-away Optimizer; under MultiWorkerMirroredStrategy "
         "that is a collective, and a chief-only restore desynchronises the workers.",
         "tests/training/test_backup_paths.py", scope="multi-worker process"),
)

PATCHES: dict[str, Patch] = {p.name: p for p in (*_FIXES, *ADAPTATIONS)}
