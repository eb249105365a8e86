"""Run an unmodified Keras script under a distribution strategy.

``mirrorkit run script.py ARGS`` behaves like ``python script.py ARGS``, with
one difference: before the script's first line, the strategy chosen by
:func:`mirrorkit.get_strategy` is created and its ``scope()`` entered for the
script's whole lifetime. Keras 3 models record the strategy in effect when
they are constructed, so every model the script builds, compiles and fits is
mirrored across the replicas -- no code change. ``tf.distribute.get_strategy()``
in the script returns that strategy. With ``--strategy default`` nothing below
applies except the ``fit`` safeguards: the script runs as under ``python``.

Strategies the script creates itself (for the script's lifetime only):

- ``tf.distribute.MirroredStrategy()``, ``tf.distribute.MultiWorkerMirroredStrategy()``
  and ``tf.distribute.experimental.MultiWorkerMirroredStrategy()`` return
  mirrorkit's strategy, so ``--simulate-cpus``, ``mirrorkit launch``'s
  ``TF_CONFIG``, the Keras multi-worker fixes and the lost-peer timeouts all
  apply to tutorial-style scripts. The same holds when the only arguments are
  ``cross_device_ops`` / ``communication_options`` / ``communication`` (not
  used: mirrorkit's strategy is already configured), ``devices`` naming exactly
  mirrorkit's devices, or a ``TFConfigClusterResolver``. One log line says so.
  ``isinstance(strategy, tf.distribute.MirroredStrategy)`` keeps working.
  Whichever of the two classes the script names, it gets the strategy of this
  run: under ``mirrorkit launch`` a ``MirroredStrategy()`` script trains across
  the workers, and a ``MultiWorkerMirroredStrategy()`` script run without a
  cluster trains on the local replicas.
- A strategy pinned to other devices -- ``MirroredStrategy(devices=[...])``,
  ``OneDeviceStrategy(...)``, a subclass -- is created as written and
  mirrorkit's scope is left (one log line), so the script then runs exactly as
  under ``python``: TensorFlow refuses to enter a second strategy's scope
  inside another's. Models built before that keep mirrorkit's strategy.
- ``MultiWorkerMirroredStrategy(cluster_resolver=...)`` with another resolver
  raises ``RuntimeError`` in a process that already joined a cluster
  (TensorFlow allows one per process); elsewhere it is created as written.

Batch semantics:

- by default the ``batch_size`` the script passes to ``fit``/``evaluate``/
  ``predict`` is the *global* batch, split across the replicas (the training
  math of the script is unchanged; each replica gets ``batch_size / N``).
- with ``scale_batch=True`` (``--scale-batch``, ``MIRRORKIT_SCALE_BATCH=1``) it
  is the *per-replica* batch: mirrorkit multiplies it by the replica count of
  the model's strategy (Keras's default of 32 included), so each replica
  computes on the batch the script was written for and an epoch takes N times
  fewer steps. This does not apply to inputs the script batched itself
  (``tf.data.Dataset``, generators, ``PyDataset``): their batch stays the
  global batch (logged once).

Empty replica batches: with N replicas, a last training batch of fewer than N
examples leaves a replica with an empty batch, on which ``BatchNormalization``
fails after a convolution ("Incompatible shapes: [0,6,6,4] vs. [0,8,8,1]") and
silently turns the weights into NaN after a ``Dense`` layer. For arrays and
tensors (what Keras can slice), ``fit`` leaves those few trailing training
examples (fewer than N) out of training, with one warning. Any
``validation_split`` is taken first, from the end of the data exactly as Keras
does, and passed as ``validation_data``, so validation keeps every example;
sample weights are trimmed alike. A ``tf.data.Dataset`` is never rewritten:
batch it with ``drop_remainder=True`` (or build it with
:func:`mirrorkit.train_pipeline`). When one fails this way, the error
carries a note saying so; when its loss turns NaN, one warning says so.

``predict``/``evaluate`` need no trimming: with :mod:`mirrorkit.compat`'s
``empty-conv`` fix an empty replica batch contributes nothing, so their
results are exactly one device's for every input type (see
:mod:`mirrorkit.compat.empty_conv`).

Saving in multi-worker mode (``mirrorkit launch -- mirrorkit run``): the stock
``keras.callbacks.BackupAndRestore``/``ModelCheckpoint``/``TensorBoard``,
``Model.save``/``save_weights`` and ``tf.train.Checkpoint``/``CheckpointManager``
saves write from the chief only, the others to private temporary directories
(:mod:`mirrorkit.runner.chief_saving`); ``keras.utils.get_file`` downloads
one worker at a time per destination (:mod:`mirrorkit.runner.downloads`);
``os.mkdir``/``os.makedirs`` of a directory another worker made during the job
returns as if this worker made it (:mod:`mirrorkit.runner.job_dirs`).

Uneven batches otherwise train fine once :mod:`mirrorkit.compat` is applied,
which every run does (``MIRRORKIT_COMPAT=off`` opts out): without it Keras 3
fails whenever the first batch of ``fit``/``evaluate`` does not split evenly
over the replicas (keras#20585), e.g. under ``--strategy default`` with the
script's own ``MirroredStrategy``.

Limits: the scope is entered in the main thread only; strategies created
through TensorFlow's private modules (``tensorflow.python.distribute``) are
not intercepted.

Example:
    >>> from mirrorkit.runner import RunConfig, run_script
    >>> run_script(RunConfig(script="train.py", args=("--epochs", "1"),
    ...                      simulate_cpus=2))          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Callable, Iterator

from mirrorkit import _env
from mirrorkit.distribute import peer_loss
from mirrorkit.distribute.runtime import Runtime
from mirrorkit.runner import chief_saving, downloads, job_dirs
from mirrorkit.runner.config import RunConfig, ScriptFailed, check_script
from mirrorkit.runner.exports import chief_only_saved_models, restored_calls
from mirrorkit.runner.model_methods import model_methods
from mirrorkit.runner.one_replica_steps import one_replica_steps
from mirrorkit.runner.scope import ScriptScope
from mirrorkit.runner.strategies import script_strategies
from mirrorkit.runner.sync_bn import synchronized_batch_norm

logger = logging.getLogger(__name__)


def run_script(config: RunConfig,
               on_start: Callable[[Runtime, bool], None] | None = None) -> None:
    """Run ``config.script`` as ``__main__`` under the selected strategy.

    Like ``python SCRIPT ARGS``: ``sys.argv`` is ``[SCRIPT, *ARGS]``, the
    script's directory comes first on ``sys.path``, and ``__name__`` is
    ``"__main__"``. The strategy scope, the ``tf.distribute`` strategy classes,
    ``Model.fit``/``evaluate``/``predict``, ``sys.argv``, ``sys.path`` and
    ``MIRRORKIT_*`` variables are restored afterwards. The strategy choice is
    exported as ``MIRRORKIT_STRATEGY``/``MIRRORKIT_SIMULATE_CPUS`` for the
    script's lifetime, so a script that calls :func:`mirrorkit.scope` or
    :func:`mirrorkit.get_strategy` gets the same strategy. See the module
    docstring for the strategies the script creates and the ``fit`` safeguards.

    Args:
        config: the script, its arguments and the strategy settings.
        on_start: called as ``on_start(runtime, scale_batch)`` after the
            strategy exists and before the script's first line (the CLI prints
            its one-line summary there).

    Raises:
        FileNotFoundError, ValueError: for a missing or non-``.py`` script or a
            bad strategy setting (before anything runs).
        RuntimeError: when the strategy cannot be created.
        SystemExit: whatever the script raised (``sys.exit(3)``), unchanged.
        ScriptFailed: the script raised an uncaught exception; its traceback
            text, trimmed to the script's frames, is attached.

    Example:
        >>> run_script(RunConfig("train.py", simulate_cpus=2),
        ...            on_start=lambda rt, scaled: print(rt.summary()))  # doctest: +SKIP
        strategy=mirrored replicas=2 (MIRRORKIT_SIMULATE_CPUS=2 on a CPU-only machine)
    """
    path = check_script(config.script)
    scale = _env.scale_batch() if config.scale_batch is None else bool(config.scale_batch)
    # Explicit settings go through the environment, so the script's own
    # mirrorkit calls (if any) resolve to the very same strategy.
    exported = {_env.SCALE_BATCH: "1" if scale else "0"}
    if config.strategy is not None:
        exported[_env.STRATEGY] = config.strategy
    if config.simulate_cpus is not None:
        exported[_env.SIMULATE_CPUS] = str(config.simulate_cpus)
    with _env.patch(exported):
        from mirrorkit.distribute.strategy import describe, get_strategy

        strategy = get_strategy()
        runtime = describe(strategy)
        # Keras 3 fixes, a no-op for single-replica models: get_strategy applies
        # them to multi-replica strategies it creates; applying them here too
        # covers the script's own strategy under --strategy default.
        from mirrorkit import compat

        compat.apply(strategy=strategy)
        if on_start is not None:
            on_start(runtime, scale)
        if config.syncs_batch_norm() and runtime.replicas > 1:
            logger.info("BatchNormalization layers the script builds synchronise their "
                        "statistics across the %d replicas (--sync-batch-norm)",
                        runtime.replicas)
        with ScriptScope(strategy, runtime) as scope, _script_sys(path, config.args), \
                script_strategies(scope), \
                restored_calls(scope), chief_only_saved_models(runtime), \
                model_methods(scale, config.speed_up_fit, config.compares_one_device()), \
                synchronized_batch_norm(config.syncs_batch_norm()), \
                one_replica_steps(runtime.replicas), \
                chief_saving.installed(runtime), \
                downloads.installed(runtime), job_dirs.installed(runtime):
            _run_path(path)


def _run_path(path: Path) -> None:
    try:
        runpy.run_path(os.fspath(path), run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as err:  # noqa: BLE001 -- report any script failure like Python
        # A lost multi-worker peer is not the script's bug: one line says who
        # and what, instead of TensorFlow's gRPC traceback.
        lost = peer_loss.explain(err) if isinstance(err, Exception) else None
        if lost is not None:
            raise ScriptFailed(peer_loss.short_report(err, lost)) from None
        raise ScriptFailed(_script_traceback(err, path)) from None


def _script_traceback(err: BaseException, path: Path) -> str:
    # Drop mirrorkit's and runpy's frames so the user sees what `python
    # script.py` would show, starting at the script's own top frame; and the
    # runner's own frames at the end, when the runner refused something the
    # script asked (the script's line is then the last one shown).
    tb = err.__traceback__
    target = os.path.abspath(path)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    if tb is None:
        tb = err.__traceback__
    report = traceback.TracebackException(type(err), err, tb)
    here = os.path.dirname(os.path.abspath(__file__))
    while len(report.stack) > 1 and os.path.dirname(
            os.path.abspath(report.stack[-1].filename)) == here:
        report.stack.pop()
    return "".join(report.format())


@contextlib.contextmanager
def _script_sys(path: Path, args: tuple[str, ...]) -> Iterator[None]:
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [os.fspath(path), *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
