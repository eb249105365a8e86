"""Find code that replaces an attribute of something it imported (a wrap outside the engine).

Read from the source with ``ast``. A module may change another object's
behaviour in these ways, each reported with its line:

* ``setattr(...)`` / ``delattr(...)`` on anything but ``self``;
* an assignment ``name.attr = ...`` (or ``name.a.b = ...``) whose root
  ``name`` is bound by an import in that module (``keras``, ``sys``,
  ``saving_lib``, ``Model`` ...) or is a parameter of the enclosing function
  other than ``self``/``cls`` (an object handed in to be changed);
* ``x.__dict__[...] = ...`` and ``sys.meta_path``/``sys.path_hooks`` edits;
* a private marker attribute of its own (``__mirrorkit_*__``, ``mirrorkit_*``).

Example:
    >>> find_wraps("import keras\\nkeras.Model.fit = f\\n")
    ['line 2: keras.Model.fit = ...']
"""

from __future__ import annotations

import ast

_HOOK_LISTS = {"meta_path", "path_hooks", "excepthook", "displayhook"}


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _imported_names(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.update(a.asname or a.name for a in node.names)
    return names


class _Finder(ast.NodeVisitor):
    def __init__(self, imported: set[str]) -> None:
        self.imported, self.params, self.found = imported, [set()], []

    def _function(self, node: ast.AST) -> None:
        args = node.args
        names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
        names |= {a.arg for a in (args.vararg, args.kwarg) if a is not None}
        self.params.append(names - {"self", "cls"})
        self.generic_visit(node)
        self.params.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def _target(self, target: ast.AST, line: int) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._target(element, line)
            return
        text = ast.unparse(target)
        if isinstance(target, ast.Attribute):
            root = _root(target)
            if target.attr.startswith(("__mirrorkit", "mirrorkit_")):
                self.found.append(f"line {line}: {text} = ... (a marker of its own)")
            elif isinstance(root, ast.Name) and (
                    root.id in self.imported or root.id in self.params[-1]):
                self.found.append(f"line {line}: {text} = ...")
        elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute) \
                and target.value.attr == "__dict__":
            self.found.append(f"line {line}: {text} = ...")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._target(target, node.lineno)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._target(node.target, node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = getattr(func, "id", None)
        if name in ("setattr", "delattr") and node.args and not (
                isinstance(node.args[0], ast.Name) and node.args[0].id == "self"):
            self.found.append(f"line {node.lineno}: {ast.unparse(node)}")
        if isinstance(func, ast.Attribute) and func.attr in ("insert", "append", "remove") \
                and isinstance(func.value, ast.Attribute) and func.value.attr in _HOOK_LISTS:
            self.found.append(f"line {node.lineno}: {ast.unparse(node)}")
        self.generic_visit(node)


def find_wraps(source: str) -> list[str]:
    """Every place in ``source`` that replaces another object's attribute (see module doc).

    Example:
        >>> find_wraps("def f(self):\\n    self.x = 1\\n")
        []
    """
    tree = ast.parse(source)
    finder = _Finder(_imported_names(tree))
    finder.visit(tree)
    return finder.found
