"""``mirrorkit run``'s and ``mirrorkit launch``'s adaptations: patches that are not upstream fixes.

Each makes an unmodified script behave under ``mirrorkit run`` (or as one of
several launched workers) as it does in plain Python: the script's own
strategies and model methods, one writer for files and checkpoints, the
one-device check. :mod:`mirrorkit.patching.catalogue` lists them with the
fixes; a ``MIRRORKIT_COMPAT=off`` leaves them on (each is turned off by name).

Example:
    >>> "chief-only-model-save" in [p.name for p in ADAPTATIONS]
    True
"""

from __future__ import annotations

from mirrorkit.patching.record import TESTED, TESTED_LATEST, Patch


def _adaptation(name: str, targets: tuple[str, ...], changes: str, reason: str,
                control: str, scope: str, tested: str = TESTED) -> Patch:
    return Patch(name, targets, changes, reason, scope=scope, kind="adaptation",
                 tested=tested, control=control)


ADAPTATIONS = (
    _adaptation("lost-peer-report",
                ("sys.excepthook", "keras.src.callbacks.callback_list.CallbackList."
                 "on_train_begin/on_train_batch_end/on_test_batch_end/on_predict_batch_end/"
                 "on_epoch_end"),
                "a worker that dies of a lost peer ends with one line naming the peer and the "
                "time since its last step, instead of a TensorFlow traceback",
                "TensorFlow reports a lost peer as a long gRPC traceback that names no worker.",
                "tests/distribute/test_peer_loss_patch.py", scope="multi-worker process"),
    _adaptation("fixes-on-import", ("sys.meta_path",),
                "applies the fixes when the program imports TensorFlow and Keras",
                "a launched program that never imports mirrorkit still needs its fixes "
                "(keras#20585 breaks the stock multi-worker tutorial).",
                "tests/launcher/test_autofix_patch.py", scope="worker"),
    _adaptation("deferred-optional-imports",
                ("sys.meta_path", "keras.src.trainers.data_adapters.array_slicing.pandas/"
                 "ARRAY_TYPES", "keras.src.visualization.plot_image_gallery.plt",
                 "keras.src.visualization.plot_bounding_box_gallery.patches"),
                "Keras no longer imports pandas and matplotlib when it is imported: its "
                "array adapter gets pandas when the program imports it, its galleries import "
                "matplotlib when they draw",
                "Keras imports both whenever they are installed, used or not: about a fifth "
                "of the CPU time of `import tensorflow, keras` at every worker start and "
                "restart (benchmarks/startup.py).",
                "tests/launcher/test_startup.py", scope="start-up",
                tested=TESTED_LATEST),
    _adaptation("import-gc-freeze", ("gc (paused while tensorflow and keras import, then "
                                     "gc.freeze)",),
                "Python's cyclic garbage collector pauses while TensorFlow and Keras import, "
                "and the objects they made are frozen out of its way",
                "import tensorflow makes ~300,000 lasting objects; the collector walks them "
                "many times during the import and at every full collection after it, freeing "
                "nothing: about a sixth of a small job's CPU (benchmarks/startup.py).",
                "tests/launcher/test_startup.py", scope="start-up", tested=TESTED_LATEST),
    _adaptation("script-strategies",
                ("tf.distribute.MirroredStrategy", "tf.distribute.MultiWorkerMirroredStrategy",
                 "tf.distribute.experimental.MultiWorkerMirroredStrategy",
                 "tf.distribute.OneDeviceStrategy"),
                "a strategy the script creates without devices or a cluster of its own is "
                "mirrorkit's strategy; a pinned one is created as written",
                "a tutorial that creates MirroredStrategy() itself would otherwise ignore "
                "--simulate-cpus, launch's TF_CONFIG and mirrorkit's scope.",
                "tests/runner/test_patch_controls.py", scope="script"),
    _adaptation("script-model-methods", ("keras.Model.fit", "keras.Model.evaluate",
                                         "keras.Model.predict"),
                "--scale-batch multiplies batch_size by the replicas; fit leaves out the "
                "trailing examples that would give a replica an empty batch",
                "an unmodified script's batch_size is one device's, and an empty replica "
                "batch breaks BatchNormalization.", "tests/runner/test_patch_controls.py",
                scope="script"),
    _adaptation("one-device-check",
                ("Model.train_function (the checked model, during the check)",
                 "Dropout/GaussianNoise rate/stddev (the checked model and its copy, during "
                 "the check)"),
                "with --compare-one-device, the check's step is traced with dropout off and "
                "dropped afterwards, so fit traces its own",
                "replicas draw dropout masks per slice, and fit must train as without the flag.",
                "tests/runner/test_one_device_check.py", scope="script"),
    _adaptation("sync-batch-norm",
                ("keras.src.layers.normalization.batch_normalization.BatchNormalization"
                 ".__init__",),
                "with --sync-batch-norm, a BatchNormalization the script constructs without "
                "an explicit synchronized argument gets synchronized=True",
                "opt-in: under N replicas each replica normalises with its own slice's "
                "statistics, so a model with BatchNormalization trains unlike one device.",
                "tests/runner/test_sync_batch_norm.py", scope="script",
                tested=TESTED_LATEST),
    _adaptation("one-replica-step-notice",
                ("keras.src.optimizers.base_optimizer.BaseOptimizer.apply",),
                "the first optimizer update made outside fit and strategy.run with 2+ "
                "replicas logs one line saying that step runs on one replica; training is "
                "unchanged",
                "a custom loop that calls its step directly (the TensorFlow DCGAN tutorial) "
                "trains on one device of N under mirrorkit's scope, and nothing said so.",
                "tests/runner/test_one_replica_steps.py", scope="script",
                tested=TESTED_LATEST),
    _adaptation("speed-up-fit", ("keras.Model.compile", "Model.steps_per_execution (per model)"),
                "with --speed-up-fit, fit runs several steps per tf.function call when the "
                "script left steps_per_execution alone",
                "opt-in speed: Keras's default runs one step per call.",
                "tests/runner/test_patch_controls.py", scope="script"),
    _adaptation("loaded-function-calls",
                ("tensorflow.python.saved_model.load._WrapperFunction._call_flat",),
                "a function of a SavedModel loaded in the script, called at the script's top "
                "level, reads this process's first copy of each mirrored variable",
                "tf.saved_model.load in a strategy scope restores mirrored variables whose "
                "functions TensorFlow refuses to run in the cross-replica context, which is "
                "the script's top level under mirrorkit's scope (InvalidArgumentError).",
                "tests/runner/test_exports.py", scope="script"),
    _adaptation("chief-only-callbacks",
                ("keras.callbacks.BackupAndRestore", "keras.callbacks.ModelCheckpoint",
                 "keras.callbacks.TensorBoard"),
                "the stock callbacks are mirrorkit's chief-aware subclasses: the chief writes "
                "the real path, other workers a private one",
                "two workers writing one HDF5 file fail on its lock (BlockingIOError).",
                "tests/runner/test_patch_controls.py", scope="multi-worker script"),
    _adaptation("chief-only-model-save", ("keras.Model.save", "keras.Model.save_weights"),
                "every worker saves, only the chief to the real path",
                "two writers of one .keras zip corrupt it (BadZipFile).",
                "tests/runner/test_patch_controls.py", scope="multi-worker script"),
    _adaptation("chief-only-tf-checkpoint",
                ("tf.train.Checkpoint.save", "tf.train.Checkpoint.write",
                 "tf.train.CheckpointManager.save"),
                "every worker checkpoints, only the chief into the real directory (a "
                "manager's private _directory is pointed elsewhere during the save)",
                "the multi-worker tutorial's chief-only pattern, without the script writing "
                "it.", "tests/runner/test_patch_controls.py", scope="multi-worker script"),
    _adaptation("chief-only-saved-model",
                ("tf.saved_model.save", "tensorflow.lite.python.lite."
                 "TFLiteKerasModelConverterV2._convert_keras_to_saved_model"),
                "every worker saves (model.export, ExportArchive.write_out too), only the "
                "chief to the real directory, then all wait for the chief; the folder a "
                "TFLite conversion makes for itself is kept",
                "N workers writing one SavedModel directory replace each other's files while "
                "another worker may already be loading it.",
                "tests/runner/test_exports.py", scope="multi-worker script"),
    _adaptation("get-file-lock", ("keras.utils.get_file (every module that binds it)",),
                "workers on one machine download and unpack one destination one at a time",
                "N workers unpacking into ~/.keras/datasets at once read half-written files.",
                "tests/runner/test_patch_controls.py", scope="multi-worker script"),
    _adaptation("job-mkdir", ("os.mkdir (so os.makedirs and pathlib.Path.mkdir)",),
                "mkdir of a directory made during this launched job (another worker's) "
                "returns as if it made it",
                "every launched worker runs the script's mkdir/makedirs in one directory: "
                "the second raises FileExistsError.",
                "tests/runner/test_launch_files.py", scope="multi-worker script"),
    _adaptation("backup-paths",
                ("BackupAndRestore.backup_dir/_weights_path/_training_metadata_path/"
                 "_prev_weights_path/_prev_training_metadata_path (mirrorkit's subclass)",),
                "a non-chief worker's backup goes to a private folder",
                "Keras's BackupAndRestore has no chief logic: two workers write one backup.",
                "tests/training/test_backup_paths.py", scope="object"),
    _adaptation("checkpoint-barrier",
                ("ModelCheckpoint._after_save (mirrorkit's subclass)",),
                "after each ModelCheckpoint save point every worker waits for the others "
                "(one all-reduce, whether or not save_best_only wrote); mirrorkit run's "
                "Model.save leaves its own wait to it",
                "a worker that lists or loads the checkpoint folder right after fit (keras.io's "
                "distributed guide calls run_training twice) found the chief's newest file "
                "missing or half-written.", "tests/runner/test_launch_files.py", scope="object"),
)
