"""mirrorkit's worker bootstrap (on PYTHONPATH only under ``mirrorkit launch``).

Python imports ``sitecustomize`` at start-up. This one runs any
``sitecustomize`` it shadows, then asks :mod:`mirrorkit.launcher.autofix` to
apply mirrorkit's Keras fixes once the program imports TensorFlow and Keras,
makes that import cheaper (:mod:`mirrorkit.launcher.startup`),
and keeps ``TF_CONFIG`` and itself out of the processes the program starts
(:mod:`mirrorkit.launcher.bootstrap`). It never fails the program: without
mirrorkit importable it does nothing.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _run_shadowed() -> None:
    # Keep the user's or the distribution's own sitecustomize working.
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and spec.origin != os.path.abspath(__file__):
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


try:
    _run_shadowed()
finally:
    try:
        from mirrorkit.launcher import autofix

        autofix.install()
    except Exception:  # a broken or missing mirrorkit must not break the worker
        pass
    try:
        # A cheaper TensorFlow start, at every worker start and restart.
        from mirrorkit.launcher import startup

        startup.install()
    except Exception:
        pass
    try:
        # TF_CONFIG and this bootstrap are for this worker, not for the
        # processes it starts (they would join the cluster).
        from mirrorkit.launcher import bootstrap

        bootstrap.keep_out_of_children()
    except Exception:
        pass
