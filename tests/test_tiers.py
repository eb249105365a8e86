"""The fast tier (`python -m pytest -m fast`) keeps covering every package of mirrorkit.

The tier is what the README offers for development: in-process tests only, a few
minutes on 2 cores. A package whose tests are all in subprocesses (or all gone
slow) would silently drop out of it; this test names it. The tier is read from
a real collection (``--collect-only -m fast``) with a small plugin that reports
each collected test's file, markers and fixtures.

Which tests/ files cover which package: ``tests/<package>/...`` covers
``mirrorkit/<package>/``, ``tests/<dir>/test_<package>.py`` covers
``mirrorkit/<package>/`` too (the datasets tests live in ``tests/data/``), and
the top-level modules (``mirrorkit/*.py``) are covered by a fast test file that
imports one of them.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO, clean_env

PLUGIN = """
import json

def pytest_collection_finish(session):
    for item in session.items:
        print("TIER " + json.dumps({
            "path": item.path.relative_to(session.config.rootpath).as_posix(),
            "markers": sorted({m.name for m in item.iter_markers()}),
            "fixtures": sorted(item.fixturenames)}))
"""

# Fixtures that start a fresh interpreter: not in the in-process tier.
SUBPROCESS_FIXTURES = {"run_python"}


def _packages() -> set[str]:
    root = REPO / "mirrorkit"
    return {p.name for p in root.iterdir()
            if (p / "__init__.py").exists() and not p.name.startswith("_")}


def _top_level_modules() -> set[str]:
    return {p.stem for p in (REPO / "mirrorkit").glob("*.py") if p.stem != "__main__"}


@pytest.fixture(scope="module")
def tier(tmp_path_factory) -> list[dict]:
    """One record per test of the fast tier: path, markers, fixtures."""
    tmp_path = tmp_path_factory.mktemp("tier")
    (tmp_path / "tier_report.py").write_text(textwrap.dedent(PLUGIN))
    env = clean_env(PYTHONPATH=os.pathsep.join(
        filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "fast", "-n", "0",
         "-p", "no:cacheprovider", "-p", "tier_report"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line[len("TIER "):]) for line in proc.stdout.splitlines()
            if line.startswith("TIER ")]


def _imports_top_level(path: Path, modules: set[str]) -> bool:
    """Does the test file import ``mirrorkit`` itself or one of its top-level modules?"""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "mirrorkit" and (len(parts) == 1 or parts[1] in modules):
                return True
    return False


def test_every_package_has_in_process_tests_in_the_fast_tier(tier):
    assert tier, "`pytest -m fast` collected nothing"
    packages, modules = _packages(), _top_level_modules()
    covered: set[str] = set()
    for path in {t["path"] for t in tier}:
        parts = Path(path).parts   # ("tests", <dir>, "test_<name>.py") or ("tests", "test_x.py")
        if len(parts) == 3:
            covered.add(parts[1])
            covered.add(Path(parts[2]).stem.removeprefix("test_"))
        if _imports_top_level(REPO / path, modules):
            covered.add("top-level modules")
    missing = sorted((packages | {"top-level modules"}) - covered)
    assert not missing, (
        f"no test in the fast tier (`pytest -m fast`) for: {', '.join(missing)}. Mark a quick "
        "in-process test of each with @pytest.mark.fast (see tests/conftest.py).")


def test_the_fast_tier_is_in_process_and_never_slow(tier):
    wrong = [(t["path"], sorted({"slow", "exclusive"} & set(t["markers"])
                                | SUBPROCESS_FIXTURES & set(t["fixtures"])))
             for t in tier]
    wrong = [w for w in wrong if w[1]]
    assert not wrong, f"fast tests that are slow, exclusive or start an interpreter: {wrong}"
