"""The analytic package's import graph: no cycle, and no module reaching into another's private
names (the families compose the block vocabulary and the step composer through public names).

Read from the source with ``ast``: every import counts, also one inside a function (a lazy
import is a cycle that waits), except those under ``if TYPE_CHECKING:`` (never run).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

PACKAGE = "memfit.estimate.analytic"
ROOT = Path(str(importlib.import_module(PACKAGE).__file__)).parent
#: Receivers of attribute access inside their own class.
OWN = ("self", "cls")


def _modules() -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(ROOT.glob("*.py"))}


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:``."""
    out: list[ast.AST] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _imports(tree: ast.Module, modules: set[str]) -> list[tuple[str, list[str]]]:
    """(imported module of this package, names imported from it) of each runtime import."""
    out = []
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(PACKAGE + "."):
                out.append((node.module.split(".")[3], [a.name for a in node.names]))
            elif node.module == PACKAGE:
                out += [(a.name, []) for a in node.names if a.name in modules]
        elif isinstance(node, ast.Import):
            out += [
                (a.name.split(".")[3], []) for a in node.names if a.name.startswith(PACKAGE + ".")
            ]
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _defined_names(tree: ast.Module) -> set[str]:
    """Names a module defines: functions, classes, their methods, and attributes assigned."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_the_analytic_package_has_no_import_cycle() -> None:
    trees = _modules()
    graph = {
        name: {dep for dep, _ in _imports(tree, set(trees)) if dep in trees and dep != name}
        for name, tree in trees.items()
    }
    assert _cycles(graph) == []


def test_no_analytic_module_imports_another_modules_private_names() -> None:
    trees = _modules()
    bad = [
        f"{name} imports {dep}.{n}"
        for name, tree in trees.items()
        for dep, names in _imports(tree, set(trees))
        for n in names
        if _private(n)
    ]
    assert bad == []


def test_no_analytic_module_uses_private_attributes_defined_elsewhere() -> None:
    """``o._ac(x)`` on an object of another module's class is a private import by another
    route; a module may use the private names it defines (a class's helpers called by its
    step composer in the same module)."""
    bad = []
    for name, tree in _modules().items():
        own = _defined_names(tree)
        for node in _runtime_nodes(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            receiver = node.value.id if isinstance(node.value, ast.Name) else None
            if receiver not in OWN and node.attr not in own:
                bad.append(f"{name}: {ast.unparse(node)}")
    assert bad == []


def test_the_checks_see_a_cycle_and_a_private_import() -> None:
    """The walkers above on made-up modules: a cycle through a lazy import, and a private name
    imported from a sibling (so the tests above cannot pass by seeing nothing)."""
    a = ast.parse(f"def f():\n    from {PACKAGE}.b import _helper\n")
    b = ast.parse(f"from {PACKAGE} import a\n")
    typed = ast.parse(
        f"from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import {PACKAGE}.a\n"
    )
    modules = {"a", "b", "c"}
    graph = {
        name: {dep for dep, _ in _imports(tree, modules)}
        for name, tree in (("a", a), ("b", b), ("c", typed))
    }
    assert graph == {"a": {"b"}, "b": {"a"}, "c": set()}
    assert _cycles(graph) == [["a", "b"]]
    assert _imports(a, modules) == [("b", ["_helper"])]
