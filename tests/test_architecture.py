"""The package layout keeps its promises (ARCHITECTURE.md): layers, no import circles, small modules.

Read from the source with ``ast`` (every import, also those inside
functions), so a lazy import that closes a circle or reaches up a layer is
caught as surely as a top-level one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from conftest import REPO

PACKAGE = REPO / "mirrorkit"
MAX_LINES = 400

# Lower layers never import higher ones; packages of one layer never import
# each other. The top layer is the public face and the command line.
LAYERS = {
    "mirrorkit.protocol": 0, "mirrorkit._version": 0, "mirrorkit.errors": 0,
    "mirrorkit._env": 1, "mirrorkit._checks": 1,
    "mirrorkit.patching": 2, "mirrorkit.strategy_facts": 2,
    "mirrorkit.compat": 3,
    "mirrorkit.distribute": 4,
    "mirrorkit.data": 5, "mirrorkit.datasets": 5,
    "mirrorkit.training": 6,
    "mirrorkit.runner": 7, "mirrorkit.launcher": 7,
    "mirrorkit.bench": 8,
    "mirrorkit.commands": 9, "mirrorkit.cli": 9, "mirrorkit.__main__": 9,
    # The public face: the package itself and the paths the README documents.
    "mirrorkit": 9, "mirrorkit.callbacks": 9, "mirrorkit.schedules": 9,
}
TOP = 9
# Old public names kept working after their module moved up a layer: the
# importer reaches the new home lazily, inside a module __getattr__.
ALIASES = {("mirrorkit.compat", "mirrorkit.distribute.failure_detection")}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The mirrorkit module ``name`` refers to (a module, or the package exporting it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    tree = ast.parse(MODULES[module].read_text())
    found: set[str] = set()
    is_package = MODULES[module].name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            # `from pkg import sub` names the submodule when there is one.
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                     for a in node.names]
        else:
            continue
        for name in names:
            if name == "mirrorkit" or name.startswith("mirrorkit."):
                target = _resolve(name)
                if target and target != module:
                    found.add(target)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def _layer(module: str) -> tuple[str, int]:
    for prefix in sorted(LAYERS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return prefix, LAYERS[prefix]
    raise AssertionError(f"{module} belongs to no layer: add it to LAYERS and ARCHITECTURE.md")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_the_import_graph_has_no_circle():
    assert _cycles(GRAPH) == []


def test_the_circle_check_can_fail():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module):
    home, level = _layer(module)
    wrong = []
    for target in sorted(GRAPH[module]):
        if (module, target) in ALIASES:
            continue
        where, target_level = _layer(target)
        if target_level > level or (target_level == level and where != home and level < TOP):
            wrong.append(f"{target} (layer {target_level} {where})")
    assert not wrong, f"{module} (layer {level} {home}) imports upward or sideways: {wrong}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_small(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines; split it by responsibility"


def test_importing_the_package_and_cli_does_not_import_tensorflow(run_python):
    out = run_python("""
        import sys
        import mirrorkit, mirrorkit.cli, mirrorkit.launcher, mirrorkit.runner, mirrorkit.training
        import mirrorkit.bench, mirrorkit.data, mirrorkit.compat, mirrorkit.distribute
        print(sorted(m for m in ("tensorflow", "keras") if m in sys.modules))
    """)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_documented_import_paths_still_work(run_python):
    out = run_python("""
        import mirrorkit
        from mirrorkit.callbacks import BackupAndRestore, ModelCheckpoint, TensorBoard, save_model
        from mirrorkit.compat import configure_failure_detection, apply, FIXES
        from mirrorkit.datasets import DataOptions
        from mirrorkit.training import TrainConfig, train
        from mirrorkit.data import train_pipeline
        import mirrorkit.schedules
        from mirrorkit.launcher import LaunchSpec, launch
        from mirrorkit.runner import RunConfig, run_script
        from mirrorkit.bench import BenchConfig, run_bench
        assert mirrorkit.save_model is save_model and callable(mirrorkit.fix_multi_worker)
        assert configure_failure_detection is mirrorkit.configure_failure_detection
        print("ok", mirrorkit.scope.__name__, mirrorkit.get_strategy.__name__)
    """)
    assert out.stdout.strip().splitlines()[-1] == "ok scope get_strategy"


def _unsafe_calls(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        if name in ("eval", "exec", "enable_unsafe_deserialization"):
            found.append(f"{name}() at line {node.lineno}")
        for keyword in node.keywords:
            if keyword.arg == "safe_mode" and not (
                    isinstance(keyword.value, ast.Constant) and keyword.value.value is True):
                found.append(f"safe_mode={ast.unparse(keyword.value)} at line {node.lineno}")
    return found


def test_unsafe_calls_are_caught():
    # The control: the checker finds each pattern it is meant to forbid.
    code = "eval(s)\nkeras.models.load_model(p, safe_mode=False)\n" \
           "keras.config.enable_unsafe_deserialization()\n"
    assert len(_unsafe_calls(ast.parse(code))) == 3


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_user_string_is_evaluated_and_models_load_in_safe_mode(module):
    # README "Security": no eval/exec of strings; Keras's safe mode is never
    # turned off (a .keras file cannot run code unless the user opts in).
    assert _unsafe_calls(ast.parse(MODULES[module].read_text())) == [], module
