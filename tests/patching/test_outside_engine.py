"""No module replaces an attribute of Keras, TensorFlow or Python outside the patch engine.

Every wrap goes through :mod:`mirrorkit.patching.engine` so that ``mirrorkit
info`` can list it and ``MIRRORKIT_COMPAT_DISABLE`` can turn it off. A new
``setattr(keras.Model, ...)``, ``saving_lib.x = ...``, ``sys.excepthook = ...``
or marker of its own anywhere else fails here, with its file and line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO
from wrap_finder import find_wraps

PACKAGE = REPO / "mirrorkit"
ENGINE = "mirrorkit/patching/engine.py"

# Assignments the finder reports that change nothing of anyone else's behaviour:
# (file, the finding's text after its line number) -> why it is not a patch.
ALLOWED = {
    ("mirrorkit/compat/allocator.py", "libc.malloc.restype = ..."):
        "ctypes declarations of mirrorkit's own handle on libc",
    ("mirrorkit/compat/allocator.py", "libc.malloc.argtypes = ..."):
        "ctypes declarations of mirrorkit's own handle on libc",
    ("mirrorkit/compat/allocator.py", "libc.free.argtypes = ..."):
        "ctypes declarations of mirrorkit's own handle on libc",
    ("mirrorkit/launcher/autofix.py", "module.__loader__ = ..."):
        "inside the fixes-on-import patch: hands a module its real loader back",
    ("mirrorkit/launcher/autofix.py", "module.__spec__.loader = ..."):
        "inside the fixes-on-import patch: hands a module its real loader back",
    ("mirrorkit/runner/script.py", "sys.argv = ..."):
        "`mirrorkit run` sets the script's argv as `python script.py` does, and restores it",
    ("mirrorkit/training/callbacks.py", "model._initial_epoch = ..."):
        "the epoch resumed from the chief's backup, set where Keras's own "
        "BackupAndRestore sets it",
}


def _findings() -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel == ENGINE:
            continue
        for finding in find_wraps(path.read_text()):
            line, _, text = finding.partition(": ")
            found.setdefault((rel, text), []).append(line)
    return found


def test_no_wrap_outside_the_engine():
    outside = [f"{file} {', '.join(lines)}: {text}"
               for (file, text), lines in _findings().items() if (file, text) not in ALLOWED]
    assert not outside, (
        "attributes of code that is not mirrorkit's replaced outside mirrorkit.patching.engine "
        "(add a record to mirrorkit/patching/catalogue.py and use engine.replace/applied/"
        "on_object):\n" + "\n".join(outside))


def test_every_allowance_is_still_needed():
    stale = sorted(set(ALLOWED) - set(_findings()))
    assert not stale, f"allowed findings that no longer occur (remove them): {stale}"


@pytest.mark.parametrize("source, expected", [
    ("import keras\nsetattr(keras.Model, 'fit', wrapper)\n",
     "line 2: setattr(keras.Model, 'fit', wrapper)"),
    ("from keras.src.saving import saving_lib\nsaving_lib.get_attr_skipset = f\n",
     "line 2: saving_lib.get_attr_skipset = ..."),
    ("import sys\ndef install():\n    sys.excepthook = hook\n", "line 3: sys.excepthook = ..."),
    ("import sys\nsys.meta_path.insert(0, finder)\n", "line 2: sys.meta_path.insert(0, finder)"),
    ("def wrap(module):\n    module.__dict__['get_file'] = g\n",
     "line 2: module.__dict__['get_file'] = ..."),
    ("def f(cls_):\n    cls_.save = g\n", "line 2: cls_.save = ..."),
    ("def f():\n    g.__mirrorkit_guarded__ = True\n",
     "line 2: g.__mirrorkit_guarded__ = ... (a marker of its own)"),
])
def test_the_finder_catches_a_new_wrap(source, expected):
    assert find_wraps(source) == [expected]


def test_a_wrap_added_to_a_real_module_fails_the_check(tmp_path):
    # The check as it runs on the package, on a copy of a real module with
    # one wrap added outside the engine.
    module = (PACKAGE / "runner" / "speed.py").read_text()
    assert find_wraps(module) == []
    added = module + "\n\ndef _sneaky():\n    import keras\n\n" \
                     "    keras.Model.fit = lambda self, *a, **k: None\n"
    assert find_wraps(added) == [f"line {len(added.splitlines())}: keras.Model.fit = ..."]


def test_own_state_is_not_a_wrap():
    source = ("import keras\nclass C(keras.callbacks.Callback):\n"
              "    def on_epoch_end(self, epoch, logs=None):\n        self.best = 1\n"
              "def f():\n    x = {}\n    x['a'] = 1\n")
    assert find_wraps(source) == []
