"""``mirrorkit run``: an unmodified Keras script, run as ``python`` would, on every device.

The modules: :mod:`.config` (what to run), :mod:`.script` (run it as
``__main__`` under the strategy), :mod:`.scope` (the strategy scope held
around the script), :mod:`.strategies` (the script's own strategy
constructions), :mod:`.model_methods` (``fit``/``evaluate``/``predict``
adjustments).

Example:
    >>> from mirrorkit.runner import RunConfig, run_script
    >>> run_script(RunConfig(script="train.py", simulate_cpus=2))   # doctest: +SKIP
"""

from mirrorkit.runner.config import RunConfig, ScriptFailed, check_script
from mirrorkit.runner.script import run_script

__all__ = ["RunConfig", "ScriptFailed", "check_script", "run_script"]
