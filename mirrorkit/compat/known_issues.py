"""Known upstream TensorFlow/Keras problems, and whether the installed versions have them.

This is a registry used by ``mirrorkit info`` to warn, and by
:mod:`mirrorkit.compat` to decide which fixes to apply.

Example:
    >>> issues = affecting({"keras": "3.15.1", "tensorflow": "2.21.0"})
    >>> "keras#20585" in [i.ref for i in issues]
    True
"""

from __future__ import annotations

# What an entry is and how versions compare live in issue_record; they are
# part of this module's documented interface too.
from mirrorkit.compat.issue_record import (
    KnownIssue,
    installed_version,
    parse_version,
    provider,
)

__all__ = ["KNOWN_ISSUES", "KnownIssue", "TESTED_KERAS", "TESTED_TENSORFLOW",
           "TESTED_TENSORFLOW_LATEST", "affecting", "installed_version", "parse_version",
           "provider"]


# The Keras versions of the test matrix (tools/compat-matrix/results.md).
TESTED_KERAS = ("3.15.1", "3.15.1")
TESTED_TENSORFLOW = ("2.19.1", "2.21.0")
# Issues found after the last compat-matrix run: measured on the newest version only, so
# older versions decide by probe or apply the fix as "assumed".
TESTED_TENSORFLOW_LATEST = ("2.21.0", "2.21.0")

KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue(
        "keras#20585", "keras", "3.0", None,
        "model.fit/evaluate reduce a PerReplica data batch to build the model: under "
        "MultiWorkerMirroredStrategy it fails ('Attempt to convert a value (PerReplica'), "
        "under MirroredStrategy whenever the global batch does not divide by the "
        "replicas ('Inputs to operation AddN ... must have the same size and shape').",
        "compat fix 'symbolic-build' builds from the local batch; applied when "
        "mirrorkit creates a multi-replica strategy (mirrorkit.fix_multi_worker() otherwise).",
        TESTED_KERAS,
    ),
    KnownIssue(
        "tensorflow#72388", "keras", "3.0", None,
        "under MultiWorkerMirroredStrategy Keras reduces scalar step logs on axis 0 "
        "('Invalid reduction dimension 0 for input with 0 dimensions').",
        "compat fix 'scalar-logs' reduces scalars with axis=None; applied with the "
        "multi-worker strategy (mirrorkit.fix_multi_worker() otherwise).", TESTED_KERAS,
    ),
    KnownIssue(
        "keras-chief-saving", "keras", "3.0", None,
        "BackupAndRestore/ModelCheckpoint/TensorBoard have no chief logic: workers "
        "sharing a path collide on HDF5 locks (BlockingIOError, then UnavailableError).",
        "mirrorkit.callbacks' BackupAndRestore/ModelCheckpoint/TensorBoard and "
        "save_model: only the chief writes the real path.",
    ),
    KnownIssue(
        "tf-mwms-join-wait", "tensorflow", "2.0", None,
        "a MultiWorkerMirroredStrategy worker waits for peers that never start "
        "with no practical bound (still waiting after 90 s; TF's default is an hour).",
        "get_strategy bounds the wait (MIRRORKIT_JOIN_TIMEOUT, default 300 s) and "
        "peer-loss detection (MIRRORKIT_COLLECTIVE_TIMEOUT, default 10 s).",
    ),
    KnownIssue(
        "keras#19246", "keras", "3.0", None,
        "steps_per_execution > 1 in fit fails under MirroredStrategy with 2+ replicas.",
        "compat fix 'multi-step' runs the steps in a while loop without a cond around "
        "the step; applied with any multi-replica strategy mirrorkit creates.", TESTED_KERAS,
    ),
    KnownIssue(
        "tensorflow#30968", "tensorflow", "2.0", None,
        "TensorFlow's oneDNN CPU convolutions return their input unchanged for an empty "
        "batch, so predict/evaluate on inputs that leave a replica empty (1 image on 2 "
        "replicas) fail at the next BatchNormalization ('Incompatible shapes').",
        "compat fix 'empty-conv' guards the convolutions of multi-replica predict/evaluate "
        "functions (checked once by a tiny convolution on first use).",
        TESTED_TENSORFLOW,
    ),
    KnownIssue(
        "keras-on-batch", "keras", "3.0", None,
        "predict_on_batch/test_on_batch/train_on_batch give the whole batch to every "
        "replica under a strategy with 2+ replicas: predict_on_batch returns N times the "
        "rows (64 for 32 images on 2 replicas), summing metrics count N times.",
        "compat fixes 'predict-on-batch', 'test-on-batch', 'train-on-batch' split the "
        "batch across the replicas where that gives one device's results exactly.", TESTED_KERAS,
    ),
    KnownIssue(
        "keras#19308", "keras", "3.0", None,
        "custom training loops under MirroredStrategy with 2+ replicas fail at the first "
        "step when optimizer or layer variables are created inside the traced "
        "strategy.run ('You must feed a value for placeholder tensor ...cond...').",
        "compat fix 'step-variables' creates such variables outside the trace.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras-no-call-build", "keras", "3.0", None,
        "fit under any tf.distribute strategy builds a model by calling it on x of (x, y): "
        "fails without call() (keras.io GAN) or with batches a custom step unpacks (Siamese).",
        "compat fix 'no-call-build' leaves such a build to the step, as without a strategy.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "mirrorkit-cross-replica-step", "keras", "3.0", None,
        "a GradientTape step outside strategy.run on mirrored variables fails "
        "('DistributedVariable.handle is not available outside the replica context') "
        "and Keras losses are divided by the replica count there.",
        "compat fix 'cross-replica-step' runs such a step on one replica's terms and "
        "updates every copy (mirrorkit run's script scope makes every loop such a step).",
        TESTED_KERAS,
    ),
    KnownIssue(
        "mirrorkit-generator-aliasing", "tensorflow", "2.0", None,
        "Dataset.from_generator (behind keras.utils.PyDataset and generator inputs) and "
        "numpy_function wrap the 64-byte aligned NumPy arrays returned without a copy; "
        "under 2+ local replicas or workers the training step writes into them (the user's "
        "data overwritten, so the loss and the weights differ from one device's, on runs whose "
        "arrays happen to be aligned: every run for large arrays).",
        "compat fix 'generator-copies' copies each returned array before TensorFlow wraps it.",
        TESTED_TENSORFLOW,
    ),
    KnownIssue(
        "tf-mwms-dynamic-batch", "tensorflow", "2.0", None,
        "under MultiWorkerMirroredStrategy experimental_distribute_dataset turns on "
        "partial-batch handling for every finite dataset, so every batch dimension is None "
        "even where each worker gets the same full batches: ops.squeeze of a (None,) batch "
        "has unknown rank, and keras.io's supervised contrastive loss fails on every worker "
        "('Cannot take the length of shape with unknown rank').",
        "compat fix 'static-batch-shapes' turns the handling off where every worker gets "
        "the same full batches (sharded by data, static batches that divide by the replicas).",
        TESTED_TENSORFLOW_LATEST,
    ),
    KnownIssue(
        "tf-xla-cpu-collectives", "tensorflow", "2.0", None,
        "XLA cannot compile a training step whose replicas are CPU devices: under "
        "MirroredStrategy over logical CPUs a variable of replica 1 is read from CPU:0, and "
        "across CPU workers 'Collectives are not yet implemented for CPU devices when "
        "compiling with XLA' (b/194942685), then a crash; jit_compile=True works on one CPU.",
        "compat fix 'xla-cpu-replicas' makes Keras train such a model without XLA.",
        TESTED_TENSORFLOW_LATEST,
    ),
    KnownIssue(
        "keras-layer-loss-scaling", "keras", "3.0", None,
        "under N replicas a keras.losses.Loss called inside a layer and passed to add_loss "
        "(keras.io's LogisticEndpoint) is divided by N twice: it trains at 1/N strength.",
        "compat fix 'layer-losses' leaves such a loss unscaled inside the layer call; "
        "add_loss scales it once.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras-scalar-loss-scaling", "keras", "3.0", None,
        "under N replicas a loss function or Loss.call that returns one value for the batch "
        "(ops.mean(...) of the errors) is not divided by N like a per-example loss: evaluate "
        "reports N times the one-device loss and every step moves the weights N times as far "
        "(tensorflow#35093, keras#16285 report the family).",
        "compat fix 'scalar-losses' scales such a value like a per-example loss's mean, so "
        "fit, evaluate and the *_on_batch methods give the one-device loss and update.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras-masked-loss-means", "keras", "3.0", None,
        "under N replicas a loss with a Keras mask (padded sequences behind "
        "Embedding(mask_zero=True), ignore_class) averages over each replica's own valid "
        "entries, not the batch's: the update and the logged loss differ from one device's.",
        "compat fix 'masked-loss-means' divides each replica's sum by the global valid count.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras-overridden-loss-call", "keras", "3.0", None,
        "under N replicas a keras.losses.Loss subclass that overrides __call__ and returns "
        "one value for the batch (keras.io's supervised contrastive learning) is never "
        "divided by N: the logged loss is N times the replicas' mean and every step moves "
        "the weights N times as far; one that returns per-example values trains right but "
        "logs N times the loss.",
        "compat fix 'overridden-loss-call' runs such a loss on the gathered global batch "
        "(a batch-wide loss then scores plain Python's pairs) and scales its value like a "
        "per-example loss's mean (per-example values: only the logged value).",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras-batch-wide-metrics", "keras", "3.0", None,
        "under N replicas every replica updates a compiled metric with its own slice of the "
        "batch and Keras sums the replicas' variables: one device's value only for a sum of "
        "per-example terms. A metric that pairs the examples of its batch (keras.io's "
        "CategoricalTruePositives compares (batch,) labels with (batch, 1) predictions) or a "
        "metric function returning one value for its batch logs another number than plain "
        "Python (2 replicas: 4433 true positives vs 8248).",
        "compat fix 'batch-wide-metrics' updates such a metric (its class or function not "
        "Keras's) once per step on the gathered global batch.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras-batch-sum-losses", "keras", "3.0", None,
        "under N replicas Keras divides every add_loss value by N: right for a mean over the "
        "batch or a weight regularizer, but a value that sums over the batch (keras.io's "
        "ActivityRegularizationLayer adds ops.sum(inputs) * 0.1), or has one value per "
        "example, which Keras sums (keras.io's OCR CTCLayer), then weighs 1/N of plain "
        "Python's term in the gradients and the logged loss (2 replicas: 6.25 vs 10.19).",
        "compat fix 'batch-sum-losses' reads how the value scales with the batch from its "
        "graph and gives each replica its own sum; a value no weighting makes exact (a max "
        "over the batch) is named in one line.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras-paired-step-losses", "keras", "3.0", None,
        "under N replicas a loss that pairs the examples of its batch (a contrastive loss "
        "scoring a (batch, batch) similarity matrix in a custom train_step, keras.io's "
        "SimCLR) is computed by each replica over its own slice only: the loss and the "
        "weight updates differ from one device's, with no error.",
        "compat check 'paired-step-losses' names such a loss (a 2-D product of two per-row "
        "tensors in what a gradient tape differentiates) once, with the fix: gather the "
        "rows with all_gather before pairing them.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "tf-none-aggregation-copies", "tensorflow", "2.0", None,
        "under N replicas a variable created with aggregation 'none' (keras.Variable's "
        "default) and assigned in the step is written on each replica's copy alone: a value "
        "from the replica's rows (keras.io's NNCLR queue) leaves the copies different.",
        "compat check 'replica-variable-copies' names such an assignment once, with the fix.",
        TESTED_TENSORFLOW_LATEST,
    ),
    KnownIssue(
        "keras-symbolic-build-names", "keras", "3.0", None,
        "under any tf.distribute strategy the symbolic build before the first fit creates "
        "throwaway symbolic tensors that advance Keras's keras_tensor_N name counter: later "
        "tensor names (TFLite signature inputs, a lazily built Sequential's input) differ "
        "from plain Python's.",
        "compat fix 'symbolic-build-names' counts only the tensors plain Python creates too.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras-no-gradient-loss-scaling", "keras", "3.0", None,
        "under N replicas a keras.losses.Loss called where no gradient is taken (a custom "
        "test_step, a metric computed by hand) is divided by N like a training loss: it "
        "reports 1/N of the one-device value.",
        "compat fix 'no-gradient-losses' divides (and multiplies back) only while a gradient "
        "tape records; evaluate's numbers do not change.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras-logged-step-loss", "keras", "3.0", None,
        "under N replicas a custom train_step that logs the loss it computed "
        "(self.loss_tracker.update_state(loss)) reports 1/N of the one-device loss: the loss "
        "is each replica's share of the global loss.",
        "compat fix 'logged-step-losses' logs such a share N times in a keras.metrics.Mean; "
        "the gradient is untouched.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras-hand-mean-gradients", "keras", "3.0", None,
        "under N replicas a loss a custom train_step averages by hand (ops.mean, keras.io's "
        "VAE) is not divided by N: the summed gradient is N times one device's.",
        "compat fix 'hand-mean-gradients' weighs such a mean's gradient by 1/N.", TESTED_KERAS,
    ),
    KnownIssue(
        "keras-symbolic-build-order", "keras", "3.0", None,
        "under any tf.distribute strategy fit peeks at one batch before training, drawing the "
        "input's randomness once more: a reshuffled tf.data pipeline or a shuffling PyDataset "
        "trains in another order than without a strategy, and Python's random state moves.",
        "compat fix 'symbolic-build-order' builds from the element_spec (no peek) or restores "
        "the random states after it; a script's own strategy keeps the peek, as in plain Python.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras-step-metrics", "keras", "3.0", None,
        "under N replicas the logs of each batch (progress bar, on_train_batch_end) average "
        "the replicas' own metric results: weighted metrics, and every metric including the "
        "loss when the replicas' slices differ in size, differ from one device's.",
        "compat fix 'step-metrics' reads the step's results once across the replicas.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras-uneven-batch-losses", "keras", "3.0", None,
        "under N replicas a batch that does not split evenly (5 rows on 2 replicas) weighs "
        "each replica's mean 1/N: the smaller slice's rows count more than on one device.",
        "compat fix 'uneven-batch-losses' weighs each replica's loss share by its rows.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras-sparse-gradient-sums", "keras", "3.0", None,
        "under N replicas a lookup's IndexedSlices gradient arrives once per replica and "
        "Adam-like optimizers square each part apart: an embedding's update differs.",
        "compat fix 'sparse-gradient-sums' sums equal-index slices row by row.", TESTED_KERAS,
    ),
    KnownIssue(
        "keras-replica-random", "keras", "3.0", None,
        "under N replicas every replica draws the same Dropout masks, noise, augmentation "
        "and keras.random numbers (one SeedGenerator state): less random than one device.",
        "compat fix 'replica-random' gives each replica its own rows of the global draw.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras-global-seed-threads", "keras", "3.0", None,
        "a seedless keras.random draw in a step under any tf.distribute strategy fails: each "
        "replica thread makes its own global SeedGenerator, a variable on the second trace.",
        "compat fix 'replica-global-seed' shares the starting thread's generator.",
        TESTED_KERAS,
    ),
    KnownIssue(
        "keras#20582", "keras", "3.0", None,
        "optimizer gradient_accumulation_steps fails under any tf.distribute strategy "
        "('`merge_call` called while defining a new graph': a sync inside a cond).",
        "compat fix 'gradient-accumulation' sums the replicas' gradients every micro-batch "
        "and chooses step-or-accumulate per device, where a cond is allowed.",
        TESTED_KERAS,
    ),
)


def affecting(versions: dict[str, str | None] | None = None) -> list[KnownIssue]:
    """Known issues that affect ``versions`` (default: what is installed).

    Example:
        >>> affecting({"keras": "2.15.0"})
        []
    """
    if versions is None:
        versions = {i.package: installed_version(i.package) for i in KNOWN_ISSUES}
    return [i for i in KNOWN_ISSUES if i.affects(versions.get(i.package))]
