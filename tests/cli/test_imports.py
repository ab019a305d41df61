"""memfit.cli is the entry point: other modules use its public helpers, never its private names."""

from __future__ import annotations

import ast
from pathlib import Path

import memfit

SRC = Path(memfit.__file__).parent


def private_cli_imports(source: str, module: str) -> list[str]:
    """Private names of ``memfit.cli`` that ``source`` (the text of ``module``) imports or reads
    as ``cli._name``."""
    package = module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            target = ".".join(p for p in (base, node.module or "") if p)
            names = [a.name for a in node.names]
            if target == "memfit.cli":
                found += [f"{node.lineno}: {n}" for n in names if n.startswith("_")]
        elif isinstance(node, ast.Attribute) and _is_private_of_cli(node):
            found.append(f"{node.lineno}: cli.{node.attr}")
    return found


def _is_private_of_cli(node: ast.Attribute) -> bool:
    name = node.value.id if isinstance(node.value, ast.Name) else None
    return name == "cli" and node.attr.startswith("_") and not node.attr.endswith("__")


def test_the_check_finds_private_cli_imports() -> None:
    code = "from memfit.cli import _integer, main\nfrom .cli import _workload\nx = cli._parser\n"
    assert private_cli_imports(code, "memfit.some_module") == [
        "1: _integer",
        "2: _workload",
        "3: cli._parser",
    ]
    assert private_cli_imports("from memfit.cli import positive_int\n", "memfit.some_module") == []


def test_no_module_of_memfit_imports_a_private_name_of_the_cli() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        offenders += [f"{rel}.py:{hit}" for hit in private_cli_imports(path.read_text(), module)]
    assert offenders == []
