"""Every runnable example in mirrorkit's docstrings gives what it says.

The examples are the first code a reader copies; one that drifted from the
code (a renamed fix, a changed formula) misleads quietly. Run in a separate
interpreter: collecting every module for doctests imports them all, and the
launcher's ``sitecustomize`` would install its import hook into this one.
"""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, clean_env


def test_docstring_examples_run_and_match():
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--doctest-modules",
         "--ignore", str(REPO / "mirrorkit" / "launcher" / "_site"), "-o", "addopts=",
         str(REPO / "mirrorkit")],
        cwd=str(REPO), env=clean_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout, proc.stdout[-2000:]
