"""The upstream fixes of Keras's training loop and TensorFlow's distribution, one record each.

Each record is the whole truth about one fix (:class:`~mirrorkit.patching.record.Patch`
with its :class:`~mirrorkit.patching.record.Bug` and its
:class:`~mirrorkit.patching.record.Target` spots): what it patches, found by
role; what that changes; the upstream bug, its report or reproduction, the
versions it was tested on; the probe that shows the bug; the test that shows
what breaks with the fix off. :mod:`mirrorkit.compat.registry` builds its
mechanics from these records, :mod:`mirrorkit.compat.known_issues` its list,
``mirrorkit info`` its lines: nothing about a fix is written twice. The loss
and gradient family is :mod:`mirrorkit.patching.loss_fixes`.

``after`` names the fixes whose wrappers of the same function this one goes
on top of; the registry orders by it, not by where a record sits.

Example:
    >>> [p.name for p in FIX_RECORDS][:2]
    ['symbolic-build', 'scalar-logs']
"""

from __future__ import annotations

from mirrorkit.patching.record import (
    TESTED_KERAS,
    TESTED_LATEST,
    TESTED_TENSORFLOW,
    TESTED_TENSORFLOW_LATEST,
    Bug,
    Patch,
)
from mirrorkit.patching.record import Target as T
from mirrorkit.patching.record import (
    fix_record as _fix,
)

FIX_RECORDS: tuple[Patch, ...] = (
    _fix("symbolic-build",
         targets=(T("backend-trainer", "_maybe_symbolic_build", "symbolic_build:make"),),
         changes="builds the model from this worker's first replica batch instead of a reduced "
                 "one",
         reason="model.fit/evaluate reduce a PerReplica data batch to build the model: under "
                "MultiWorkerMirroredStrategy it fails ('Attempt to convert a value "
                "(PerReplica'), under MirroredStrategy whenever the global batch does not "
                "divide by the replicas ('Inputs to operation AddN ... must have the same size "
                "and shape').",
         bug=Bug("keras", "3.0", None, TESTED_KERAS, "Attempt to convert a value (PerReplica",
                 upstream=("keras-team/keras#20585",)),
         probe="probes:uneven_global_batch",
         control="tests/compat/test_compat.py"),
    _fix("scalar-logs",
         targets=(T("backend-trainer-module", "reduce_per_replica", "scalar_logs:make"),),
         changes="reduces rank-0 logs with axis=None (one collective per dtype)",
         reason="under MultiWorkerMirroredStrategy Keras reduces scalar step logs on axis 0 "
                "('Invalid reduction dimension 0 for input with 0 dimensions').",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "Invalid reduction dimension 0 for input with 0 dimensions",
                 upstream=("tensorflow/tensorflow#72388", "keras-team/keras#20585")),
         probe="probes_workers:scalar_logs_reduced_on_axis_0",
         control="tests/compat/test_compat.py"),
    _fix("multi-step",
         targets=(T("backend-trainer", "_make_function", "multistep:make"),),
         changes="runs several steps per call in a while loop whose condition checks for the "
                 "next batch (one replica keeps Keras's code); on Keras 3.16, whose one step "
                 "per call fetches its batch outside the traced function, fetches it inside, "
                 "as 3.15 does",
         reason="steps_per_execution > 1 in fit fails under MirroredStrategy with 2+ replicas.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS, "You must feed a value for placeholder tensor",
                 upstream=("keras-team/keras#19246",),
                 repro="upstream_repros/multi_step.py"),
         probe="probes:several_steps_per_call",
         control="tests/compat/test_multistep.py"),
    _fix("empty-conv",
         targets=(T("backend-nn", "conv", "empty_conv:guard_op"),
                  T("backend-nn", "depthwise_conv", "empty_conv:guard_op"),
                  T("backend-nn", "separable_conv", "empty_conv:guard_op"),
                  T("backend-nn", "conv_transpose", "empty_conv:guard_op"),
                  T("backend-trainer", "make_predict_function",
                    "empty_conv:guard_predict_function"),
                  T("backend-trainer", "make_test_function", "empty_conv:guard_test_function")),
         changes="an empty batch through a convolution runs on one zero row and returns zero "
                 "rows",
         reason="TensorFlow's oneDNN CPU convolutions return their input unchanged for an empty "
                "batch, so predict/evaluate on inputs that leave a replica empty (1 image on 2 "
                "replicas) fail at the next BatchNormalization ('Incompatible shapes').",
         bug=Bug("tensorflow", "2.0", None, TESTED_TENSORFLOW, "Incompatible shapes",
                 repro="upstream_repros/empty_conv.py"),
         probe="probes_training:empty_batch_convolution",
         control="tests/compat/test_empty_conv.py"),
    _fix("predict-on-batch",
         targets=(T("backend-trainer", "predict_on_batch", "on_batch:make_predict"),),
         changes="predict_on_batch splits its batch across the replicas like predict does",
         reason="predict_on_batch/test_on_batch/train_on_batch give the whole batch to every "
                "replica under a strategy with 2+ replicas: predict_on_batch returns N times "
                "the rows (64 for 32 images on 2 replicas), summing metrics count N times.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS, "predict_on_batch returned N times the rows",
                 repro="upstream_repros/on_batch.py"),
         probe="probes_training2:predict_on_batch_rows",
         control="tests/compat/test_on_batch.py"),
    _fix("test-on-batch",
         targets=(T("backend-trainer", "test_on_batch", "on_batch:make_test"),),
         changes="test_on_batch splits its batch across the replicas like test does",
         reason="predict_on_batch/test_on_batch/train_on_batch give the whole batch to every "
                "replica under a strategy with 2+ replicas: predict_on_batch returns N times "
                "the rows (64 for 32 images on 2 replicas), summing metrics count N times.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "test_on_batch counted every example N times",
                 repro="upstream_repros/on_batch.py"),
         probe="probes_training2:test_on_batch_counts",
         control="tests/compat/test_on_batch.py"),
    _fix("train-on-batch",
         targets=(T("backend-trainer", "train_on_batch", "on_batch:make_train"),),
         changes="train_on_batch splits its batch across the replicas like train does",
         reason="predict_on_batch/test_on_batch/train_on_batch give the whole batch to every "
                "replica under a strategy with 2+ replicas: predict_on_batch returns N times "
                "the rows (64 for 32 images on 2 replicas), summing metrics count N times.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "train_on_batch counted every example N times",
                 repro="upstream_repros/on_batch.py"),
         probe="probes_training2:train_on_batch_counts",
         control="tests/compat/test_on_batch.py"),
    _fix("step-variables",
         targets=(T("backend-variable", "_initialize_with_initializer",
                    "step_variables:make"),),
         changes="a variable first created inside a traced step is initialised outside the "
                 "step's cond",
         reason="custom training loops under MirroredStrategy with 2+ replicas fail at the "
                "first step when optimizer or layer variables are created inside the traced "
                "strategy.run ('You must feed a value for placeholder tensor ...cond...').",
         bug=Bug("keras", "3.0", None, TESTED_KERAS, "You must feed a value for placeholder tensor",
                 upstream=("keras-team/keras#23085", "keras-team/keras#19308"),
                 repro="upstream_repros/step_variables_layer_weights.py"),
         probe="probes_training2:variables_made_in_a_step",
         control="tests/compat/test_training_loops.py"),
    _fix("no-call-build",
         targets=(T("base-trainer", "_symbolic_build", "no_call_build:make"),),
         changes="skips the symbolic build of a model without call(), and of a model with its "
                 "own step when Keras's build fails",
         reason="fit under any tf.distribute strategy builds a model by calling it on x of (x, "
                "y): fails without call() (keras.io GAN) or with batches a custom step unpacks "
                "(Siamese).",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "does not have a `call()` method implemented",
                 repro="upstream_repros/no_call_build.py"),
         probe="probes_training:model_without_call",
         control="tests/compat/test_training_loops.py"),
    _fix("generator-copies",
         targets=(T("tensorflow.python.ops.script_ops.FuncRegistry", "__call__",
                    "generator_copies:make"),),
         changes="copies each array a generator or numpy_function returns before TensorFlow "
                 "wraps it",
         reason="Dataset.from_generator (behind keras.utils.PyDataset and generator inputs) and "
                "numpy_function wrap the 64-byte aligned NumPy arrays returned without a copy; "
                "under 2+ local replicas or workers the training step writes into them (the "
                "user's data overwritten, so the loss and the weights differ from one device's, "
                "on runs whose arrays happen to be aligned: every run for large arrays).",
         bug=Bug("tensorflow", "2.0", None, TESTED_TENSORFLOW,
                 "shares memory with the generator's array",
                 repro="upstream_repros/generator_copies.py"),
         probe="probes_training:generator_arrays_shared",
         control="tests/compat/test_generator_copies.py"),
    _fix("gradient-accumulation",
         targets=(T("backend-optimizer", "_backend_apply_gradients", "accumulation:make"),),
         changes="accumulates gradients per replica and synchronises outside the cond",
         reason="optimizer gradient_accumulation_steps fails under any tf.distribute strategy "
                "('`merge_call` called while defining a new graph': a sync inside a cond).",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "`merge_call` called while defining a new graph",
                 upstream=("keras-team/keras#20582",)),
         probe="probes_training2:accumulated_gradients",
         control="tests/compat/test_accumulation.py"),
    _fix("symbolic-build-names",
         targets=(T("base-trainer", "_symbolic_build", "symbolic_names:make"),),
         changes="the throwaway symbolic tensors of the build before the first step leave "
                 "Keras's tensor-name counter as plain Python leaves it",
         reason="under any tf.distribute strategy the symbolic build before the first fit "
                "creates throwaway symbolic tensors that advance Keras's keras_tensor_N name "
                "counter: later tensor names (TFLite signature inputs, a lazily built "
                "Sequential's input) differ from plain Python's.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS, "Invalid Input name (keras_tensor_",
                 repro="upstream_repros/symbolic_build_names.py"),
         probe="probes_training:build_advances_names",
         control="tests/compat/test_symbolic_names.py"),
    _fix("symbolic-build-order",
         targets=(T("backend-trainer", "_maybe_symbolic_build", "symbolic_order:make"),),
         changes="builds the model from the input's element_spec instead of a peeked batch "
                 "(else peeks and puts Python's and NumPy's random states back); a script's own "
                 "strategy keeps the peek, as under plain Python",
         reason="under any tf.distribute strategy fit peeks at one batch before training, "
                "drawing the input's randomness once more: a reshuffled tf.data pipeline or a "
                "shuffling PyDataset trains in another order than without a strategy, and "
                "Python's random state moves.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "fit trains in another data order under a strategy",
                 repro="upstream_repros/symbolic_build_order.py"),
         probe="probes_training:build_peeks_input",
         control="tests/compat/test_symbolic_names.py"),
    _fix("step-metrics",
         targets=(T("base-trainer", "get_metrics_result", "step_metrics:make"),),
         changes="inside a replica, the step's metric results are read once for all replicas (a "
                 "merge_call), so each batch's logs are the global batch's",
         reason="under N replicas the logs of each batch (progress bar, on_train_batch_end) "
                "average the replicas' own metric results: weighted metrics, and every metric "
                "including the loss when the replicas' slices differ in size, differ from one "
                "device's.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "batch-end logs average the replicas' metric results",
                 upstream=("keras-team/keras#19280",),
                 repro="upstream_repros/step_metrics.py"),
         probe="probes_training:batch_logs_average_replicas",
         control="tests/compat/test_step_losses.py"),
    _fix("replica-random",
         targets=(T("backend-random", "dropout", "replica_random:make_dropout"),
                  T("backend-random", "uniform", "replica_random:make_draw"),
                  T("backend-random", "normal", "replica_random:make_draw"),
                  T("backend-random", "truncated_normal", "replica_random:make_draw"),
                  T("backend-random", "randint", "replica_random:make_draw"),
                  T("backend-random", "categorical", "replica_random:make_categorical"),
                  T("strategy-base", "run", "step_rows:make_run"),
                  T("tensorflow.python.ops.gen_random_ops", "random_standard_normal",
                    "replica_op_draws:make"),
                  T("tensorflow.python.ops.gen_random_ops", "random_uniform",
                    "replica_op_draws:make"),
                  T("tensorflow.python.ops.gen_random_ops", "truncated_normal",
                    "replica_op_draws:make"),
                  T("tf-random-seed", "get_seed", "replica_op_draws:make_get_seed")),
         changes="a batch-shaped random draw inside strategy.run (keras.random, Keras's layers, "
                 "tf.random.normal/uniform/truncated_normal) is this replica's rows of the draw "
                 "for the global batch (across workers one all-gather of the replicas' row "
                 "counts per traced step)",
         reason="under N replicas every replica draws the same Dropout masks, noise, "
                "augmentation and keras.random numbers (one SeedGenerator state): less random "
                "than one device.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS, "every replica draws the same Dropout masks",
                 upstream=("keras-team/keras#20611",),
                 repro="upstream_repros/replica_random.py"),
         probe="probes_training:replicas_draw_alike",
         control="tests/compat/test_replica_random.py"),
    _fix("replica-global-seed",
         targets=(T("seed-generator-module", "global_seed_generator",
                    "replica_seeds:make_generator"),
                  T("tensorflow.python.distribute.mirrored_run._MirroredReplicaThread", "__init__",
                    "replica_seeds:make_thread_init")),
         changes="a replica thread's seedless keras.random draw uses the global SeedGenerator "
                 "of the thread that started the replicas (made there on first use, as on one "
                 "device)",
         reason="a seedless keras.random draw in a step under any tf.distribute strategy fails: "
                "each replica thread makes its own global SeedGenerator, a variable on the "
                "second trace.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "tf.function only supports singleton tf.Variables created on the first call",
                 repro="upstream_repros/replica_global_seed.py"),
         probe="probes_training2:seedless_draw_in_step",
         control="tests/compat/test_replica_seeds.py"),
    _fix("replica-variable-copies",
         targets=(T("tensorflow.python.distribute.values", "_on_write_update_replica",
                    "replica_copies:make"),),
         changes="in a replica's step of 2+ replicas, the script's assignment of a variable "
                 "with aggregation 'none' from the replica's rows is named once, with the ways "
                 "to make it exact; the update is unchanged",
         reason="under N replicas a variable created with aggregation 'none' (keras.Variable's "
                "default) and assigned in the step is written on each replica's copy alone: a "
                "value from the replica's rows (keras.io's NNCLR queue) leaves the copies "
                "different.",
         bug=Bug("tensorflow", "2.0", None, TESTED_TENSORFLOW_LATEST,
                 "a variable the replicas assign from their rows drifts apart",
                 repro="upstream_repros/replica_variable_copies.py", check=True),
         probe="probes_losses2:variable_copies",
         control="tests/compat/test_replica_copies.py", tested=TESTED_LATEST),
    _fix("static-batch-shapes",
         targets=(T("tensorflow.python.distribute.input_lib.DistributedDataset", "build",
                    "static_batches:make_build"),),
         changes="across workers, a dataset sharded by data whose batches are all full and "
                 "divide by the replicas keeps its static batch size (no partial-batch "
                 "handling)",
         reason="under MultiWorkerMirroredStrategy experimental_distribute_dataset turns on "
                "partial-batch handling for every finite dataset, so every batch dimension is "
                "None even where each worker gets the same full batches: ops.squeeze of a "
                "(None,) batch has unknown rank, and keras.io's supervised contrastive loss "
                "fails on every worker ('Cannot take the length of shape with unknown rank').",
         bug=Bug("tensorflow", "2.0", None, TESTED_TENSORFLOW_LATEST,
                 "Cannot take the length of shape with unknown rank",
                 repro="upstream_repros/static_batch_shapes.py"),
         probe="probes_workers:full_batches_lose_static_size",
         control="tests/compat/test_static_batches.py", tested=TESTED_LATEST),
    _fix("sparse-gradient-sums",
         targets=(T("backend-optimizer", "_all_reduce_sum_gradients", "sparse_sums:make"),),
         changes="adds up, row by row, the replicas' sparse gradient slices that carry the same "
                 "indices (a position embedding), after the all-reduce concatenated them",
         reason="under N replicas a lookup's IndexedSlices gradient arrives once per replica "
                "and Adam-like optimizers square each part apart: an embedding's update "
                "differs.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "an embedding's Adam update differs under replicas",
                 repro="upstream_repros/sparse_gradient_sums.py"),
         probe="probes_training:sparse_gradients_squared_apart",
         control="tests/compat/test_sparse_sums.py", tested=TESTED_LATEST),
    _fix("xla-cpu-replicas",
         targets=(T("base-trainer-module", "model_supports_jit", "xla_cpu:make"),),
         changes="a model whose strategy has 2+ replicas, all CPU devices, does not support "
                 "jit_compile (Keras then trains it without XLA), and one line says why",
         reason="XLA cannot compile a training step whose replicas are CPU devices: under "
                "MirroredStrategy over logical CPUs a variable of replica 1 is read from CPU:0, "
                "and across CPU workers 'Collectives are not yet implemented for CPU devices "
                "when compiling with XLA' (b/194942685), then a crash; jit_compile=True works "
                "on one CPU.",
         bug=Bug("tensorflow", "2.0", None, TESTED_TENSORFLOW_LATEST,
                 "Collectives are not yet implemented for CPU devices",
                 upstream=("keras-team/keras#19005",)),
         probe="probes_training2:jit_on_cpu_replicas",
         control="tests/compat/test_xla_cpu.py", tested=TESTED_LATEST),
    _fix("malloc-thresholds",
         targets=("glibc mallopt(M_MMAP_THRESHOLD, M_TRIM_THRESHOLD)",
                  "tensorflow.python.distribute.distribute_lib.StrategyBase."
                  "experimental_distribute_dataset",
                  "tensorflow.python.distribute.distribute_lib.StrategyBase."
                  "distribute_datasets_from_function"),
         changes="puts glibc's allocation thresholds back (decided at the first distributed "
                 "dataset, the two StrategyBase methods wrapped until then)",
         reason="TensorFlow 2.21 freezes glibc's mmap threshold, so CPU steps map and unmap "
                "large buffers every step (about 2x slower).",
         control="tests/compat/test_allocator.py"),
    _fix("saving-skipset-cache",
         targets=("keras.src.saving.saving_lib.get_attr_skipset",),
         changes="caches the attributes a save skips per type, filled on every worker at once",
         reason="get_attr_skipset reads one cache key and stores another, so every save and "
                "load builds a throw-away Optimizer; under MultiWorkerMirroredStrategy that is "
                "a collective, and a chief-only restore desynchronises the workers.",
         bug=Bug("keras", "3.0", None, TESTED_KERAS,
                 "every model.save builds a throw-away Optimizer",
                 repro="upstream_repros/saving_skipset_cache.py"),
         control="tests/training/test_backup_paths.py", scope="multi-worker process"),
)
