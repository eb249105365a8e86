"""Control of the ``fixes-on-import`` patch: a launched Python program gets the fixes on import.

With it turned off by name, the program imports Keras unpatched (the stock
multi-worker tutorial then fails with keras#20585, shown with the fixes off in
tests/compat/test_compat.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import clean_env

from mirrorkit.launcher import bootstrap

CODE = ("import keras\nfrom mirrorkit.compat import FIXES\n"
        "print(FIXES['scalar-logs'].is_applied(), FIXES['symbolic-build'].is_applied())\n")


def _program(**env: str) -> list[str]:
    env = clean_env(PYTHONPATH=os.pathsep.join([str(bootstrap.SITE_DIR),
                                                os.environ.get("PYTHONPATH", "")]), **env)
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_fixes_on_import_and_off_by_name():
    assert _program() == ["True", "True"]
    assert _program(MIRRORKIT_COMPAT_DISABLE="fixes-on-import") == ["False", "False"]
