"""``mirrorkit launch``: start N local workers as one ``TF_CONFIG`` cluster, restart on failure.

The modules, in the order a launch uses them: :mod:`.spec` (what to run),
:mod:`.ports` (where workers listen), :mod:`.group` (one attempt's workers and
their environment), :mod:`.process` (one worker process and its output),
:mod:`.agent` (the monitor loop and restarts), :mod:`.state` (worker states,
failures, the run's result); for elastic jobs (``min_workers``),
:mod:`.membership` (who is lost, the next attempt's members) and
:mod:`.rendezvous` (several machines' launchers agreeing on it).

Example:
    >>> from mirrorkit.launcher import LaunchSpec, launch
    >>> result = launch(LaunchSpec(command=("python", "train.py"), nproc=2))  # doctest: +SKIP
    >>> result.exit_code                                                      # doctest: +SKIP
    0
"""

from mirrorkit.distribute.devices import visible_devices
from mirrorkit.launcher.agent import launch
from mirrorkit.launcher.group import worker_threads
from mirrorkit.launcher.process import final_text
from mirrorkit.launcher.spec import LaunchSpec
from mirrorkit.launcher.state import RunResult, WorkerFailure, WorkerState

__all__ = [
    "LaunchSpec",
    "RunResult",
    "WorkerFailure",
    "WorkerState",
    "final_text",
    "launch",
    "visible_devices",
    "worker_threads",
]
