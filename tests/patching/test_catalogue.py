"""The catalogue is complete: every patch in the source has a record, every record a control.

``mirrorkit info --json`` lists them all, with their status.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest
from conftest import REPO, clean_env

from mirrorkit.compat import FIXES
from mirrorkit.patching import PATCHES

_ENGINE_CALLS = {"replace", "applied", "on_object", "enabled", "add_finder"}


def _names_used_in_source() -> set[str]:
    """Patch names the source hands to the engine (literals, or a module's NAME constant)."""
    used: set[str] = set()
    for path in (REPO / "mirrorkit").rglob("*.py"):
        tree = ast.parse(path.read_text())
        constants = {t.id: n.value.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                     for t in n.targets if isinstance(t, ast.Name)
                     and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in _ENGINE_CALLS \
                    and getattr(node.func.value, "id", None) == "engine" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant):
                    used.add(first.value)
                elif isinstance(first, ast.Name) and first.id in constants:
                    used.add(constants[first.id])
    return used


def test_every_patch_in_the_source_has_a_record_and_every_record_is_used():
    used = _names_used_in_source() | set(FIXES)  # fixes reach the engine as Fix(name, ...)
    assert used - set(PATCHES) == set(), "patched in the source, missing from the catalogue"
    assert set(PATCHES) - used == set(), "in the catalogue, never applied by the source"


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_every_patch_names_a_control_test_that_names_it(name):
    record = PATCHES[name]
    control = REPO / record.control
    assert control.is_file(), f"{name}: control {record.control} does not exist"
    assert name in control.read_text(), (
        f"{name}: {record.control} never names the patch; the control must turn it off by "
        "name (MIRRORKIT_COMPAT_DISABLE) and show what breaks, or say why it cannot")


def test_info_lists_every_patch_with_its_status():
    env = clean_env(MIRRORKIT_COMPAT_DISABLE="chief-only-model-save,layer-losses")
    proc = subprocess.run([sys.executable, "-m", "mirrorkit", "info", "--json"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    listed = {p["name"]: p for p in json.loads(proc.stdout)["patches"]}
    assert list(listed) == list(PATCHES)
    for name, patch in listed.items():
        assert patch["targets"] and patch["reason"] and patch["tested"] and patch["how"], name
    assert listed["chief-only-model-save"]["status"] == "disabled"
    assert listed["layer-losses"]["status"] == "disabled"
    assert listed["scalar-logs"]["how"] == "version table"
    assert listed["script-strategies"]["status"] == "inactive"
    assert "mirrorkit run" in listed["script-strategies"]["detail"]


def test_info_refuses_a_misspelt_patch_name_in_one_line():
    env = clean_env(MIRRORKIT_COMPAT_DISABLE="chief-only-model-sav")
    proc = subprocess.run([sys.executable, "-m", "mirrorkit", "info"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("Error")]
    assert len(lines) == 1 and "chief-only-model-sav" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
