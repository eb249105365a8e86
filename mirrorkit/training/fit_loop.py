"""The fit step of ``mirrorkit train``: its callbacks, the event log, and rollback on divergence.

:func:`fit` creates the run directory (chief), opens the run's event log
with a ``run_start`` event (and a ``restart`` event when ``mirrorkit
launch`` restarted the group), then calls ``model.fit`` with mirrorkit's
callbacks. When the loss diverges (NaN/inf, or a spike with
``--spike-factor``) and rollbacks remain, it rolls back
(:mod:`mirrorkit.training.rollback`): every worker returns to the last good
state, the learning rate is lowered, the incident is printed and logged,
and ``fit`` continues from the restored epoch. Otherwise it stops as
before, naming the incident. A failed or interrupted run ends its event log
with a ``run_end`` event that says so.

Example:
    >>> fitted = fit(run, model, plan, train_ds, val_ds, extra=[])   # doctest: +SKIP
    >>> fitted.rollback.incidents                                    # doctest: +SKIP
    []
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import platform
from pathlib import Path
from typing import Any, Sequence

from mirrorkit import _env
from mirrorkit.errors import RunError
from mirrorkit.protocol import status_file_name
from mirrorkit.training.events import EVENTS_FILE, EventLog
from mirrorkit.training.interrupts import Interrupts
from mirrorkit.training.output import has_backup, make_output

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Fitted:
    """What :func:`fit` returns: the epochs trained and the callbacks that watched them."""

    epoch: list[int]
    meter: Any
    monitor: Any
    rollback: Any
    events: EventLog
    phases: dict[str, Any] | None = None   # fine-tuning (training.finetune), else None


def start_events(run: Any, plan: Any, change: dict[str, Any] | None = None) -> EventLog:
    """Create the run directory (chief) and open its event log with ``run_start``.

    Example:
        >>> events = start_events(run, plan)          # doctest: +SKIP
    """
    import keras
    import tensorflow as tf

    from mirrorkit._version import __version__

    chief = run.runtime.is_chief
    if chief:
        make_output(run.out)
    events = EventLog(run.out / EVENTS_FILE if chief else None)
    config = dataclasses.asdict(run.config)
    runtime = run.runtime
    events.write("run_start", config=config,
                 versions={"mirrorkit": __version__, "tensorflow": tf.__version__,
                           "keras": keras.__version__, "python": platform.python_version()},
                 strategy={"name": runtime.strategy, "replicas": runtime.replicas,
                           "workers": runtime.workers, "reason": runtime.reason},
                 plan={"per_replica_batch": plan.batch.per_replica,
                       "global_batch": plan.batch.global_batch, "accumulate": plan.accumulate,
                       "steps_per_epoch": plan.steps, "learning_rate": plan.lr,
                       "steps_per_execution": plan.steps_per_execution},
                 attempt=_env.restart_count() + 1)
    if _env.restart_count():
        events.write("restart", attempt=_env.restart_count() + 1,
                     reason=_env.restart_reason() or "restarted by mirrorkit launch")
    if change is not None:
        events.write("membership", **change)
    return events


def _callbacks(run: Any, plan: Any, events: EventLog, reset_lr: float | None,
               before_rollback: Sequence[Any] = ()) -> tuple[list[Any], Any, Any, Any]:
    import keras

    from mirrorkit.training.callbacks import BackupAndRestore, TensorBoard
    from mirrorkit.training.divergence import DivergenceGuard
    from mirrorkit.training.metering import ThroughputMeter
    from mirrorkit.training.monitoring import EpochEvents, WorkerMonitor
    from mirrorkit.training.rollback import Rollback

    config, chief, out = run.config, run.runtime.is_chief, run.out
    meter = ThroughputMeter(plan.batch.global_batch, plan.batch.replicas, report=run.tell)
    status = _env.status_dir()
    monitor = WorkerMonitor(
        run.strategy, workers=run.runtime.workers, global_batch=plan.batch.global_batch,
        per_replica_batch=plan.batch.per_replica, report=run.tell, events=events,
        status_path=Path(status) / status_file_name(run.runtime.task_index) if status else None)
    rollback = Rollback(config.max_rollbacks, config.rollback_lr_factor, reset_lr=reset_lr)
    # Order matters at epoch end: the progress bar prints first, the meter and
    # monitor then add to the logs the CSV and TensorBoard writers record.
    own: list[Any] = [DivergenceGuard(config.spike_factor)]
    if chief:
        own.append(keras.callbacks.ProgbarLogger())
    own += [meter, monitor]
    if chief:
        own.append(keras.callbacks.CSVLogger(str(out / "history.csv"), append=config.resume))
    if importlib.util.find_spec("tensorboard") is not None:
        # tf.summary's writers live in the tensorboard package, which
        # TensorFlow does not require; without it the callback fails mid-epoch.
        own.append(TensorBoard(log_dir=str(out / "logs")))
    else:
        run.tell("logs      no TensorBoard logs: the tensorboard package is not installed "
                 "(pip install tensorboard)")
    # Rollback after BackupAndRestore: it overrides what that one restores.
    # delete_checkpoint=False: the backup outlives fit until the model is
    # saved (job._write_results removes it), so a Ctrl-C during the final
    # evaluation or save still leaves something to --resume from.
    own += [BackupAndRestore(backup_dir=str(out / "backup"), delete_checkpoint=False),
            EpochEvents(events), *before_rollback, rollback]
    return own, meter, monitor, rollback


def fit(run: Any, model: Any, plan: Any, train_ds: Any, val_ds: Any,
        extra: Sequence[Any], events: EventLog, reset_lr: float | None = None, *,
        epochs: int | None = None, initial_epoch: int = 0,
        before_rollback: Sequence[Any] = ()) -> Fitted:
    """Fit with mirrorkit's callbacks, rolling back on divergence (see the module docstring).

    ``reset_lr``: a constant learning rate to set after the backup is
    restored (an elastic job whose batch changed: the backup holds the old rate).
    ``epochs``/``initial_epoch``: fit only epochs ``initial_epoch`` to
    ``epochs`` (default: the whole run), as one phase of a fine-tuning run
    does; ``before_rollback``: callbacks placed after ``BackupAndRestore``
    and before ``Rollback`` (training.phase_switch).

    Raises:
        RuntimeError: the loss diverged with no rollback left (epoch, step and
            the kept backup named).
        KeyboardInterrupt: after saying where the last backup is.

    Example:
        >>> fitted = fit(run, model, plan, train_ds, val_ds, [], events)   # doctest: +SKIP
    """
    import keras

    from mirrorkit.training.metering import NonFiniteLossError
    from mirrorkit.training.rollback import describe

    own, meter, monitor, rollback = _callbacks(run, plan, events, reset_lr, before_rollback)
    out, config = run.out, run.config
    end = epochs or config.epochs
    epochs_done: list[int] = []
    initial = initial_epoch
    interrupts = Interrupts()
    own.insert(0, interrupts.callback())   # before the others: stops at once
    try:
        with interrupts:
            while True:
                try:
                    # shuffle=False: the pipeline already shuffles (Keras would only warn).
                    history = model.fit(train_ds, epochs=end, steps_per_epoch=plan.steps,
                                        validation_data=val_ds, validation_steps=plan.val_steps,
                                        callbacks=own + list(extra), initial_epoch=initial,
                                        verbose=1 if run.runtime.is_chief else 0, shuffle=False)
                    epochs_done += history.epoch
                    return Fitted(epochs_done, meter, monitor, rollback, events)
                except NonFiniteLossError as err:
                    done = getattr(model, "history", None)
                    epochs_done += list(getattr(done, "epoch", []))
                    if rollback.exhausted:
                        raise _stopped(err, run, plan, rollback) from err
                    incident = rollback.prepare(err)
                    line = describe(incident, rollback.max_rollbacks)
                    # Leading newline: Keras's progress bar leaves the cursor mid-line.
                    run.tell("\n" + line)
                    if not run.runtime.is_chief:
                        logger.warning("mirrorkit: %s", line)
                    events.write("rollback", **incident)
                    initial = incident["restored_epoch"]
                    for callback in own:
                        if isinstance(callback, keras.callbacks.CSVLogger):
                            callback.append = True  # keep the rows written so far
    except KeyboardInterrupt:
        events.write("run_end", status="interrupted")
        run.tell(f"\ninterrupted: the last epoch backup is in {out / 'backup'}; continue with "
                 f"--resume --output {out}")
        raise
    except BaseException as err:
        events.write("run_end", status="failed", error=failure_line(err))
        raise


def failure_line(err: BaseException) -> str:
    """One line for the event log: a lost peer's account when that is the cause, else the error's first line.

    Example:
        >>> failure_line(ValueError("bad value\\nmore"))
        'ValueError: bad value'
    """
    from mirrorkit.distribute.peer_loss import explain

    lost = explain(err) if not isinstance(err, (ValueError, KeyboardInterrupt)) else None
    if lost:
        return lost
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def _stopped(err: Any, run: Any, plan: Any, rollback: Any) -> RuntimeError:
    out, config = run.out, run.config
    kept = (f"the backup of epoch {err.last_good_epoch} in {out / 'backup'} is kept; "
            f"continue with --resume after fixing the cause"
            if err.last_good_epoch or has_backup(out / "backup")
            else "no epoch had finished, so there is no backup")
    after = (f" after {len(rollback.incidents)} rollback(s) (--max-rollbacks "
             f"{rollback.max_rollbacks})" if rollback.incidents else "")
    return RunError(
        f"Training stopped: {err}{after}; {kept}. Lower the learning rate (--lr "
        f"{config.base_lr:g} was scaled to {plan.lr:g}) or check the data for NaN/inf values.")
